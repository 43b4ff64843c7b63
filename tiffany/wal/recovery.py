"""Opening a log after a stop or a crash: check it, cut a torn tail, find the end.

What ``Wal.open`` does once it holds the lock:

1. list the segments; none: create the first one (seq 1);
2. check every segment and the sequence numbers between them
   (:func:`~tiffany.wal.reader.scan_segment`): corruption anywhere raises,
   and the log refuses to open;
3. a torn tail of the last segment is moved aside: its bytes are read,
   the segment is truncated at its last good record and fsynced (freeing
   the space), then the cut bytes go to ``<name>.broken`` if they fit; a
   torn *creation* (a last
   segment shorter than its header, or all zeros: no record in it) is
   renamed ``.broken`` and appending goes on in the segment before it (no
   new space needed); a torn first segment gets its header again instead.
   Either way it is logged and reported as :class:`Recovery`;
4. open the last segment for writing at the end of its records (a
   preallocated segment's zero fill is overwritten, docs/wal-format.md
   "Preallocation"), and fsync it: what a previous
   writer left unsynced in the page cache becomes durable, so
   ``durable_seq`` starts honest.

Invariants: opening never needs more disk space than the log already
takes (a full disk must not stop a restart); damaged bytes are kept as
``.broken`` files when the disk has room, and their loss is logged when it
has not; nothing but a torn tail of the last segment is ever changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import structlog

from tiffany.errors import WalFormatError
from tiffany.wal.format import HEADER_SIZE_BYTES, segment_name
from tiffany.wal.frame import is_benign
from tiffany.wal.reader import TORN_CREATION, SegmentScan, TornTail, scan_segment, sequence_gap
from tiffany.wal.segments import (
    Segment,
    SyncFn,
    WriteFn,
    create_segment,
    fsync_dir,
    list_segments,
    move_tail_aside,
    read_segment,
    reset_segment,
    set_aside,
)

__all__ = ["OpenState", "Recovery", "recover"]

log = structlog.get_logger("tiffany.wal")


@dataclass(frozen=True, slots=True)
class Recovery:
    """A torn tail that ``Wal.open`` cut off the last segment.

    Attributes:
        segment: The segment's file name.
        offset: Where its last good record ends (now its size); 0 when the
            segment itself was torn at creation and was made afresh.
        bytes_dropped: How many bytes were cut.
        reason: The problem found at ``offset`` (``"short payload"``, ...).
        copy: The file the cut bytes were moved to (``<segment>.broken``,
            holding only the bytes from ``offset`` on; the whole file for a
            torn creation), or None when the disk had no room for them
            (logged as ``wal.torn_tail_lost``).
    """

    segment: str
    offset: int
    bytes_dropped: int
    reason: str
    copy: str | None


class OpenState(NamedTuple):
    """Where appending resumes."""

    fd: int  # the last segment, open for writing at ``segment_bytes``
    segment_bytes: int  # its size
    next_seq: int
    recovery: Recovery | None
    #: Segment name -> the end of its records this check found good (every live one).
    checked: dict[str, int]
    segment: str  # the name of the segment appending goes on in


def recover(
    wal_dir: Path,
    *,
    write: WriteFn,
    fsync: SyncFn | None,
    first_seq: int = 1,
    limit_seq: int | None = None,
) -> OpenState:
    """Check the log in ``wal_dir`` and get it ready for appending.

    Args:
        wal_dir: The WAL directory (locked by the caller).
        write: ``os.write`` or a stand-in, for a new segment's header.
        fsync: ``os.fsync`` or a stand-in; None (policy ``off``) syncs nothing.
        first_seq: The seq of an empty log's first record (an engine's range
            starts there: ``tiffany/wire/shards.py``).
        limit_seq: The seqs this log may hold stop below it (None: no bound).

    Raises:
        WalCorruptionError: A bad record that is not a torn tail.
        WalFormatError: A stray segment name or another format version.
    """
    segments = list_segments(wal_dir)
    if not segments:
        fd = create_segment(wal_dir, first_seq, write=write, fsync=fsync)
        return OpenState(fd, HEADER_SIZE_BYTES, first_seq, None, {}, segment_name(first_seq))
    expected = segments[0].first_seq
    if expected < first_seq or (limit_seq is not None and expected >= limit_seq):
        bound = "" if limit_seq is None else f" to {limit_seq - 1}"
        raise WalFormatError(
            f"{wal_dir}: its first segment starts at seq {expected}, outside this "
            f"engine's seqs ({first_seq}{bound}): it is another engine's WAL",
            segment=segments[0].name,
            first_seq=first_seq,
        )
    scan = prev = SegmentScan(0, HEADER_SIZE_BYTES, None)
    checked: dict[str, int] = {}
    for i, seg in enumerate(segments):
        if seg.first_seq != expected:
            raise sequence_gap(seg, expected)
        prev, scan = scan, scan_segment(seg, read_segment(seg), last=i == len(segments) - 1)
        checked[seg.name] = scan.end
        expected = seg.first_seq + scan.records
    last = segments[-1]
    recovery = None
    torn = scan.torn
    if torn is not None:
        recovery = _cut_tail(wal_dir, last, torn, fsync=fsync, alone=len(segments) == 1)
        if torn.reason == TORN_CREATION and len(segments) > 1:
            # The torn segment holds no record and is set aside (a rename: no
            # space needed, which matters when a full disk tore the rotation);
            # appending goes on in the previous segment, whose next append
            # rotates again.
            last, scan = segments[-2], prev
        elif torn.reason == TORN_CREATION:
            fd = reset_segment(last.path, last.first_seq, write=write, fsync=fsync)
            return OpenState(fd, HEADER_SIZE_BYTES, last.first_seq, recovery, checked, last.name)
    fd = os.open(last.path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        # Appending goes on where the records end: the end of the file, or
        # where a preallocated segment's zero fill begins.
        os.lseek(fd, scan.end, os.SEEK_SET)
        if fsync is not None:
            # What a previous writer wrote but never synced (policy off, or a
            # failed sync) may still be only in the page cache: sync it now, so
            # that everything this open found counts as durable.
            fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return OpenState(fd, scan.end, expected, recovery, checked, last.name)


def _cut_tail(
    wal_dir: Path, seg: Segment, torn: TornTail, *, fsync: SyncFn | None, alone: bool
) -> Recovery:
    """Move the torn tail of the last segment aside: cut it, then keep its bytes if they fit.

    Discussion: the cut bytes are read first, the segment is truncated and
    synced (which frees their space), and only then are they written to a
    small ``.broken`` file. A full disk must not keep the engine from
    starting: if even that file cannot be written, the loss is logged (those
    bytes were never acknowledged, see docs/wal-format.md) and opening goes
    on. We rejected copying the whole segment first (the old way): on a full
    disk the copy fails, and the restart with it.
    """
    if torn.reason == TORN_CREATION and not alone:
        kept: Path | None = set_aside(seg.path)  # see recover(): no record in it
        if fsync is not None:
            fsync_dir(wal_dir, fsync)
    else:
        # A torn only segment (the first ever, or the first live one once
        # retention released those before it) is cut at 0 and
        # ``reset_segment`` writes its header into the same file.
        _, kept = move_tail_aside(seg.path, torn.offset, fsync=fsync)
    copy = None if kept is None else kept.name
    if kept is None and torn.bytes_dropped:
        log.error(
            "wal.torn_tail_lost",
            path=str(wal_dir),
            segment=seg.name,
            offset=torn.offset,
            bytes_dropped=torn.bytes_dropped,
            reason=torn.reason,
            note="no room to keep the cut bytes; they were never acknowledged",
        )
    recovery = Recovery(seg.name, torn.offset, torn.bytes_dropped, torn.reason, copy)
    fields = {
        "path": str(wal_dir),
        "segment": seg.name,
        "offset": torn.offset,
        "bytes_dropped": torn.bytes_dropped,
        "reason": torn.reason,
        "copy": copy,
    }
    if is_benign(torn.reason) or torn.reason == TORN_CREATION:
        log.warning("wal.torn_tail_truncated", **fields)
    else:
        # A complete record that does not check out may have been acknowledged:
        # we stay tail-tolerant (docs/wal-format.md) but say so loudly.
        log.error("wal.torn_tail_truncated", damaged_last_record=True, **fields)
    return recovery
