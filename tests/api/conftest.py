"""Fixtures for the API tests: real engines, a real uvicorn, real sockets.

* ``api_dir``: a short data dir under /tmp (Unix socket paths are limited
  to 107 bytes, and pytest's tmp paths can be longer);
* ``engine``: a real engine process (``tiffany engine``) on its own data
  dir, shared by the tests of a module;
* ``hand_feed``: a real PAL hub and feed server (``tiffany.feed``) in this
  process, published to by hand: the engine's side of the feed, without the
  engine;
* ``live_api_factory``: the app under a real uvicorn server in a thread
  (real TCP, real websockets with real backpressure);
* ``served``: ``tiffany serve`` as users run it (a subprocess on a short
  data dir): ``(data_dir, base_url)``.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from api_support import (  # noqa: E402
    EngineProcess,
    HandFeed,
    LiveApi,
    serve,
    serve_in_thread,
    short_dir,
    start_engine,
)

from tiffany.config import Settings  # noqa: E402
from tiffany.feed import Hub  # noqa: E402
from tiffany.feed.transport import FeedServer  # noqa: E402


@pytest.fixture
def api_dir() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    """A real engine process shared by a module's tests (its own data dir)."""
    pytest.importorskip("tiffany.engine.service", reason="the engine service is not there yet")
    data_dir = short_dir("tfe-")
    proc = start_engine(data_dir)
    yield proc
    proc.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def hand_feed(api_dir: Path) -> Iterator[HandFeed]:
    hub = Hub(seq0=1_000)
    server = FeedServer(hub, api_dir / "feed.sock")
    server.start()
    feed = HandFeed(api_dir, hub, server)
    yield feed
    feed.server.stop()


@pytest.fixture
def live_api_factory() -> Iterator[Callable[[Settings], LiveApi]]:
    started: list[LiveApi] = []

    def start(settings: Settings, ws: str | None = None) -> LiveApi:
        live = serve_in_thread(settings, ws)
        started.append(live)
        return live

    yield start
    for live in started:
        live.stop()


@pytest.fixture
def served() -> Iterator[tuple[Path, str]]:
    from process_support import terminate

    data_dir = short_dir("tfs-")
    proc, url = serve(data_dir)
    try:
        yield data_dir, url
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)
