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

The API side is :class:`tiffany.feed.relay.FeedRelay` (``notify_dsn``).
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
from typing import Any, Final

import msgspec
import psycopg
import structlog

from tiffany.feed import Hub
from tiffany.store.models import FEED_CHANNEL, channel
from tiffany.store.models import MAX_NOTIFY_BYTES as MAX_PAYLOAD_BYTES
from tiffany.wal.pg import conninfo

__all__ = ["FEED_CHANNEL", "MAX_PAYLOAD_BYTES", "NotifyFeed", "split_payloads"]

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
