"""Checking and repairing a WAL directory (``tiffany wal verify|repair``).

``verify`` reads every segment, applies the reader's rules, and reports; it
changes nothing and takes no lock (it may run beside a live engine, whose
unsynced tail then looks torn).

``repair`` is for corruption, which ``Wal.open`` refuses. It runs only when
a person asks, with the lock held (so never under a live engine), and loses
no byte: it truncates the damaged segment
at the bad record, moving the cut bytes to ``<name>.broken`` (or, if its
header is bad, renames it ``.broken`` whole), then renames every later
segment ``.broken`` too, and fsyncs the directory.
What remains is the log up to the record before the corruption; a later
``Wal.open`` continues from there.

Discussion: ``repair`` keeps a prefix: the only log a replay can trust whole.
``salvage`` (``salvage.py``, ``tiffany wal repair --salvage``) keeps every
record that checks out instead, and the durable layer fails the runs that
lost records (a replay that skipped one of their dispatches would diverge).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tiffany.errors import WalCorruptionError
from tiffany.wal.format import HEADER_SIZE_BYTES
from tiffany.wal.lock import lock_dir, unlock
from tiffany.wal.reader import TornTail, scan_segment, sequence_gap
from tiffany.wal.segments import (
    fsync_dir,
    history_segments,
    list_segments,
    move_tail_aside,
    read_segment,
    set_aside,
)

__all__ = ["RepairReport", "VerifyReport", "repair", "verify"]


@dataclass(slots=True)
class VerifyReport:
    """The state of a WAL directory.

    Attributes:
        segments: How many segment files.
        records: How many records check out (up to the corruption, if any).
        first_seq: The first segment's first sequence number (0: no segment).
        last_seq: The last good record's sequence number (0: none).
        torn: The torn tail of the last segment, if any (not an error).
        corruption: The error's fields (segment, offset, seq, reason,
            message), or None.
    """

    segments: int = 0
    records: int = 0
    first_seq: int = 0
    last_seq: int = 0
    torn: TornTail | None = None
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
    """What ``repair`` did.

    Attributes:
        corruption: What it repaired (as in :class:`VerifyReport`), or None
            when there was nothing to do.
        truncated: The segment it truncated, if any.
        offset: Where it truncated it.
        moved_aside: Segments renamed ``.broken`` whole.
        copies: The ``.broken`` files holding the bytes cut off a truncated
            segment (none if the disk had no room for them).
        records_kept: How many records the log holds now.
    """

    corruption: dict[str, Any] | None = None
    truncated: str | None = None
    offset: int | None = None
    moved_aside: list[str] = field(default_factory=list)
    copies: list[str] = field(default_factory=list)
    records_kept: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-able data."""
        return asdict(self)


def verify(wal_dir: str | os.PathLike[str], *, archived: bool = False) -> VerifyReport:
    """Check every record of every segment; report, change nothing.

    Args:
        wal_dir: The WAL directory.
        archived: Check the archived segments (``wal/archive/``) too, as the
            start of the log; by default only the live ones, which may start
            after seq 1 once retention released older segments.

    Raises:
        WalFormatError: A stray segment name or another format version
            (not corruption: this build cannot judge the file).
    """
    report = VerifyReport()
    segments = (history_segments if archived else list_segments)(Path(wal_dir))
    report.segments = len(segments)
    if not segments:
        return report
    report.first_seq = expected = segments[0].first_seq
    for i, seg in enumerate(segments):
        try:
            if seg.first_seq != expected:
                raise sequence_gap(seg, expected)
            scan = scan_segment(seg, read_segment(seg), last=i == len(segments) - 1)
        except WalCorruptionError as exc:
            report.corruption = {**exc.fields, "message": exc.message}
            expected = int(exc.fields["seq"])  # what the bad record would have had
            break
        report.torn = scan.torn
        expected = seg.first_seq + scan.records
    report.last_seq = expected - 1
    report.records = expected - report.first_seq
    return report


def repair(wal_dir: str | os.PathLike[str]) -> RepairReport:
    """Truncate the log at its first corruption, keeping ``.broken`` copies.

    Does nothing when :func:`verify` finds no corruption (a torn tail is
    left for ``Wal.open``, which cuts it).

    Raises:
        WalLockedError: The log is open (an engine is running on it).
        WalFormatError: See :func:`verify`.
    """
    path = Path(wal_dir)
    lock_fd = lock_dir(path)
    try:
        return _repair(path)
    finally:
        unlock(lock_fd)


def _repair(path: Path) -> RepairReport:
    found = verify(path)
    report = RepairReport(corruption=found.corruption, records_kept=found.records)
    if found.corruption is None:
        return report
    segments = list_segments(path)
    names = [s.name for s in segments]
    idx = names.index(found.corruption["segment"])
    seg = segments[idx]
    offset = int(found.corruption["offset"])
    if offset < HEADER_SIZE_BYTES:
        set_aside(seg.path)
        report.moved_aside.append(seg.name)
    else:
        _, kept = move_tail_aside(seg.path, offset, fsync=os.fsync)
        if kept is not None:
            report.copies.append(kept.name)
        report.truncated, report.offset = seg.name, offset
    for later in segments[idx + 1 :]:
        set_aside(later.path)
        report.moved_aside.append(later.name)
    fsync_dir(path)
    report.records_kept = verify(path).records
    return report
