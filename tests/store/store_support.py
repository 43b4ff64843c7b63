"""Helpers of the store tests (a module of its own: ``conftest`` names collide across folders)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from tiffany.store import Base

Record = tuple[int, int, int, list[Any]]


@dataclass
class Journal:
    """A data dir whose WAL holds the test runs, and its records decoded."""

    data_dir: Path
    records: list[Record]
    run_ids: dict[str, str] = field(default_factory=dict)  # label -> run id

    @property
    def wal_dir(self) -> Path:
        return self.data_dir / "wal"


def dump(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Return every row of the store's tables, in primary key order."""
    out: dict[str, list[dict[str, Any]]] = {}
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            order = list(table.primary_key.columns)
            rows = conn.execute(select(table).order_by(*order)).mappings()
            out[table.name] = [dict(r) for r in rows]
    return out
