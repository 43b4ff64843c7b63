"""Checking and repairing a WAL directory (``tiffany wal verify|repair``).

``verify`` reads every segment and reports; it changes nothing. ``repair``
is for corruption (a bad record with good ones after it), which ``Wal.open``
refuses: it copies the damaged segment to ``<name>.broken``, truncates it
at the last good record, and moves every later segment aside as
``<name>.broken`` too, so no record is silently lost. It runs only when a
person asks for it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tiffany.errors import WalCorruptionError
from tiffany.wal.format import HEADER_SIZE_BYTES
from tiffany.wal.reader import TornTail, list_segments, scan_segment

__all__ = ["RepairReport", "VerifyReport", "repair", "verify"]


@dataclass(slots=True)
class VerifyReport:
    """The state of a WAL directory."""

    segments: int = 0
    records: int = 0
    first_seq: int = 0
    last_seq: int = 0
    torn: dict[str, Any] | None = None
    corruption: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """True when no corruption was found (a torn tail is not corruption)."""
        return self.corruption is None

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-able data."""
        return {**asdict(self), "ok": self.ok}


@dataclass(slots=True)
class RepairReport:
    """What ``repair`` did."""

    truncated: str | None = None
    offset: int | None = None
    moved_aside: list[str] = field(default_factory=list)
    records_kept: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-able data."""
        return asdict(self)


def verify(wal_dir: str | os.PathLike[str]) -> VerifyReport:
    """Read every record of every segment; report torn tail and corruption."""
    path = Path(wal_dir)
    report = VerifyReport()
    segments = list_segments(path)
    report.segments = len(segments)
    if segments:
        report.first_seq = segments[0].first_seq
    expected = report.first_seq
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg.first_seq != expected:
            report.corruption = {
                "segment": seg.path.name,
                "offset": 0,
                "seq": expected,
                "reason": f"sequence gap: expected a segment starting at {expected}",
            }
            return report
        try:
            frames, torn = scan_segment(seg, seg.path.read_bytes(), last=last)
        except WalCorruptionError as exc:
            report.corruption = {**exc.fields, "message": exc.message}
            return report
        report.records += len(frames)
        expected = seg.first_seq + len(frames)
        if torn is not None:
            report.torn = _torn_dict(torn)
    report.last_seq = expected - 1
    return report


def _torn_dict(torn: TornTail) -> dict[str, Any]:
    return {
        "segment": torn.segment,
        "offset": torn.offset,
        "bytes": torn.bytes_dropped,
        "reason": torn.reason,
    }


def repair(wal_dir: str | os.PathLike[str]) -> RepairReport:
    """Truncate at the first corruption (keeping ``.broken`` copies)."""
    path = Path(wal_dir)
    report = RepairReport()
    found = verify(path)
    if found.corruption is None:
        report.records_kept = found.records
        return report
    bad = found.corruption
    segments = list_segments(path)
    names = [s.path.name for s in segments]
    idx = names.index(bad["segment"])
    seg = segments[idx]
    offset = int(bad.get("offset") or 0)
    shutil.copyfile(seg.path, seg.path.with_name(seg.path.name + ".broken"))
    if offset < HEADER_SIZE_BYTES:
        seg.path.rename(seg.path.with_name(seg.path.name + ".broken"))
        report.moved_aside.append(seg.path.name)
    else:
        with open(seg.path, "r+b") as f:
            f.truncate(offset)
            os.fsync(f.fileno())
        report.truncated, report.offset = seg.path.name, offset
    for later in segments[idx + 1 :]:
        later.path.rename(later.path.with_name(later.path.name + ".broken"))
        report.moved_aside.append(later.path.name)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    report.records_kept = verify(path).records
    return report
