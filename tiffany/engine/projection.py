"""Bring the SQL store up to date with the WAL (off the scheduler thread).

The store is a projection of the journal: records are applied in batches,
idempotently by WAL sequence number, after they are durable. ``tiffany run``
projects once the loop has stopped; the service's projector process
(``projector_proc.py``) catches up with :func:`decoded_batches` the same way,
then applies the frames each group commit hands it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tiffany.records import decode_record
from tiffany.store import Projector, make_engine
from tiffany.store.migrate import upgrade
from tiffany.store.projector import Decoded
from tiffany.wal import iter_records

# decode_record (tiffany.records) is re-exported: the projector process uses it.

__all__ = ["BATCH_RECORDS", "decode_record", "decoded_batches", "project_wal"]

#: Records applied per transaction.
BATCH_RECORDS: Final = 5_000


def decoded_batches(
    wal_dir: Path, batch_records: int = BATCH_RECORDS, from_seq: int = 1
) -> Iterator[list[Decoded]]:
    """Yield the WAL's journal records as decoded ``(seq, rtype, run_no, record)`` batches."""
    batch: list[Decoded] = []
    for rec in iter_records(wal_dir, from_seq=from_seq):
        run_no, record = decode_record(rec.rtype, rec.payload)
        batch.append((rec.seq, rec.rtype, run_no, record))
        if len(batch) >= batch_records:
            yield batch
            batch = []
    if batch:
        yield batch


def project_wal(database_url: str, wal_dir: Path) -> int:
    """Apply the WAL's records the store has not seen yet; return the store's last seq."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        projector = Projector(engine)
        for batch in decoded_batches(wal_dir, from_seq=projector.last_seq + 1):
            projector.apply(batch)
        return projector.last_seq
    finally:
        engine.dispose()
