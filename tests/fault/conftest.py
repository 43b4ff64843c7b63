"""Fixtures of the fault suite: served instances that always stop, and the harness on sys.path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_support import Served, tools_env


class ServeFactory:
    """Starts :class:`Served` instances on one data dir and closes every one at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data_dir = base / "data"
        self.effects_dir = base / "effects"
        self.effects_dir.mkdir(parents=True, exist_ok=True)
        self.env = tools_env(base)
        self.started: list[Served] = []

    def start(self) -> Served:
        served = Served(self.data_dir, self.env, log_path=self.base / "serve.log")
        self.started.append(served)
        return served

    def close(self) -> None:
        for served in self.started:
            served.close()


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[ServeFactory]:
    """A :class:`ServeFactory` on a fresh data dir (every instance killed at teardown)."""
    factory = ServeFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()
