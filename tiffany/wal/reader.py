"""Reading the WAL: segments, records, torn tails and corruption.

The rules (``docs/wal-format.md``, after LevelDB and etcd):

* At the end of the *last* segment, a short header, a short payload, a
  zero-filled header (type 0), or a bad record with nothing but zeros or
  end-of-file after it, is a **torn tail**: the writer died mid-write. It
  is a clean end of the log; ``Wal.open`` truncates it (keeping a
  ``.broken`` copy).
* Anything else that does not check out (a bad CRC, an impossible length,
  a bad segment header, a gap in sequence numbers between segments) is
  **corruption**: :class:`~tiffany.errors.WalCorruptionError` names the
  segment, the offset and the sequence number. We never skip past it (no
  resync): ``tiffany wal repair`` truncates there, only when asked.

Discussion: a record's sequence number is implicit (the segment's first
sequence number plus the record's index), so a reader never trusts a
number stored in a damaged record, and there can be no gaps inside a
segment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from tiffany.errors import WalCorruptionError, WalFormatError
from tiffany.wal.format import (
    HEADER,
    HEADER_SIZE_BYTES,
    MAGIC,
    MAX_RECORD_BYTES,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
    SEGMENT_SUFFIX,
    VERSION,
    ZERO_TYPE,
)

__all__ = ["Record", "Segment", "TornTail", "iter_records", "list_segments", "scan_segment"]


class Record(NamedTuple):
    """One record as read back."""

    seq: int
    rtype: int
    payload: bytes
    segment: str
    offset: int


@dataclass(frozen=True, slots=True)
class Segment:
    """A segment file and its first sequence number."""

    path: Path
    first_seq: int


@dataclass(frozen=True, slots=True)
class TornTail:
    """Where the last segment's valid records end."""

    segment: str
    offset: int
    bytes_dropped: int
    reason: str


def list_segments(wal_dir: Path) -> list[Segment]:
    """Return the segments in order; raise WalFormatError on a stray name."""
    segments = []
    if not wal_dir.is_dir():
        return []
    for path in wal_dir.iterdir():
        if path.suffix != SEGMENT_SUFFIX:
            continue
        stem = path.stem
        if len(stem) != 20 or not stem.isdigit():
            raise WalFormatError(f"{path}: not a WAL segment name", segment=str(path))
        segments.append(Segment(path, int(stem)))
    segments.sort(key=lambda s: s.first_seq)
    return segments


def _check_header(data: bytes, seg: Segment) -> None:
    if len(data) < HEADER_SIZE_BYTES:
        raise WalCorruptionError(
            f"{seg.path.name}: segment header is short ({len(data)} bytes)",
            segment=seg.path.name,
            offset=0,
            seq=seg.first_seq,
        )
    magic, version, _flags, first_seq, crc = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise WalCorruptionError(
            f"{seg.path.name}: bad magic {magic!r}",
            segment=seg.path.name,
            offset=0,
            seq=seg.first_seq,
        )
    if crc != crc32c(data[: HEADER_SIZE_BYTES - 4]):
        raise WalCorruptionError(
            f"{seg.path.name}: bad header checksum",
            segment=seg.path.name,
            offset=0,
            seq=seg.first_seq,
        )
    if version != VERSION:
        raise WalFormatError(
            f"{seg.path.name}: format version {version}, this build reads {VERSION}",
            segment=seg.path.name,
            version=version,
        )
    if first_seq != seg.first_seq:
        raise WalCorruptionError(
            f"{seg.path.name}: header says first seq {first_seq}",
            segment=seg.path.name,
            offset=0,
            seq=seg.first_seq,
        )


