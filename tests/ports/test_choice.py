"""Each port is chosen once, from the settings, when the API app is built.

``create_app`` picks the store's reads, the watermark and the feed source;
the requests that follow (store reads, a ``min_seq`` wait) use those same
objects and never choose again. Against the embedded store and the real
local PostgreSQL (a fresh schema), as the store and as the journal.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tiffany.api import app as app_module
from tiffany.api.app import create_app
from tiffany.config import Settings
from tiffany.feed.pg import PgFeed
from tiffany.feed.upstream import SocketFeed
from tiffany.ports.feed import FeedSource
from tiffany.ports.reads import PgReads, RunReads, SqliteReads
from tiffany.ports.watermark import PgWatermark, SocketWatermark, Watermark

CHOOSERS = ("feed_source", "reads_for", "watermark_for")


@pytest.fixture
def choices(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the calls of the app factory's port choosers (each still does its job)."""
    calls: Counter[str] = Counter()

    def counted(name: str, chooser: Callable[..., Any]) -> Callable[..., Any]:
        def choose(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return chooser(*args, **kwargs)

        return choose

    for name in CHOOSERS:
        monkeypatch.setattr(app_module, name, counted(name, getattr(app_module, name)))
    return calls


@pytest.fixture
def data_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tfc-", dir="/tmp")  # short: the sockets' paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_settings(data_dir: str, **overrides: Any) -> Settings:
    """Settings for ``data_dir`` and ``overrides``, blind to the caller's ``TIFFANY_*``."""
    with pytest.MonkeyPatch.context() as mp:
        for name in os.environ:
            if name.startswith("TIFFANY_"):
                mp.delenv(name)
        return Settings(data_dir=data_dir, **overrides)


def _served(settings: Any, ready: Callable[[Any], bool]) -> Iterator[tuple[TestClient, Any]]:
    with TestClient(create_app(settings)) as client:
        state = client.app.state.tiffany  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while not ready(state):
            assert time.monotonic() < deadline, "the ports did not start"
            time.sleep(0.02)
        yield client, state


def _exercise(client: TestClient, state: Any) -> tuple[object, object, object]:
    """Requests that use every port; return the ports held before them."""
    held = (state.reads, state.watermark, state.relay.source)
    runs = client.get("/api/runs")
    assert runs.status_code in (200, 503), runs.text  # 503: no store yet (no engine ran)
    behind = client.get("/api/runs", params={"min_seq": 10**6})  # no engine: it never gets there
    assert behind.status_code == 503, behind.text
    assert behind.json()["code"] == "store.behind"
    return held


def _check(state: Any, held: tuple[object, object, object], calls: Counter[str]) -> None:
    assert (state.reads, state.watermark, state.relay.source) == held  # the same objects
    assert isinstance(state.reads, RunReads)
    assert isinstance(state.watermark, Watermark)
    assert isinstance(state.relay.source, FeedSource)
    assert calls == dict.fromkeys(CHOOSERS, 1)


def test_the_embedded_transport_gets_the_socket_ports(data_dir: str, choices: Counter[str]) -> None:
    settings = make_settings(data_dir)
    for client, state in _served(settings, lambda _state: True):
        held = _exercise(client, state)
        assert type(state.reads) is SqliteReads
        assert type(state.watermark) is SocketWatermark
        assert type(state.relay.source) is SocketFeed
        assert not state.relay.merged  # one engine: its own keys, resumes it replays
        _check(state, held, choices)


def test_a_postgresql_store_gets_the_postgresql_reads_and_watermark(
    data_dir: str, pg_migrated_url: str, choices: Counter[str]
) -> None:
    settings = make_settings(data_dir, database_url=pg_migrated_url)
    for client, state in _served(settings, lambda s: s.watermark.listener.listening):
        held = _exercise(client, state)
        assert type(state.reads) is PgReads
        assert type(state.watermark) is PgWatermark
        assert not state.watermark.engines_anywhere  # the engines are this host's
        assert type(state.relay.source) is SocketFeed  # the file journal: the sockets' feed
        _check(state, held, choices)


def test_the_postgresql_journal_gets_every_postgresql_port(
    data_dir: str, pg_migrated_url: str, choices: Counter[str]
) -> None:
    settings = make_settings(data_dir, database_url=pg_migrated_url, journal="postgres")
    for client, state in _served(
        settings, lambda s: s.watermark.listener.listening and s.relay.connected
    ):
        held = _exercise(client, state)
        assert type(state.reads) is PgReads
        assert type(state.watermark) is PgWatermark
        assert state.watermark.engines_anywhere  # engines on any host, learnt as they speak
        assert type(state.relay.source) is PgFeed
        assert state.relay.merged
        _check(state, held, choices)
