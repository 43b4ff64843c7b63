"""The activity relay's upstreams: the engines' feeds, followed until the API stops.

The relay (``feed.py``) fans events out to websockets from its ring; this
module fills it. Each engine serves its feed on a Unix socket
(:func:`tiffany.feed.transport.follow_lines`); on the PostgreSQL journal the
engines, on any host, publish it through ``NOTIFY tiffany_feed`` instead,
and one ``LISTEN`` follows them all. Each frame goes to the relay
(:class:`Sink`): ``accept`` for a frame, ``mark_gap`` where events were
lost (an engine restarted, a resume that could not be served, the
database's connection dropped), ``lost`` when a feed fails in a way no
reconnect mends.

Invariants: one connection an engine at a time; after a disconnect the
resume asks for the events after the last one taken (``since``), so the
relay's ring stays gapless while the engine still holds them; a resume
that makes no progress :data:`STUCK_RESUMES` times in a row gives up and
takes the live feed, marking the gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final, Protocol

import structlog
import tenacity

from tiffany.feed.transport import (
    MAX_RECONNECT_DELAY_S,
    RECONNECT_DELAY_S,
    FeedClosed,
    FrameHead,
    Lines,
    Reconnects,
    follow_lines,
    frame_head,
)

__all__ = ["STUCK_RESUMES", "FollowLines", "Sink", "Upstream", "Upstreams"]

log = structlog.get_logger(__name__)

#: Resumes cut off without one new event before the relay takes the live feed.
STUCK_RESUMES: Final = 2

#: The feed client's shape (:func:`~tiffany.feed.transport.follow_lines`).
FollowLines = Callable[..., AsyncIterator[Lines]]


class Sink(Protocol):
    """Where the upstreams' frames go (the relay)."""

    def accept(self, head: FrameHead, text: str, up: Upstream | None = None) -> None:
        """Take one frame of engine ``up``'s feed."""

    def mark_gap(self, oldest: Any, reason: str) -> None:
        """Events were lost here (``gone`` to the subscribers)."""

    def lost(self, reason: str) -> None:
        """A feed failed for good: the subscribers are told ``reason``."""


class Upstream:
    """One engine's feed as the relay follows it.

    Discussion: each engine numbers its events itself (``tiffany/feed/hub.py``):
    with several engines the relay merges the feeds in the order events
    arrive and gives each the key ``max(last key + 1, its engine's seq)``, so
    ``seq`` strictly increases on every websocket, per run and overall, and
    a resume within the relay's ring is gapless. The keys are this API
    process's: a resume older than its ring (or from another API replica)
    gets ``gone`` and reloads over HTTP, where a single engine's feed is
    caught up from the engine. Rejected: a cursor of one seq per engine in
    ``since`` (every client would carry a vector for a rare case).
    """

    __slots__ = ("connected", "engine", "last_seq", "path", "received", "stuck")

    def __init__(self, engine: int, path: Path) -> None:
        self.engine = engine
        self.path = path
        #: The engine's own seq of its last event taken (the resume point).
        self.last_seq: int | None = None
        self.received = 0
        #: Resumes in a row cut off without one new event.
        self.stuck = 0
        #: Whether the engine's feed answered lately (None: not tried yet).
        self.connected: bool | None = None


