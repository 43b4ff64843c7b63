"""Fixtures of the memory tests: a MemoryStore on a fresh SQLite file, its clock in hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tiffany.kernel.clock import ManualClock
from tiffany.memory import HashingEmbedder, MemoryStore
from tiffany.store.migrate import upgrade
from tiffany.store.session import make_engine


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    """A store on ``tmp_path``'s migrated SQLite file, the offline embedder, a manual clock."""
    engine = make_engine(f"sqlite:///{tmp_path / 'tiffany.db'}")
    upgrade(engine)
    s = MemoryStore(
        engine,
        embedder=HashingEmbedder(),
        clock=ManualClock(epoch=1_800_000_000.0, autojump=False),
    )
    yield s
    s.close()
    engine.dispose()
