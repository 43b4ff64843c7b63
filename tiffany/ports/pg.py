"""The ports' asyncio connections to PostgreSQL: a listener and a pool.

:class:`Listener`: one connection that LISTENs on some channels,
reconnecting until closed. The API learns two things from the database's
notifications: the answers to requests that went through it (the
PostgreSQL journal's commands) and the moves of the store's mark
(``tiffany_projected``: a projector's batch notifies its new mark in the
statement that writes it, ``tiffany/projector/pgflush.py``), which wake the
reads that wait with ``min_seq`` (:class:`tiffany.ports.watermark.PgWatermark`).

Notifications sent while the connection is down are lost: ``on_connect``
runs after each (re)connect so that the caller re-reads what it may have
missed. A handler's failure is logged and the connection goes on.

:class:`AsyncPool`: connections for statements run on the event loop (the
database requests, and the reads of a run on a PostgreSQL store:
:class:`tiffany.ports.reads.PgReads`). A statement on the loop waits for its
socket in the loop's own poll; a read in the thread pool pays a thread hop
and GIL hand-offs to and from a busy loop, up to a switch interval each
(bench/README.md has the figures).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import psycopg
import structlog

from tiffany.store.models import channel

__all__ = ["AsyncPool", "Listener", "projected_mark"]

log = structlog.get_logger(__name__)

#: The first wait before a reconnect, in seconds (doubled up to :data:`MAX_RECONNECT_S`).
RECONNECT_S: Final = 0.1
MAX_RECONNECT_S: Final = 5.0

_IDLE: Final = psycopg.pq.TransactionStatus.IDLE


def projected_mark(payload: str) -> tuple[int, int] | None:
    """``(engine, last seq)`` of a ``tiffany_projected`` payload (``"<engine> <seq>"``), or None."""
    engine, _, seq = payload.partition(" ")
    if engine.isdigit() and seq.isdigit():
        return int(engine), int(seq)
    return None


class Listener:
    """LISTEN on ``channels`` (channel -> handler of the payload) on one connection.

    Args:
        dsn: A libpq connection string.
        channels: Each channel's handler, called on the event loop; by its
            bare name, which becomes the name of the ``dsn``'s schema
            (:func:`tiffany.store.models.channel`).
        name: The task's name (and the log's).
        on_connect: Called after each (re)connect, once the LISTENs are in place.
    """

    def __init__(
        self,
        dsn: str,
        channels: Mapping[str, Callable[[str], None]],
        name: str,
        on_connect: Callable[[], None] | None = None,
    ) -> None:
        self.dsn = dsn
        self.channels = {channel(name, dsn): handler for name, handler in channels.items()}
        self.name = name
        self.on_connect = on_connect
        #: Whether the connection is up (notifications arrive).
        self.listening = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start listening (in the running loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def close(self) -> None:
        """Stop listening."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _deliver(self, name: str, payload: str) -> None:
        handler = self.channels.get(name)
        if handler is None:
            return
        try:
            handler(payload)
        except Exception as exc:  # noqa: BLE001 - one bad notification, not the connection
            log.error("api.notification_failed", name=self.name, error=repr(exc))

    async def _run(self) -> None:
        from tiffany.feed.transport import Reconnects

        def lost(exc: BaseException, _wait: float) -> None:
            if self.listening:
                log.warning("api.notifications_lost", name=self.name, error=str(exc))
            self.listening = False

        policy = Reconnects(
            lost,
            first_s=RECONNECT_S,
            max_s=MAX_RECONNECT_S,
            transient=lambda exc: isinstance(exc, (psycopg.Error, OSError, ValueError)),
        )
        async for attempt in policy.attempts():
            with attempt:
                conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                async with conn:
                    for name in self.channels:
                        await conn.execute(f'LISTEN "{name}"')
                    self.listening = True
                    policy.progressed(attempt)
                    if self.on_connect is not None:
                        self.on_connect()
                    async for note in conn.notifies():
                        self._deliver(note.channel, note.payload)
                raise OSError("the database closed the notifications' connection")


class AsyncPool:
    """At most ``size`` autocommit connections to ``dsn``, opened on demand and reused.

    Not psycopg_pool's ``AsyncConnectionPool``: without a check at checkout
    (a round trip each read) it hands out connections the server dropped
    while they were idle, one after another; this pool's caller retries once
    on a fresh connection, and a broken one is never put back.

    A connection comes back to the pool only if it is still open and idle:
    one that broke, or that a cancelled statement left mid-way, is closed,
    and the next caller opens a fresh one. Errors are psycopg's, for the
    caller to map (a connect failure is an ``OperationalError`` too).

    Args:
        dsn: A libpq connection string.
        size: The most connections open at once; callers beyond wait their turn.
        application_name: How the connections show in ``pg_stat_activity``
            (unless ``dsn`` names one).
        configure: Awaited on each new connection (say, its JSON loader).
    """

    def __init__(
        self,
        dsn: str,
        size: int,
        *,
        application_name: str | None = None,
        configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.dsn = dsn
        self.size = size
        self.application_name = application_name
        self.configure = configure
        self._idle: asyncio.Queue[psycopg.AsyncConnection[Any]] | None = None
        self._opened = 0

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of the pool for the ``async with`` block."""
        if self._idle is None:
            self._idle = asyncio.Queue()
        idle = self._idle
        if idle.empty() and self._opened < self.size:
            self._opened += 1
            try:
                conn = await self._open()
            except BaseException:
                self._opened -= 1
                raise
        else:
            conn = await idle.get()
        ok = False
        try:
            yield conn
            ok = True
        finally:
            if not conn.closed and (ok or conn.info.transaction_status == _IDLE):
                idle.put_nowait(conn)
            else:  # broken, or left mid-statement (cancelled): never reused
                self._opened -= 1
                with contextlib.suppress(psycopg.Error):
                    await conn.close()

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        kwargs: dict[str, Any] = {"autocommit": True}
        if self.application_name is not None and "application_name" not in self.dsn:
            kwargs["application_name"] = self.application_name
        conn = await psycopg.AsyncConnection.connect(self.dsn, **kwargs)
        if self.configure is not None:
            try:
                await self.configure(conn)
            except BaseException:
                await conn.close()
                raise
        return conn

    async def close(self) -> None:
        """Close the idle connections (those in use close as they come back)."""
        idle = self._idle
        while idle is not None and not idle.empty():
            conn = idle.get_nowait()
            self._opened -= 1
            with contextlib.suppress(psycopg.Error):
                await conn.close()
