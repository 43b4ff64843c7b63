"""The engine's activity feed published through PostgreSQL (``TIFFANY_JOURNAL=postgres``).

On the PostgreSQL journal, API processes may run on other hosts than the
engines, where no feed socket reaches. Each engine therefore also publishes
its feed with ``NOTIFY tiffany_feed``: a thread subscribes to the hub like
any feed client and sends each batch it gets (the hub drains every 5 ms) as
one or more notifications. Each notification's payload is the engine's
number on the first line, then the frames as the hub encoded them, one per
line, kept under PostgreSQL's 8,000-byte payload limit. An event too large
for one notification is replaced by a small ``tool.output`` event saying so
(its run's journal and the store have the whole of it).

The API side is :class:`PgFeed`, the relay's source on this journal
(:class:`tiffany.ports.feed.FeedSource` picks it at start): one ``LISTEN``
follows every engine, on any host.
``bench/feed_transport.py`` measured LISTEN/NOTIFY against NATS core and
JetStream, and docs/engines.md says why we chose it.

Nothing here ever makes the loop wait. A notification costs the hub's
thread nothing (the subscription's queue is bounded, as every feed
client's is); a slow database makes this subscriber fall behind, and the
hub cuts it off. The thread then subscribes again from the live end, and
the relays mark the gap.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any, Final

import msgspec
import psycopg
import structlog

from tiffany.feed import Hub
from tiffany.feed.transport import Reconnects, frame_head
from tiffany.feed.upstream import Sink, Upstream
from tiffany.store.models import FEED_CHANNEL, channel
from tiffany.store.models import MAX_NOTIFY_BYTES as MAX_PAYLOAD_BYTES
from tiffany.wal.pg import conninfo

__all__ = ["FEED_CHANNEL", "MAX_PAYLOAD_BYTES", "NotifyFeed", "PgFeed", "split_payloads"]

log = structlog.get_logger(__name__)

#: How long the thread waits for frames before it looks at its stop flag, in seconds.
POLL_S: Final = 0.25


def split_payloads(engine: int, frames: list[bytes]) -> list[str]:
    """Return the notifications carrying ``frames`` (module docstring's format)."""
    head = f"{engine}\n"
    out: list[str] = []
    part: list[str] = []
    size = len(head)
    for frame in frames:
        text = frame.decode()
        if len(head) + len(frame) + 1 > MAX_PAYLOAD_BYTES:
            text = _too_large(frame)
        if part and size + len(text) + 1 > MAX_PAYLOAD_BYTES:
            out.append(head + "\n".join(part))
            part, size = [], len(head)
        part.append(text)
        size += len(text.encode()) + 1
    if part:
        out.append(head + "\n".join(part))
    return out


def _too_large(frame: bytes) -> str:
    doc: dict[str, Any] = msgspec.json.decode(frame)
    small = {k: doc.get(k) for k in ("v", "seq", "wal_seq", "engine", "ts", "run_id", "task_id")}
    small |= {
        "kind": "tool.output",
        "label": f"a {doc.get('kind')} event of {len(frame):,} bytes (too large for the feed)",
        "data": {},
    }
    return msgspec.json.encode(small).decode()


class NotifyFeed:
    """Publishes an engine's hub on ``tiffany_feed`` (module docstring).

    Args:
        hub: The engine's hub.
        url: The database (``TIFFANY_DATABASE_URL``).
        engine: The engine's number (the payloads' first line).
    """

    def __init__(self, hub: Hub, url: str, engine: int) -> None:
        self.hub = hub
        self.dsn = conninfo(url)
        self.channel = channel(FEED_CHANNEL, url)
        self.engine = engine
        self.sent = 0
        self.notifications = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start publishing (a thread of its own)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tiffany-pg-feed", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Publish what is queued, then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            sub = self.hub.subscribe()
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    self._pump(conn, sub)
            except psycopg.Error as exc:
                self.failures += 1
                log.warning("engine.pg_feed_failed", error=str(exc), retry_in_s=1.0)
                self._stop.wait(1.0)
            finally:
                sub.close()

    def _pump(self, conn: psycopg.Connection[Any], sub: Any) -> None:
        while True:
            stopping = self._stop.is_set()
            frames = sub.get(timeout=POLL_S)
            if frames:
                for payload in split_payloads(self.engine, frames):
                    conn.execute("SELECT pg_notify(%s, %s)", (self.channel, payload))
                    self.notifications += 1
                self.sent += len(frames)
            if sub.closed or (stopping and not frames):
                return


class PgFeed:
    """The relay's source on the PostgreSQL journal: ``LISTEN tiffany_feed`` (module docstring).

    Every engine's batches arrive on one connection, each engine learnt as
    it speaks, so the relay merges them (``merged``) and a resume older than
    its ring is ``gone``: no engine is asked to replay (:meth:`replay` and
    :meth:`head` are never called). What is published while this process is
    not listening is lost: after a reconnect the relay marks the gap.

    Args:
        dsn: A libpq connection string of the database.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        #: The engines heard from, by number (grows as new ones speak).
        self.upstreams: list[Upstream] = [Upstream(0)]
        self.upstream_cutoffs = 0  # the database never cuts a listener off
        self.failed: str | None = None  # reconnects forever
        self._up = False

    @property
    def merged(self) -> bool:
        """Always: engines on any host, learnt as they speak."""
        return True

    @property
    def connected(self) -> bool | None:
        """Whether the LISTEN connection is up."""
        return self._up

    def replay(self, since: int) -> AsyncIterator[dict[str, Any]]:
        """Never called (``merged``): the relay answers an old resume ``gone``."""
        raise NotImplementedError("the database's feed keeps no history to replay")

    async def head(self) -> int:
        """Never called (``merged``): the relay's own keys decide."""
        raise NotImplementedError("the database's feed has no head to ask")

    async def run(self, sink: Sink) -> None:
        """Follow every engine's feed through ``LISTEN tiffany_feed``, reconnecting forever.

        A notification is one engine's batch: its number on the first line,
        then its frames, one a line (:func:`split_payloads`).
        """
        listened = False

        def lost(exc: BaseException, _wait: float) -> None:
            if self._up:
                log.warning("feed relay lost the database's feed", error=str(exc))
            self._up = False

        policy = Reconnects(lost, transient=lambda exc: isinstance(exc, (psycopg.Error, OSError)))
        async for attempt in policy.attempts():
            with attempt:
                conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                async with conn:
                    await conn.execute(f'LISTEN "{channel(FEED_CHANNEL, self.dsn)}"')
                    if listened:
                        reason = "the API's feed from the database dropped: reload state over HTTP"
                        sink.mark_gap(None, reason)
                    listened, self._up = True, True
                    policy.progressed(attempt)
                    async for note in conn.notifies():
                        self._take(note.payload, sink)
                raise OSError("the database closed the feed's connection")

    def _take(self, payload: str, sink: Sink) -> None:
        number, _, body = payload.partition("\n")
        if not number.isdigit() or not body:
            return
        engine = int(number)
        while len(self.upstreams) <= engine:  # engines are learnt as they speak
            self.upstreams.append(Upstream(len(self.upstreams)))
        up = self.upstreams[engine]
        for line in body.split("\n"):
            sink.accept(frame_head(line), line, up)
