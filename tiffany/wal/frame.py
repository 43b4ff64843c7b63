"""One record on disk: encode it, decode it, name what is wrong with it.

Pure functions over bytes; no files. The layout (``docs/wal-format.md``)::

    record := crc:u32 length:u32 type:u8 payload:u8[length]
    crc    := crc32c(length || type || payload)

Invariants:

* ``encode`` produces exactly what ``Wal.append`` puts in its buffer, and
  ``decode`` accepts exactly what ``encode`` produces.
* ``decode`` checks a frame's problems in a fixed order (the list in the
  format document) and names the first one, so that the torn-tail rule and
  error messages do not depend on which loop found the problem.

Discussion: the writer's ``append`` and the reader's loops inline these few
lines instead of calling :func:`encode` and :func:`decode`: a Python call
costs a large share of the whole per-record budget. The inlined copies
only handle the good case; anything that does not check out falls back to
:func:`decode` here for its name, and the tests compare both paths.
"""

from __future__ import annotations

import re
import struct
from typing import Final, NamedTuple

from crc32c import crc32c

from tiffany.wal.format import (
    MAX_RECORD_BYTES,
    MAX_TYPE,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
    ZERO_TYPE,
)

__all__ = [
    "BAD_CHECKSUM",
    "IMPOSSIBLE_LENGTH",
    "RESERVED_TYPE",
    "SHORT_HEADER",
    "SHORT_PAYLOAD",
    "ZERO_FILL",
    "Frame",
    "check_record",
    "decode",
    "encode",
    "is_benign",
    "next_frame",
    "zero_to_end",
]

# What can be wrong with a frame, in the order ``decode`` checks.
SHORT_HEADER: Final = "short header"
ZERO_FILL: Final = "zero fill"
IMPOSSIBLE_LENGTH: Final = "impossible length"
SHORT_PAYLOAD: Final = "short payload"
RESERVED_TYPE: Final = "reserved type"
BAD_CHECKSUM: Final = "bad checksum"

#: The problems an unfinished write leaves: at the end of the log they are
#: expected after a crash (a warning). The others, at the end of the log,
#: may be damage to an acknowledged record (an error, still truncated).
_BENIGN: Final = frozenset({SHORT_HEADER, ZERO_FILL, SHORT_PAYLOAD})

_ZERO_HEADER: Final = bytes(RECORD_HEADER_SIZE_BYTES)
_NONZERO: Final = re.compile(rb"[^\x00]")
#: What :func:`zero_to_end` compares a segment's tail with, a chunk at a time.
_ZEROS: Final = bytes(1 << 20)
_pack_len_type = struct.Struct("<IB").pack


class Frame(NamedTuple):
    """A record that checks out: its type and where its payload lies."""

    rtype: int
    start: int  # offset of the payload's first byte
    end: int  # offset just past the payload: where the next record starts


def check_record(rtype: int, size: int) -> None:
    """Refuse a record the format cannot hold.

    Raises:
        ValueError: ``rtype`` is not 1..255, or ``size`` exceeds ``MAX_RECORD_BYTES``.
    """
    if not ZERO_TYPE < rtype <= MAX_TYPE:
        raise ValueError(f"record type must be 1..{MAX_TYPE} (0 is reserved), got {rtype}")
    if size > MAX_RECORD_BYTES:
        raise ValueError(f"record of {size} bytes exceeds MAX_RECORD_BYTES ({MAX_RECORD_BYTES})")


def encode(rtype: int, payload: bytes) -> bytes:
    """Return the bytes of one record.

    Raises:
        ValueError: See :func:`check_record`.
    """
    n = len(payload)
    check_record(rtype, n)
    crc = crc32c(payload, crc32c(_pack_len_type(n, rtype)))
    return RECORD_HEADER.pack(crc, n, rtype) + payload


def decode(data: bytes, offset: int) -> Frame | str:
    """Decode the record at ``offset``: a :class:`Frame`, or what is wrong.

    Args:
        data: A whole segment (or any buffer the record lies in).
        offset: Where the record's header starts.

    Returns:
        The frame, or one of ``SHORT_HEADER``, ``ZERO_FILL``,
        ``IMPOSSIBLE_LENGTH``, ``SHORT_PAYLOAD``, ``RESERVED_TYPE``,
        ``BAD_CHECKSUM``: the first problem, in that order.
    """
    size = len(data)
    if size - offset < RECORD_HEADER_SIZE_BYTES:
        return SHORT_HEADER
    start = offset + RECORD_HEADER_SIZE_BYTES
    if data[offset:start] == _ZERO_HEADER:
        return ZERO_FILL
    crc, length, rtype = RECORD_HEADER.unpack_from(data, offset)
    if length > MAX_RECORD_BYTES:
        return IMPOSSIBLE_LENGTH
    end = start + length
    if end > size:
        return SHORT_PAYLOAD
    if rtype == ZERO_TYPE:
        return RESERVED_TYPE
    if crc32c(memoryview(data)[offset + 4 : end]) != crc:
        return BAD_CHECKSUM
    return Frame(rtype, start, end)


def is_benign(problem: str) -> bool:
    """True for the problems an unfinished write leaves (short header or payload, zeros)."""
    return problem in _BENIGN


def next_frame(data: bytes, offset: int) -> int | None:
    """Return the first offset after ``offset`` where a record checks out, or None.

    This is the probe behind the torn-tail rule: a problem with nothing valid
    after it is a torn tail, a problem with a valid record after it is
    corruption. It runs only on damaged files.

    Discussion: it tries every offset, as a resynchronising reader would.
    Runs of zeros (a preallocated or zero-filled tail) are skipped with one
    regex search, since a record's type byte is never zero; other garbage
    costs one unpack per byte, and most candidates fail on the length
    before a crc is computed. The chance that garbage passes CRC32C is one
    in four billion per candidate; a payload that embeds a whole valid
    frame makes a torn tail look like corruption, the safe direction.
    """
    size = len(data)
    last = size - RECORD_HEADER_SIZE_BYTES
    k = offset + 1
    while k <= last:
        if data[k + 8] == ZERO_TYPE:
            found = _NONZERO.search(data, k + 9)
            if found is None:
                return None
            k = found.start() - 8
            continue
        if isinstance(decode(data, k), Frame):
            return k
        k += 1
    return None


def zero_to_end(data: bytes, offset: int) -> bool:
    """True when every byte of ``data`` from ``offset`` on is zero (a preallocated tail).

    A segment is zero-filled ahead of its records when it was preallocated
    (docs/wal-format.md, "Preallocation"): zero fill that runs to the end of
    the file is where its records end, not damage.

    Discussion: ``bytes.startswith`` at an offset compares with ``memcmp``
    and copies nothing, where a regex search or a ``memoryview``
    comparison walks the zeros in Python-level steps, dozens of times slower.
    """
    size = len(data)
    step = len(_ZEROS)
    while size - offset > step:
        if not data.startswith(_ZEROS, offset):
            return False
        offset += step
    return data.startswith(_ZEROS[: size - offset], offset)
