"""Reading the WAL: records in order, torn tails, corruption.

The rules are those of ``docs/wal-format.md`` ("Reading, torn tails and
corruption"), after LevelDB's ``log_reader.cc`` and etcd's ``decoder.go``:

* Zero fill that runs to the end of a segment (any segment) is where its
  records end: the segment was preallocated (docs/wal-format.md,
  "Preallocation"). A sealed segment that ends so early that records are
  missing is caught by the next segment's first seq (a sequence gap).
* A problem in the **last** segment with no record that checks out anywhere
  after it is a **torn tail**: the writer died mid-write, and the log ends
  cleanly before it. A last segment shorter than its header, or all zeros,
  is a torn creation (a torn tail at offset 0).
* Every other problem (in an earlier segment, followed by a good record, a
  bad header, a gap between segments) is **corruption**:
  :class:`~tiffany.errors.WalCorruptionError` names the segment, the offset
  and the sequence number the bad record would have had. Nothing is skipped.

Invariants:

* A record's sequence number is implicit: its segment's ``first_seq`` plus
  its index. A reader never trusts a number stored in a record, and there
  can be no gap inside a segment; gaps between segments are checked.
* Only records that check out are ever yielded, and records are yielded in
  sequence order.

Discussion: segments are read whole (``read()``, 64 MiB at most by default)
and parsed with ``unpack_from`` and slices. ``mmap`` would save the copy, but
every payload has to become ``bytes`` anyway, and the copy is cheap next to
the parsing (a small fraction of a read's time).
The loops below inline :func:`frame.decode` for the good case (see
``frame.py``) and build ``Record`` with ``tuple.__new__``, which skips the
NamedTuple constructor's argument parsing, a clearly faster read of small
records.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

from crc32c import crc32c

from tiffany.errors import WalCorruptionError
from tiffany.wal.format import (
    HEADER_SIZE_BYTES,
    MAX_RECORD_BYTES,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
)
from tiffany.wal.frame import decode, next_frame, zero_to_end
from tiffany.wal.segments import (
    REMEDY,
    Segment,
    check_header,
    history_segments,
    is_torn_creation,
    read_segment,
)

__all__ = [
    "TORN_CREATION",
    "Position",
    "Record",
    "SegmentScan",
    "Span",
    "TornTail",
    "iter_records",
    "iter_spans",
    "scan_segment",
    "sequence_gap",
]

TORN_CREATION = "torn segment creation"


class Record(NamedTuple):
    """One record as read back.

    Attributes:
        seq: Its sequence number (implicit on disk).
        rtype: Its type, 1..255.
        payload: Its payload, opaque to the WAL.
        segment: The file name of the segment it is in.
        offset: The offset of its header in that segment.
    """

    seq: int
    rtype: int
    payload: bytes
    segment: str
    offset: int


_new_record = cast("Callable[[type[Record], tuple[Any, ...]], Record]", tuple.__new__)


@dataclass(frozen=True, slots=True)
class TornTail:
    """Where the log ends early: the bytes of the last segment past its last good record.

    Attributes:
        segment: The last segment's file name.
        offset: Where its last good record ends (0 for a torn creation).
        bytes_dropped: How many bytes follow that offset.
        reason: The problem found at ``offset`` (``frame.SHORT_HEADER``, ...).
    """

    segment: str
    offset: int
    bytes_dropped: int
    reason: str


class SegmentScan(NamedTuple):
    """A checked segment: how many records, where the last ends, any torn tail."""

    records: int
    end: int
    torn: TornTail | None


def _problem(seg: Segment, data: bytes, offset: int, seq: int, *, last: bool) -> TornTail:
    """Name the problem at ``offset``: a torn tail, or raise corruption."""
    problem = decode(data, offset)
    assert isinstance(problem, str), "the fast loop and frame.decode disagree"
    if last and next_frame(data, offset) is None:
        return TornTail(seg.name, offset, len(data) - offset, problem)
    where = "good records follow it" if last else "in a segment that is not the last"
    raise WalCorruptionError(
        f"{seg.name}: {problem} at offset {offset} (record seq {seq}; {where}){REMEDY}",
        segment=seg.name,
        offset=offset,
        seq=seq,
        reason=problem,
    )


def _start(seg: Segment, data: bytes, *, last: bool) -> TornTail | None:
    """Check the header; a torn creation of the last segment is a torn tail at 0."""
    if last and is_torn_creation(data):
        return TornTail(seg.name, 0, len(data), TORN_CREATION)
    check_header(seg, data)
    return None


def scan_segment(seg: Segment, data: bytes, *, last: bool) -> SegmentScan:
    """Check every record of one segment without building them.

    Args:
        seg: The segment.
        data: Its bytes.
        last: Whether it is the last segment (where a torn tail may be).

    Raises:
        WalCorruptionError: A problem that is not a torn tail.
        WalFormatError: A segment of another format version.
    """
    torn = _start(seg, data, last=last)
    if torn is not None:
        return SegmentScan(0, 0, torn)
    unpack = RECORD_HEADER.unpack_from
    view = memoryview(data)
    size = len(data)
    off = HEADER_SIZE_BYTES
    limit = size - RECORD_HEADER_SIZE_BYTES
    count = 0
    while off <= limit:
        crc, n, rtype = unpack(data, off)
        end = off + RECORD_HEADER_SIZE_BYTES + n
        if not rtype or end > size or n > MAX_RECORD_BYTES or crc32c(view[off + 4 : end]) != crc:
            break
        off = end
        count += 1
    if off == size or zero_to_end(data, off):
        return SegmentScan(count, off, None)
    return SegmentScan(count, off, _problem(seg, data, off, seg.first_seq + count, last=last))


def sequence_gap(seg: Segment, expected: int) -> WalCorruptionError:
    """Return the error for a segment that does not start where the previous one ended."""
    return WalCorruptionError(
        f"{seg.name}: sequence gap: the previous segment ends before seq {expected}, "
        f"this one starts at {seg.first_seq}{REMEDY}",
        segment=seg.name,
        offset=0,
        seq=expected,
        reason="sequence gap",
    )


def iter_records(wal_dir: str | os.PathLike[str], from_seq: int = 1) -> Iterator[Record]:
    """Yield the log's records with ``seq >= from_seq``, in order.

    The log is its whole history on disk: the archived segments
    (``wal/archive/``), then the live ones. It may begin after seq 1 (when
    retention deleted segments); records before its first are not yielded.
    Segments that end before ``from_seq`` are not read. A torn tail ends the
    iteration quietly: it is the end of the log. Nothing is modified.

    Args:
        wal_dir: The WAL directory (it need not be locked; a live writer's
            unsynced tail may look torn).
        from_seq: The first sequence number wanted.

    Raises:
        WalCorruptionError: A bad record that is not a torn tail (raised when
            the iteration reaches it; records before it are yielded first).
        WalFormatError: A stray ``*.wal`` name or another format version.
    """
    new = _new_record
    for seq, rtype, data, start, end, name in iter_spans(wal_dir, from_seq):
        yield new(Record, (seq, rtype, data[start:end], name, start - RECORD_HEADER_SIZE_BYTES))


#: ``(seq, rtype, segment bytes, payload start, payload end, segment name)``.
Span = tuple[int, int, bytes, int, int, str]

#: ``(segment name, byte offset, seq)``: where record ``seq`` starts in that
#: segment (or would start: the end of the one before it), as a reader found
#: it. :func:`iter_spans` resumes there instead of walking the segment from
#: its head (LevelDB's ``initial_offset``).
Position = tuple[str, int, int]


def iter_spans(
    wal_dir: str | os.PathLike[str],
    from_seq: int = 1,
    checked: Mapping[str, int] | None = None,
    at: Position | None = None,
    ends: Mapping[str, int] | None = None,
) -> Iterator[Span]:
    """Yield where the log's records with ``seq >= from_seq`` are, in order, without copying.

    What :func:`iter_records` yields, as ``(seq, rtype, data, start, end,
    segment)``: the payload is ``data[start:end]``, ``data`` the whole
    segment (the same object for all its records). A reader that keeps few
    payloads, or decodes them in place (``memoryview(data)[start:end]``),
    copies nothing. Same rules and errors as :func:`iter_records`.

    ``checked`` (:attr:`Wal.checked <tiffany.wal.writer.Wal.checked>`, from
    the open of the writer that holds the log's lock) maps segment names to
    offsets up to which every record's checksum was just verified: those are
    not summed again (a start reads its live segments right after opening
    them; summing a large segment twice is a visible share of a start).

    ``at`` (a :data:`Position` an earlier pass over this log found, at or
    before ``from_seq``) starts the walk of its segment there: the records
    before it are neither walked nor summed again. The checkpointer folds
    the records after its last pass every 1,000 runs; walking the live
    segment from its head each time made a pass cost the whole segment
    (up to 64 MiB), not the records since the last one. A position that
    does not fit the segment (past its end) is ignored.

    ``ends`` (:meth:`Wal.durable_ends <tiffany.wal.writer.Wal.durable_ends>`,
    from the writer itself) maps a segment's name to where its records end
    for now: only those bytes are read (a preallocated live segment is 64
    MiB, mostly zeros; the checkpointer reads it every thousand runs).

    Discussion: the per-record loop is written out here rather than in a
    per-segment generator that this one would ``yield from``: the delegation
    costs more than the loop body (1.2 M records/s instead of 2 M).
    """
    segments = history_segments(Path(wal_dir))
    expected = segments[0].first_seq if segments else 1
    unpack = RECORD_HEADER.unpack_from
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg.first_seq != expected:
            raise sequence_gap(seg, expected)
        if not last and segments[i + 1].first_seq <= from_seq:
            expected = segments[i + 1].first_seq  # checked when a reader reads it
            continue
        data = read_segment(seg, ends.get(seg.name) if ends else None)
        if _start(seg, data, last=last) is not None:
            return  # a torn creation: the end of the log
        view = memoryview(data)
        size = len(data)
        name = seg.name
        seq = seg.first_seq
        off = HEADER_SIZE_BYTES
        if at is not None and at[0] == name and at[2] <= from_seq and off <= at[1] <= size:
            _, off, seq = at
        limit = size - RECORD_HEADER_SIZE_BYTES
        summed = checked.get(name, 0) if checked else 0  # checked below this offset
        # frame.decode, inlined for the good case (see frame.py).
        while off <= limit:
            crc, n, rtype = unpack(data, off)
            end = off + RECORD_HEADER_SIZE_BYTES + n
            if (
                not rtype
                or end > size
                or n > MAX_RECORD_BYTES
                or (end > summed and crc32c(view[off + 4 : end]) != crc)
            ):
                break
            if seq >= from_seq:
                yield seq, rtype, data, end - n, end, name
            off = end
            seq += 1
        if off != size and not zero_to_end(data, off):
            _problem(seg, data, off, seq, last=last)  # raises, or a torn tail: the end
            return
        expected = seq
