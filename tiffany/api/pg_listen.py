"""One PostgreSQL connection that LISTENs on some channels, reconnecting until closed.

The API learns two things from the database's notifications: the answers
to requests that went through it (``db_requests.py``, the PostgreSQL
journal) and the moves of the store's mark (``tiffany_projected``: a
projector's batch notifies its new mark in the statement that writes it,
``tiffany/store/pgflush.py``), which wake the reads that wait with
``min_seq``.

Notifications sent while the connection is down are lost: ``on_connect``
runs after each (re)connect so that the caller re-reads what it may have
missed. A handler's failure is logged and the connection goes on.

Discussion: with a PostgreSQL store under the file journal, the engine
also tells the API where the store is (``Watermark``: the projector
reports to its engine, which answers the API's ``wait_projected``). The
notification comes straight from the database at the projector's commit,
with no process in between: at 200 reads/s on two cores the slowest
reads waited 6.5-17 ms for the projection with it, against 21-33 ms
through the engine alone (bench/README.md). Both paths stay: the engine's
covers a store that does not notify, and the notification a busy engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Final

import psycopg
import structlog

__all__ = ["Listener", "projected_mark"]

log = structlog.get_logger(__name__)

#: The first wait before a reconnect, in seconds (doubled up to :data:`MAX_RECONNECT_S`).
RECONNECT_S: Final = 0.1
MAX_RECONNECT_S: Final = 5.0


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
        channels: Each channel's handler, called on the event loop.
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
        self.channels = dict(channels)
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

    def _deliver(self, channel: str, payload: str) -> None:
        handler = self.channels.get(channel)
        if handler is None:
            return
        try:
            handler(payload)
        except Exception as exc:  # noqa: BLE001 - one bad notification, not the connection
            log.error("api.notification_failed", name=self.name, error=repr(exc))

    async def _run(self) -> None:
        delay = RECONNECT_S
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                async with conn:
                    for channel in self.channels:
                        await conn.execute(f"LISTEN {channel}")
                    self.listening, delay = True, RECONNECT_S
                    if self.on_connect is not None:
                        self.on_connect()
                    async for note in conn.notifies():
                        self._deliver(note.channel, note.payload)
            except (psycopg.Error, OSError, ValueError) as exc:
                if self.listening:
                    log.warning("api.notifications_lost", name=self.name, error=str(exc))
                self.listening = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RECONNECT_S)
