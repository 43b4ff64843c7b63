"""Fixtures of the fault suite: served instances that always stop, and the harness on sys.path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_support import ServeFactory


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[ServeFactory]:
    """A :class:`ServeFactory` on a fresh data dir (every instance killed at teardown)."""
    factory = ServeFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()
