"""The write-ahead log: append-only segments of CRC-framed, opaque records.

The WAL knows nothing of tasks: a record is a type byte (1..255) and opaque
payload bytes, numbered by an implicit, gapless sequence number. The format
is ``docs/wal-format.md`` (normative; the constants here cite it).

Public API::

    from tiffany.wal import Wal, FsyncPolicy, Record, iter_records, verify, repair

    wal = Wal.open(path, fsync=FsyncPolicy.BATCH)  # lock, check, cut a torn tail
    wal.recovery                                   # Recovery(segment, offset, ...) or None
    seq = wal.append(rtype, payload)               # buffered, no system call
    wal.commit()                                   # write + one fdatasync (group commit)
    wal.next_seq, wal.durable_seq, wal.failed
    wal.close()                                    # commits, releases the lock
    for rec in iter_records(path, from_seq=1):     # Record(seq, rtype, payload, segment, offset)
        ...
    verify(path)                                   # VerifyReport, changes nothing
    repair(path)                                   # RepairReport, truncates at corruption
    salvage(path, finish=...)                      # SalvageReport, keeps every good record

Modules: ``format`` (constants, segment header), ``frame`` (one record),
``segments`` (files), ``lock``, ``reader``, ``recovery`` (what open does),
``writer``, ``repair``, ``salvage``.
"""

from tiffany.wal.format import MAX_RECORD_BYTES, SEGMENT_SIZE_BYTES
from tiffany.wal.log import Log, LogReader, Source, spans_of
from tiffany.wal.reader import Position, Record, Span, TornTail, iter_records, iter_spans
from tiffany.wal.recovery import Recovery
from tiffany.wal.repair import RepairReport, VerifyReport, repair, verify
from tiffany.wal.salvage import Loss, SalvageReport, salvage
from tiffany.wal.writer import CommitListener, FsyncPolicy, Wal

__all__ = [
    "MAX_RECORD_BYTES",
    "SEGMENT_SIZE_BYTES",
    "CommitListener",
    "FsyncPolicy",
    "Log",
    "LogReader",
    "Loss",
    "Position",
    "Record",
    "Recovery",
    "RepairReport",
    "SalvageReport",
    "Source",
    "Span",
    "TornTail",
    "VerifyReport",
    "Wal",
    "iter_records",
    "iter_spans",
    "repair",
    "salvage",
    "spans_of",
    "verify",
]
