"""``Server-Timing``: where a request's time went, in the answer's headers.

A read with ``min_seq`` spends its time in two places the client cannot
tell apart: waiting for the projection to pass the seq, and reading the
store. Each HTTP answer carries a ``Server-Timing`` header (W3C Server
Timing; browsers show it in their network panel) with one entry per part
the request went through, in milliseconds::

    Server-Timing: projected;dur=3.1, queue;dur=0.2, store;dur=0.9, app;dur=4.6

- ``projected``: waiting for the store to pass ``min_seq``;
- ``store``: store reads (in a thread, or on the loop: ``tiffany.ports.reads``);
- ``queue``: the store reads' wait for a turn (``reads.STORE_READERS``) and a thread;
- ``app``: from the request's arrival in the app to its answer's head.

The parts are gathered in a context variable that :class:`Timings` (the
ASGI middleware) sets per request; :func:`timed` adds to it. A part met
several times is summed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HEADER", "Timings", "add", "timed"]

HEADER: Final = b"server-timing"

_PARTS: ContextVar[dict[str, float] | None] = ContextVar("tiffany_server_timing", default=None)


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    """Add the time spent in the block to part ``name`` of this request's timing."""
    started = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - started)


def add(name: str, seconds: float) -> None:
    """Add ``seconds`` to part ``name`` of this request's timing (no-op outside a request)."""
    parts = _PARTS.get()
    if parts is not None:
        parts[name] = parts.get(name, 0.0) + seconds


def _header(parts: dict[str, float], started: float) -> bytes:
    entries = [f"{name};dur={seconds * 1000:.2f}" for name, seconds in parts.items()]
    entries.append(f"app;dur={(time.perf_counter() - started) * 1000:.2f}")
    return ", ".join(entries).encode("ascii")


class Timings:
    """ASGI middleware: give each HTTP request its parts, answer them in ``Server-Timing``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request with a fresh set of parts; add the header to its answer."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        parts: dict[str, float] = {}
        token = _PARTS.set(parts)
        started = time.perf_counter()

        async def send_timing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.append((HEADER, _header(parts, started)))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_timing)
        finally:
            _PARTS.reset(token)
