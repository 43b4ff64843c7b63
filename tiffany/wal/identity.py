"""The WAL's identity: which journal this directory holds (``docs/wal-format.md``).

Seqs start at 1 in every WAL, so a seq alone does not say which journal it
is from: a store fed by one data dir's WAL, then pointed at from a new data
dir (a volume lost, a data dir deleted "to start fresh", two hosts sharing
one PostgreSQL store), would take the new WAL's records for ones it holds
already and skip them. The first writer to open a WAL directory writes a
random name into its ``JOURNAL`` file (``file:`` and 32 hex digits); the
store records the name of the journal it projects and refuses another
(:class:`tiffany.projector.apply.StoreJournalMismatch`).

The file is written once, atomically (a temporary file, fsynced, renamed,
the directory fsynced), under the directory's lock, and never changed: a
copy of the data dir is the same journal, as it should be.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Final

from tiffany.wal.format import JOURNAL_NAME
from tiffany.wal.segments import SyncFn, fsync_dir

__all__ = ["PREFIX", "ensure_identity", "identity"]

#: How a file WAL's name starts (a PostgreSQL stream's is ``postgres:<stream>``).
PREFIX: Final = "file:"


def identity(wal_dir: str | os.PathLike[str]) -> str | None:
    """The WAL's name (``file:<32 hex>``), or None for a WAL no writer of this version opened."""
    try:
        text = (Path(wal_dir) / JOURNAL_NAME).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    return text or None


def ensure_identity(wal_dir: Path, fsync: SyncFn | None) -> str:
    """Return the WAL's name, naming it first if it has none (call under the WAL's lock)."""
    held = identity(wal_dir)
    if held is not None:
        return held
    name = PREFIX + uuid.uuid4().hex
    tmp = wal_dir / (JOURNAL_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, name.encode("ascii") + b"\n")
        if fsync is not None:
            fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(wal_dir / JOURNAL_NAME)
    if fsync is not None:
        fsync_dir(wal_dir, fsync)
    return name