class Upstreams:
    """The engines' feeds a relay follows (module docstring).

    Args:
        paths: Each engine's feed socket, engine 0 first.
        sink: Where the frames go.
        lines_fn: The feed client (:func:`tiffany.feed.transport.follow_lines`).
        notify_dsn: Follow ``NOTIFY tiffany_feed`` of this database instead
            of the sockets (the PostgreSQL journal: engines on any host).
    """

    def __init__(
        self,
        paths: list[Path],
        sink: Sink,
        *,
        lines_fn: FollowLines = follow_lines,
        notify_dsn: str | None = None,
    ) -> None:
        #: One upstream a feed: an engine's (``serve --engines N``: one an engine).
        self.upstreams = [Upstream(i, p) for i, p in enumerate(paths)]
        self.path = paths[0]
        self.notify_dsn = notify_dsn
        #: Several feeds merged, each event re-keyed (see :class:`Upstream`).
        self.merged = len(paths) > 1 or notify_dsn is not None
        self._sink = sink
        self._lines = lines_fn
        self._notify_up = False
        self.upstream_cutoffs = 0
        #: Why the relay stopped following (a failure reconnecting cannot mend), or None.
        self.failed: str | None = None

    @property
    def connected(self) -> bool | None:
        """Whether every engine's feed answered lately (None: one not tried yet)."""
        if self.notify_dsn is not None:
            return self._notify_up
        states = [up.connected for up in self.upstreams]
        if False in states:
            return False
        return None if None in states else True

    async def run(self) -> None:
        """Follow every engine's feed (one task each); stop them all together."""
        if self.notify_dsn is not None:
            await self._run_notify(self.notify_dsn)
            return
        if len(self.upstreams) == 1:
            await self._run(self.upstreams[0])
            return
        tasks = [asyncio.create_task(self._run(up)) for up in self.upstreams]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, up: Upstream) -> None:
        """Follow one engine's feed forever, resuming after every disconnect.

        Discussion: the reconnects are done here rather than by ``follow``
        so that a resume that makes no progress can be abandoned. The hub
        replays a resume's backlog into a queue of the same bound as live
        lag, so once this relay is cut off more than a queue behind, every
        resume from the same point is cut off again at once. After
        :data:`STUCK_RESUMES` such resumes the relay takes the live feed
        instead and marks the gap (``gone``) for its websockets.

        The reconnects themselves are tenacity's
        (:class:`~tiffany.feed.transport.Reconnects`): the end of the stream,
        a refused or reset connection and a missing socket are retried with
        backoff (at once after a cutoff). Anything else (a frame that is not
        JSON, a permission error) would fail the same way on every resume:
        the relay reports it, cuts its websockets off and stops, instead of
        resuming into the same failure forever.
        """
        policy = Reconnects(on_retry=lambda exc, wait_s: self._unreachable(up, exc, wait_s))
        try:
            async for attempt in policy.attempts():
                with attempt:
                    await self._follow_once(up, policy, attempt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported, then the relay stops
            up.connected = False
            self.failed = f"{type(exc).__name__}: {exc}"[:500]
            log.error("feed relay stopped: the engine's feed failed", error=self.failed)
            self._sink.lost("the API lost the engine's feed: reload state over HTTP")

    async def _run_notify(self, dsn: str) -> None:
        """Follow every engine's feed through ``LISTEN tiffany_feed``, reconnecting forever.

        A notification is one engine's batch: its number on the first line,
        then its frames, one a line (``tiffany/feed/pg.py``). What is
        published while this process is not listening is lost: after a
        reconnect the relay marks the gap (``gone``: reload over HTTP).
        """
        import psycopg

        from tiffany.store.models import FEED_CHANNEL, channel

        delay, listened = RECONNECT_DELAY_S, False
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                async with conn:
                    await conn.execute(f'LISTEN "{channel(FEED_CHANNEL, dsn)}"')
                    if listened:
                        reason = "the API's feed from the database dropped: reload state over HTTP"
                        self._sink.mark_gap(None, reason)
                    listened, self._notify_up, delay = True, True, RECONNECT_DELAY_S
                    async for note in conn.notifies():
                        self._take_notification(note.payload)
            except (psycopg.Error, OSError) as exc:
                if self._notify_up:
                    log.warning("feed relay lost the database's feed", error=str(exc))
                self._notify_up = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RECONNECT_DELAY_S)

    def _take_notification(self, payload: str) -> None:
        number, _, body = payload.partition("\n")
        if not number.isdigit() or not body:
            return
        engine = int(number)
        while len(self.upstreams) <= engine:  # engines are learnt as they speak
            self.upstreams.append(Upstream(len(self.upstreams), self.path))
        up = self.upstreams[engine]
        for line in body.split("\n"):
            self._sink.accept(frame_head(line), line, up)

    async def _follow_once(
        self, up: Upstream, policy: Reconnects, attempt: tenacity.AttemptManager
    ) -> None:
        """One connection to an engine's feed, until it ends (always raises FeedClosed)."""
        since = up.last_seq
        if up.stuck >= STUCK_RESUMES and since is not None:
            log.warning("feed relay gives up resuming; taking the live feed", last_seq=since)
            reason = "the API fell behind the engine's feed: reload state over HTTP"
            self._sink.mark_gap(None, reason)
            since, up.stuck = None, 0
        before = up.received
        cut = False
        async for batch in self._lines(up.path, since=since):
            policy.progressed(attempt)
            for head, text in batch:
                if head.type == "cutoff":
                    self.upstream_cutoffs += 1
                    log.warning("the engine cut the API's feed off", last_seq=up.last_seq)
                    cut = True
                    break
                self._sink.accept(head, text, up)
            if cut:
                break
        up.stuck = up.stuck + 1 if cut and up.received == before else 0
        if cut:
            policy.at_once()
        raise FeedClosed("the engine's feed ended")

    def _unreachable(self, up: Upstream, exc: BaseException, wait_s: float) -> None:
        """Before a reconnect: note an engine that cannot be reached (not a mere end)."""
        if isinstance(exc, FeedClosed):
            return
        if up.connected is not False:
            log.warning(
                "feed relay cannot reach the engine's feed",
                error=str(exc),
                retry_in_s=wait_s,
                engine=up.engine,
            )
        up.connected = False
