"""``run_api(settings)``: serve the app with uvicorn in this process.

What ``tiffany serve`` starts as its API child (``tiffany api`` or
``python -m tiffany.api``). Logging is ours (``log_config=None``: uvicorn's
loggers go through :func:`tiffany.log.configure_logging`'s renderer).
SIGINT and SIGTERM stop it gracefully: no new connections, websockets are
closed, the store is disposed of, and the process exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import structlog
import uvicorn

from tiffany.api.app import create_app
from tiffany.api.connections import (
    ConnectionLimits,
    effective_max_connections,
    guarded_protocol,
)
from tiffany.config import Settings
from tiffany.feed.wsdirect import DirectWebSocketProtocol
from tiffany.log import configure_logging

__all__ = ["run_api"]

log = structlog.get_logger("tiffany.api")

#: How long open connections (websockets) get to finish at shutdown, in seconds.
GRACEFUL_SHUTDOWN_S: Final = 5


class _Server(uvicorn.Server):
    """A uvicorn server that reports its address once it listens."""

    def __init__(self, config: uvicorn.Config, ready_file: Path | None) -> None:
        super().__init__(config)
        self.ready_file = ready_file
        self.url: str | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit or not self.servers:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}/"
        log.info("api.listening", url=self.url)
        if self.ready_file is not None:
            tmp = self.ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": self.url, "pid": os.getpid()}))
            tmp.replace(self.ready_file)


#: How long the API waits for the files of ``after`` (the engines' ready files), in seconds.
AFTER_TIMEOUT_S: Final = 60.0


def _wait_for(
    paths: Sequence[Path], stopped: Callable[[], bool], timeout: float = AFTER_TIMEOUT_S
) -> bool:
    """Until every path exists: True; False if ``stopped()`` first (SIGTERM) or at the deadline."""
    deadline = time.monotonic() + timeout
    while not stopped():
        if all(path.exists() for path in paths):
            return True
        if time.monotonic() > deadline:
            missing = [str(path) for path in paths if not path.exists()]
            log.error("api.not_started", waited_s=timeout, missing=missing)
            return False
        time.sleep(0.02)
    return False


#: Websocket protocol ping interval and timeout, in seconds.
WS_PING_INTERVAL_S: Final = 20.0
#: How long an idle keep-alive connection stays open, in seconds: longer
#: than the clients' own idle expiry (httpx, and so the SDK: 5 s, which is
#: uvicorn's default too). With both at 5 s a client can reuse a connection
#: the moment the server closes it, and a POST sent on it fails with a
#: reset, accepted or not (the fault suite's 10,000 submissions met it once
#: under two test processes). The client's pool now lets it go first.
KEEP_ALIVE_S: Final = 15


def uvicorn_config(settings: Settings, app: Any) -> uvicorn.Config:
    """Return the uvicorn configuration the API runs with."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,  # RequestLog writes one line per request instead
        lifespan="on",
        # uvloop and httptools (dependencies): uvicorn's fastest loop and parser;
        # "auto" falls back to asyncio where uvloop cannot be installed. The
        # HTTP protocol is httptools' with header and body deadlines and a
        # connection cap (tiffany.api.connections: slow clients).
        loop="auto",
        http=guarded_protocol(
            ConnectionLimits(
                header_timeout_s=settings.http_header_timeout_s,
                body_timeout_s=settings.http_body_timeout_s,
                max_connections=effective_max_connections(settings.http_max_connections),
            )
        ),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        # Protocol pings besides the feed's own JSON pings: a peer that stops
        # reading stops answering them too, and is then disconnected.
        ws_ping_interval=WS_PING_INTERVAL_S,
        ws_ping_timeout=WS_PING_INTERVAL_S,
        proxy_headers=False,
        # The activity feed frames each message once for all its subscribers
        # (tiffany.feed.wsdirect); compressing it once per subscriber was the
        # fan-out's cost.
        ws=DirectWebSocketProtocol,
        ws_per_message_deflate=False,
    )


def run_api(
    settings: Settings,
    *,
    ready_file: Path | None = None,
    after: Sequence[Path] = (),
    fds: Sequence[int] = (),
) -> int:
    """Serve the API on ``settings.host:settings.port`` until SIGINT/SIGTERM; the exit code.

    Args:
        settings: The process settings.
        fds: Bound sockets to listen on instead of ``host:port`` (``serve``
            binds them once and hands them to every API process it starts,
            so a restarted API keeps the address, ``--port 0`` too).
        ready_file: Once listening, ``{"url": "http://HOST:PORT/", "pid": ...}``
            is written here (atomically; port 0 becomes the bound port).
        after: Files to wait for before the app is made and the port bound
            (``serve`` passes its engines' ready files). The process imports
            its modules meanwhile, most of its start-up CPU, which then overlaps
            the engines' start, and no client sees an API whose engine is
            not up yet. 1 if they are not there within ``AFTER_TIMEOUT_S``.
    """
    configure_logging(settings)
    # uvicorn installs its own handlers while it serves, and re-raises the
    # signal it caught once it has shut down. Ours (in place before and after)
    # make a signal that arrives during start-up stop the server too, and the
    # re-raised one a no-op, so the process exits 0.
    stopping: list[_Server] = []
    asked = False

    def stop(_sig: int, _frame: Any) -> None:
        nonlocal asked
        asked = True
        for server in stopping:
            server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if after:  # said once its handlers are in place: a SIGTERM from here on stops it
            log.info("api.waiting_for_engines", files=[str(path) for path in after])
        if after and not _wait_for(after, lambda: asked):
            return 0 if asked else 1
        server = _Server(uvicorn_config(settings, create_app(settings)), ready_file)
        server.should_exit = asked
        stopping.append(server)
        # uvicorn listens on them itself (create_server, its backlog) and closes them at its stop.
        server.run(sockets=[socket.socket(fileno=fd) for fd in fds] or None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)
    return 0
