"""WAL on-disk constants and the segment header; normative: ``docs/wal-format.md``.

Every constant in the "Constants" table of that document is defined here
with the same value, and ``tests/wal/test_format_doc.py`` checks that the two
agree (it also checks the worked example byte for byte). Change the format
by changing the document first, then ``VERSION``.

Invariants:

* All integers on disk are little-endian.
* A segment starts with ``HEADER`` (24 bytes): magic, version, flags,
  first sequence number, and the CRC32C of the 20 bytes before it.
* A record starts with ``RECORD_HEADER`` (9 bytes): the CRC32C of every byte
  after it (length, type, payload), the payload length, the type.
* Type 0 (``ZERO_TYPE``) is never written: nine zero bytes are zero fill.
"""

from __future__ import annotations

import struct
from typing import Final

from crc32c import crc32c

__all__ = [
    "BROKEN_SUFFIX",
    "HEADER",
    "HEADER_SIZE_BYTES",
    "JOURNAL_NAME",
    "LOCK_NAME",
    "MAGIC",
    "MAX_RECORD_BYTES",
    "MAX_TYPE",
    "RECORD_HEADER",
    "RECORD_HEADER_SIZE_BYTES",
    "SEGMENT_NAME_DIGITS",
    "SEGMENT_SIZE_BYTES",
    "SEGMENT_SUFFIX",
    "VERSION",
    "ZERO_TYPE",
    "encode_header",
    "segment_name",
]

#: First 8 bytes of every segment (docs/wal-format.md, "Constants").
MAGIC: Final = b"TIFWAL\x00\x01"
#: Format version written in the segment header.
VERSION: Final = 1
#: Segment header: magic (8s), version (u16), flags (u16), first_seq (u64),
#: header_crc (u32) = crc32c of the 20 bytes before it.
HEADER: Final = struct.Struct("<8sHHQI")
HEADER_SIZE_BYTES: Final = 24
#: Record header: crc (u32), length (u32), type (u8). The crc covers every
#: byte of the record after it: length, type and payload.
RECORD_HEADER: Final = struct.Struct("<IIB")
RECORD_HEADER_SIZE_BYTES: Final = 9
#: Reserved record type: a zero-filled header is zero fill, never a record.
ZERO_TYPE: Final = 0
#: Largest record type (it is one byte).
MAX_TYPE: Final = 255
#: Largest payload, in bytes. The writer refuses more; a reader that sees a
#: larger length calls it an impossible length.
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024
#: Default rotation size, in bytes: a segment holding at least one record is
#: closed rather than grown past it. ``Wal.open(segment_size_bytes=...)``
#: overrides it (tests shrink it to a few hundred bytes).
SEGMENT_SIZE_BYTES: Final = 64 * 1024 * 1024
#: Digits of ``first_seq`` in a segment's name (zero-padded, so names sort).
SEGMENT_NAME_DIGITS: Final = 20
#: Segment file suffix.
SEGMENT_SUFFIX: Final = ".wal"
#: Appended to the name of a file that recovery or repair set aside.
BROKEN_SUFFIX: Final = ".broken"
#: The lock file in the WAL directory; it holds the writer's pid.
LOCK_NAME: Final = "LOCK"
#: The file in the WAL directory that names the journal (``tiffany/wal/identity.py``).
JOURNAL_NAME: Final = "JOURNAL"

_HEADER_CRC_OFFSET: Final = HEADER_SIZE_BYTES - 4

assert HEADER.size == HEADER_SIZE_BYTES
assert RECORD_HEADER.size == RECORD_HEADER_SIZE_BYTES


def segment_name(first_seq: int) -> str:
    """Return the file name of the segment whose first record is ``first_seq``.

    Example: ``segment_name(1) == "00000000000000000001.wal"``.
    """
    return f"{first_seq:0{SEGMENT_NAME_DIGITS}d}{SEGMENT_SUFFIX}"


def encode_header(first_seq: int) -> bytes:
    """Return the 24-byte header of a segment whose first record is ``first_seq``."""
    head = HEADER.pack(MAGIC, VERSION, 0, first_seq, 0)[:_HEADER_CRC_OFFSET]
    return head + crc32c(head).to_bytes(4, "little")


def header_problem(data: bytes, first_seq: int) -> str | None:
    """Return what is wrong with the header at the start of ``data``, or None.

    Args:
        data: The segment's bytes (at least its first 24).
        first_seq: The first sequence number the segment's name announces.

    The version is checked last, after the crc: a header that checks out with
    another version is a file from another build (``"version N"``), not damage.
    """
    if len(data) < HEADER_SIZE_BYTES:
        return f"short segment header ({len(data)} bytes)"
    magic, version, _flags, header_seq, crc = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        return f"bad magic {magic!r}"
    if crc != crc32c(data[:_HEADER_CRC_OFFSET]):
        return "bad header checksum"
    if version != VERSION:
        return f"version {version}"
    if header_seq != first_seq:
        return f"header says first seq {header_seq}, the name says {first_seq}"
    return None
