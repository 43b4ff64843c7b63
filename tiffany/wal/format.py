"""WAL on-disk constants; the normative description is ``docs/wal-format.md``.

Every constant here appears in the table of that document, and
``tests/wal/test_format_doc.py`` checks that the two agree.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "HEADER",
    "HEADER_SIZE_BYTES",
    "MAGIC",
    "MAX_RECORD_BYTES",
    "RECORD_HEADER",
    "RECORD_HEADER_SIZE_BYTES",
    "SEGMENT_SIZE_BYTES",
    "SEGMENT_SUFFIX",
    "VERSION",
    "ZERO_TYPE",
    "segment_name",
]

#: First 8 bytes of every segment.
MAGIC: Final = b"TIFWAL\x00\x01"
#: Format version written in the segment header.
VERSION: Final = 1
#: Segment header: magic, version (u16), flags (u16), first sequence number
#: (u64), CRC32C of the preceding 20 bytes (u32); little-endian.
HEADER: Final = struct.Struct("<8sHHQI")
HEADER_SIZE_BYTES: Final = 24
#: Record header: CRC32C (u32), payload length (u32), type (u8); little-endian.
#: The CRC covers everything after it: the length, the type, the payload.
RECORD_HEADER: Final = struct.Struct("<IIB")
RECORD_HEADER_SIZE_BYTES: Final = 9
#: Type 0 is reserved: a zero-filled header is never a record.
ZERO_TYPE: Final = 0
#: Largest payload accepted.
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024
#: A segment is closed and a new one started past this size.
SEGMENT_SIZE_BYTES: Final = 64 * 1024 * 1024
#: Segment file suffix; the name is the first sequence number, 20 digits.
SEGMENT_SUFFIX: Final = ".wal"
#: The lock file in the WAL directory.
LOCK_NAME: Final = "LOCK"

assert HEADER.size == HEADER_SIZE_BYTES
assert RECORD_HEADER.size == RECORD_HEADER_SIZE_BYTES


def segment_name(first_seq: int) -> str:
    """Return the file name of the segment whose first record is ``first_seq``."""
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"
