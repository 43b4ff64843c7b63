"""Salvaging a damaged log: keep every record that checks out (``tiffany wal repair --salvage``).

``repair`` keeps the prefix before the first bad record; ``salvage`` keeps
every intact record, before and after the damage, like LevelDB's reader
skipping a bad block, but at record level:

* a damaged frame whose **length is intact** (its bytes check out as a
  frame boundary: the frame after it checks out, or it ends the segment) is
  skipped exactly: one record lost, and its payload's first bytes are kept
  for the caller to attribute (the durable layer's 4-byte run prefix);
* otherwise the reader **resynchronises**: it scans forward for the next
  offset where a frame checks out *and* the frame after it also checks out
  or ends the segment (two in a row: garbage passes CRC32C once in four
  billion tries, twice practically never); the bytes between are lost. In
  the last segment, where no two frames in a row check out, one is enough:
  the reader calls a problem followed by one good frame corruption, so
  salvage must resume at that frame or its log would still not open;
* a **missing segment** (a sequence gap between segments) loses the
  records in the gap; a **bad segment header** loses nothing by itself: the
  name gives ``first_seq`` and the records after the header are read;
* the **torn tail** of the last segment (a problem with nothing that checks
  out after it) is not a loss: it was never acknowledged, ``Wal.open`` cuts it.

Sequence numbers are implicit, so records after a loss would shift. The
salvaged records are therefore written into fresh segments (in a
``salvage.tmp`` directory first, synced), then every original segment is
renamed ``<name>.broken`` (no copy, no byte needs new space but the new
log), and the new segments are renamed into place and the directory synced.
A crash in between leaves every byte in some file; rerunning finishes it.
Whatever the durable layer made of the old numbers (the SQL store) must be
rebuilt afterwards: the caller does that.

Invariants: only records that check out are written; they keep their order;
records the caller adds (``finish``) go after them; nothing is deleted but
the temporary directory of a previous, interrupted salvage.

Discussion: the WAL knows nothing of runs; attributing losses and failing
runs is the caller's ``finish`` callback (``tiffany/cli/wal.py``), which
gets the salvaged records and the losses and returns records to append.
We rejected salvaging in place (truncate and rewrite behind the damage):
renumbering touches every later segment anyway, and writing a new log
before touching the old one keeps the old one whole until the new one is
durable.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tiffany.wal.format import (
    HEADER_SIZE_BYTES,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
    SEGMENT_SIZE_BYTES,
    header_problem,
)
from tiffany.wal.frame import (
    BAD_CHECKSUM,
    RESERVED_TYPE,
    ZERO_FILL,
    Frame,
    decode,
    next_frame,
    zero_to_end,
)
from tiffany.wal.lock import lock_dir, unlock
from tiffany.wal.segments import (
    Segment,
    check_header,
    create_segment,
    fsync_dir,
    is_torn_creation,
    list_segments,
    read_segment,
    set_aside,
)
from tiffany.wal.writer import FsyncPolicy, Wal

__all__ = ["Finish", "Loss", "SalvageReport", "salvage", "scan_salvage"]

#: The directory a salvage writes its new segments into first.
SALVAGE_DIR = "salvage.tmp"
MISSING_SEGMENT = "missing segment (sequence gap)"


@dataclass(slots=True)
class Loss:
    """Damage found by a salvage scan.

    Attributes:
        segment: The segment file (for a gap: the segment after it).
        offset: Where the damage starts in it.
        seq: The original sequence number of the first record lost.
        records: How many records were lost (None: unknown, bytes lost in
            the middle of the last segment), 0 for a bad header alone.
        bytes_lost: How many bytes were skipped.
        reason: What was wrong (``"bad checksum"``, ``MISSING_SEGMENT``, ...).
        prefix: The first 4 payload bytes of a skipped frame whose length was
            intact (the durable layer's run number), else None.
        kept_before: How many salvaged records precede the damage.
    """

    segment: str
    offset: int
    seq: int
    records: int | None
    bytes_lost: int
    reason: str
    prefix: bytes | None = None
    kept_before: int = 0

    def describe(self) -> str:
        """Return one line for a person: where, what, how much."""
        if self.records == 0:
            count = "no record lost"
        elif self.records is None:
            count = f"records from seq {self.seq} on lost (how many unknown)"
        elif self.records == 1:
            count = f"record seq {self.seq} lost"
        else:
            count = f"records seq {self.seq}..{self.seq + self.records - 1} lost"
        where = f"{self.segment} offset {self.offset}"
        return f"{where}: {self.reason}; {count} ({self.bytes_lost} bytes)"


@dataclass(slots=True)
class SalvageReport:
    """What :func:`salvage` found and did.

    Attributes:
        losses: The damage, in log order.
        records_kept: How many records the new log holds (appended ones included).
        appended: How many records the caller's ``finish`` added.
        first_seq: The new log's first sequence number.
        last_seq: Its last one.
        moved_aside: Original segments renamed ``.broken``.
        written: The new segments.
    """

    losses: list[Loss] = field(default_factory=list)
    records_kept: int = 0
    appended: int = 0
    first_seq: int = 0
    last_seq: int = 0
    moved_aside: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-able data."""
        out = asdict(self)
        for loss in out["losses"]:
            loss["prefix"] = None if loss["prefix"] is None else loss["prefix"].hex()
        return out


#: ``finish(records, losses)``: records ``(rtype, payload)`` to append after
#: the salvaged ones (the durable layer's RUN_END of the runs that lost records).
Finish = Callable[[list[tuple[int, bytes]], list[Loss]], list[tuple[int, bytes]]]


def _boundary(data: bytes, end: int) -> bool:
    """True when ``end`` ends the records (the file or its zero fill) or a frame starts there."""
    return end == len(data) or isinstance(decode(data, end), Frame) or zero_to_end(data, end)


def _resync(data: bytes, offset: int) -> int | None:
    """Return the first offset after ``offset`` where two frames in a row check out.

    The candidates are :func:`~tiffany.wal.frame.next_frame`'s, which skips
    a run of zeros in one search (a preallocated segment's: a byte at a time,
    a segment's zeros took seconds).
    """
    k = next_frame(data, offset)
    while k is not None:
        frame = decode(data, k)
        if isinstance(frame, Frame) and _boundary(data, frame.end):
            return k
        k = next_frame(data, k)
    return None


def _scan_one(
    seg: Segment, data: bytes, *, last: bool, out: list[tuple[int, bytes]], losses: list[Loss]
) -> int:
    """Append the segment's good records to ``out``; return how many records it held.

    A loss of unknown size counts as one record here; the next segment's
    name corrects the count (see :func:`scan_salvage`).
    """
    if last and is_torn_creation(data):
        return 0
    problem = header_problem(data, seg.first_seq)
    if problem is not None:
        if problem.startswith("version "):
            check_header(seg, data)  # raises WalFormatError: not ours to judge
        whole = len(data) < HEADER_SIZE_BYTES
        lost = None if whole else 0
        size = len(data) if whole else HEADER_SIZE_BYTES
        losses.append(Loss(seg.name, 0, seg.first_seq, lost, size, problem, None, len(out)))
        if whole:
            return 1
    off, seq, size = HEADER_SIZE_BYTES, seg.first_seq, len(data)
    while off < size:
        found = decode(data, off)
        if isinstance(found, Frame):
            out.append((found.rtype, data[found.start : found.end]))
            off, seq = found.end, seq + 1
            continue
        if found == ZERO_FILL and zero_to_end(data, off):
            break  # a preallocated segment's zero fill: where its records end
        if found in (BAD_CHECKSUM, RESERVED_TYPE):
            _, length, _ = RECORD_HEADER.unpack_from(data, off)
            end = off + RECORD_HEADER_SIZE_BYTES + length
            if _boundary(data, end):  # the length is intact: skip exactly this frame
                start = off + RECORD_HEADER_SIZE_BYTES
                prefix = data[start : start + 4] if length >= 4 else None
                losses.append(Loss(seg.name, off, seq, 1, end - off, found, prefix, len(out)))
                off, seq = end, seq + 1
                continue
        nxt = _resync(data, off)
        if nxt is None and last:
            # The reader's rule (reader.py): one frame that checks out after
            # the problem makes it corruption, not a torn tail. Resume there,
            # or the log salvage leaves would still not open.
            nxt = next_frame(data, off)
            if nxt is None:
                break  # a torn tail: never acknowledged, not a loss
        stop = size if nxt is None else nxt
        losses.append(Loss(seg.name, off, seq, None, stop - off, found, None, len(out)))
        off, seq = stop, seq + 1
    return seq - seg.first_seq


def scan_salvage(wal_dir: Path) -> tuple[list[tuple[int, bytes]], list[Loss], int]:
    """Read every record that checks out; return them, the losses, and the first seq.

    Changes nothing and takes no lock.

    Raises:
        WalFormatError: A stray segment name or another format version.
    """
    segments = list_segments(wal_dir)
    out: list[tuple[int, bytes]] = []
    losses: list[Loss] = []
    if not segments:
        return out, losses, 1
    expected = segments[0].first_seq
    unknown: list[Loss] = []  # losses of unknown size in the previous segment
    for i, seg in enumerate(segments):
        if len(unknown) == 1:
            # The previous segment counted its one loss of unknown size as one
            # record; this segment's name tells how many there really were.
            unknown[0].records = max(0, seg.first_seq - expected + 1)
        elif not unknown and seg.first_seq > expected:
            gap = seg.first_seq - expected
            losses.append(Loss(seg.name, 0, expected, gap, 0, MISSING_SEGMENT, None, len(out)))
        mark = len(losses)
        held = _scan_one(
            seg, read_segment(seg), last=i == len(segments) - 1, out=out, losses=losses
        )
        unknown = [x for x in losses[mark:] if x.records is None]
        expected = seg.first_seq + held
    return out, losses, segments[0].first_seq


def salvage(
    wal_dir: str | os.PathLike[str],
    *,
    finish: Finish | None = None,
    segment_size_bytes: int = SEGMENT_SIZE_BYTES,
) -> SalvageReport:
    """Rewrite the log with every record that checks out; move the originals aside.

    Does nothing (an empty report) when nothing was lost: a torn tail is
    left for ``Wal.open``.

    Args:
        wal_dir: The WAL directory (locked here: never under a live engine).
        finish: Called with the salvaged records and the losses; returns
            records to append after them.
        segment_size_bytes: The new log's rotation size.

    Raises:
        WalLockedError: The log is open (an engine is running on it).
        WalFormatError: A stray segment name or another format version.
    """
    path = Path(wal_dir)
    lock_fd = lock_dir(path)
    try:
        records, losses, first_seq = scan_salvage(path)
        report = SalvageReport(losses=losses)
        if not losses:
            return report
        extra = finish(records, losses) if finish is not None else []
        report.appended = len(extra)
        tmp = path / SALVAGE_DIR
        if tmp.exists():
            shutil.rmtree(tmp)  # an interrupted salvage's half-written copy
        tmp.mkdir()
        os.close(create_segment(tmp, first_seq, write=os.write, fsync=os.fsync))
        with Wal.open(tmp, FsyncPolicy.BATCH, segment_size_bytes) as wal:
            for rtype, payload in (*records, *extra):
                wal.append(rtype, payload)
            report.last_seq = wal.next_seq - 1
        report.first_seq = first_seq
        report.records_kept = report.last_seq - first_seq + 1
        for seg in list_segments(path):
            set_aside(seg.path)
            report.moved_aside.append(seg.name)
        fsync_dir(path)
        for seg in list_segments(tmp):
            seg.path.rename(path / seg.name)
            report.written.append(seg.name)
        fsync_dir(path)
        shutil.rmtree(tmp)
        return report
    finally:
        unlock(lock_fd)