def scan_segment(
    seg: Segment, data: bytes, *, last: bool
) -> tuple[list[tuple[int, int, int, int]], TornTail | None]:
    """Return ``[(offset, type, payload_start, payload_len)]`` and any torn tail.

    Raises:
        WalCorruptionError: A bad record that is not a torn tail.
    """
    _check_header(data, seg)
    out: list[tuple[int, int, int, int]] = []
    size = len(data)
    off = HEADER_SIZE_BYTES
    unpack = RECORD_HEADER.unpack_from
    view = memoryview(data)
    hsize = RECORD_HEADER_SIZE_BYTES
    while off < size:
        reason = None
        if size - off < hsize:
            reason = "short header"
        else:
            crc, length, rtype = unpack(data, off)
            end = off + hsize + length
            if rtype == ZERO_TYPE and length == 0 and crc == 0:
                reason = "zero fill"
            elif length > MAX_RECORD_BYTES:
                reason = f"impossible length {length}"
            elif end > size:
                reason = "short payload"
            elif rtype == ZERO_TYPE:
                reason = "record of reserved type 0"
            elif crc32c(view[off + 4 : end]) != crc:
                reason = "bad checksum"
            else:
                out.append((off, rtype, off + hsize, length))
                off = end
                continue
        seq = seg.first_seq + len(out)
        # Something does not check out at ``off``: a torn tail only if it is in
        # the last segment and no valid record follows it anywhere.
        if last and not _valid_record_after(data, off):
            return out, TornTail(seg.path.name, off, size - off, reason or "?")
        raise WalCorruptionError(
            f"{seg.path.name}: {reason} at offset {off} (record seq {seq})",
            segment=seg.path.name,
            offset=off,
            seq=seq,
            reason=reason,
        )
    return out, None


def _valid_record_after(data: bytes, off: int) -> bool:
    """True when a record that checks out starts anywhere after ``off``.

    Discussion: a flipped bit in a record's length makes it look like it
    runs past the end of the file, exactly like a record the writer did not
    finish. What tells them apart is what follows: a torn write is the last
    thing in the file, while a damaged record in the middle is followed by
    good ones. So before calling anything a torn tail we look for any valid
    record (type 1..255, plausible length, matching CRC) at every later
    offset. It is slow, but it runs only on a damaged file, and the chance
    that garbage passes a CRC32C is one in four billion per candidate.
    """
    size = len(data)
    unpack = RECORD_HEADER.unpack_from
    view = memoryview(data)
    for k in range(off + 1, size - RECORD_HEADER_SIZE_BYTES + 1):
        crc, length, rtype = unpack(data, k)
        end = k + RECORD_HEADER_SIZE_BYTES + length
        if rtype == ZERO_TYPE or length > MAX_RECORD_BYTES or end > size:
            continue
        if crc32c(view[k + 4 : end]) == crc:
            return True
    return False


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def iter_records(wal_dir: str | os.PathLike[str], from_seq: int = 1) -> Iterator[Record]:
    """Yield the records with ``seq >= from_seq``, in order.

    A torn tail ends the iteration quietly (it is the end of the log);
    corruption raises :class:`~tiffany.errors.WalCorruptionError`.
    """
    wal_path = Path(wal_dir)
    segments = list_segments(wal_path)
    expected = segments[0].first_seq if segments else 1
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg.first_seq != expected:
            raise WalCorruptionError(
                f"{seg.path.name}: sequence gap, expected a segment starting at {expected}",
                segment=seg.path.name,
                offset=0,
                seq=expected,
            )
        nxt = segments[i + 1].first_seq if not last else None
        if nxt is not None and nxt <= from_seq:
            expected = nxt
            continue
        data = _read(seg.path)
        frames, _torn = scan_segment(seg, data, last=last)
        name = seg.path.name
        skip = max(0, from_seq - seg.first_seq)
        seq = seg.first_seq + skip
        for off, rtype, start, length in frames[skip:]:
            yield Record(seq, rtype, data[start : start + length], name, off)
            seq += 1
        expected = seg.first_seq + len(frames)
        if nxt is not None and nxt != expected:
            raise WalCorruptionError(
                f"{segments[i + 1].path.name}: sequence gap after {name} (expected {expected})",
                segment=segments[i + 1].path.name,
                offset=0,
                seq=expected,
            )
