"""The write-ahead log: append-only segments of CRC-framed records.

The WAL knows nothing of tasks: payloads are opaque bytes with a type byte
(1..255). The format is ``docs/wal-format.md``.

Public API::

    from tiffany.wal import Wal, FsyncPolicy, iter_records, verify, repair

    wal = Wal.open(path, fsync=FsyncPolicy.BATCH)   # locks, recovers a torn tail
    seq = wal.append(rtype, payload)                # buffered
    wal.commit()                                    # one fdatasync (group commit)
    for rec in iter_records(path, from_seq=1): ...  # Record(seq, rtype, payload, segment, offset)
"""

from tiffany.wal.format import MAX_RECORD_BYTES, SEGMENT_SIZE_BYTES
from tiffany.wal.reader import Record, TornTail, iter_records
from tiffany.wal.repair import RepairReport, VerifyReport, repair, verify
from tiffany.wal.writer import FsyncPolicy, Recovery, Wal

__all__ = [
    "MAX_RECORD_BYTES",
    "SEGMENT_SIZE_BYTES",
    "FsyncPolicy",
    "Record",
    "Recovery",
    "RepairReport",
    "TornTail",
    "VerifyReport",
    "Wal",
    "iter_records",
    "repair",
    "verify",
]
