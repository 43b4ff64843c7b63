"""The activity relay's sources: what fills its ring, followed until the API stops.

The relay (``relay.py``) fans events out to websockets from its ring; a
source fills it. This module says what the relay asks of a source
(:class:`Source`; the API knows it as the port
:class:`tiffany.ports.feed.FeedSource`) and holds the engines' sockets,
:class:`SocketFeed`: each engine serves its feed on a Unix socket
(:func:`tiffany.feed.transport.follow_lines`). The other source is
PostgreSQL's ``NOTIFY tiffany_feed`` (:class:`tiffany.feed.pg.PgFeed`),
which engines on any host publish to. Each frame goes to the relay
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
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final, Protocol

import structlog
import tenacity

from tiffany.feed.transport import (
    FeedClosed,
    FrameHead,
    Lines,
    Reconnects,
    feed_head,
    follow,
    follow_lines,
)

__all__ = [
    "STUCK_RESUMES",
    "Follow",
    "FollowLines",
    "Sink",
    "SocketFeed",
    "Source",
    "Upstream",
]

log = structlog.get_logger(__name__)

#: Resumes cut off without one new event before the relay takes the live feed.
STUCK_RESUMES: Final = 2

#: The feed client's shape (:func:`~tiffany.feed.transport.follow_lines`).
FollowLines = Callable[..., AsyncIterator[Lines]]
#: The catch-up client's shape (:func:`~tiffany.feed.transport.follow`).
Follow = Callable[..., AsyncIterator[dict[str, Any]]]


class Sink(Protocol):
    """Where a source's frames go (the relay)."""

    def accept(self, head: FrameHead, text: str, up: Upstream | None = None) -> None:
        """Take one frame of engine ``up``'s feed."""

    def mark_gap(self, oldest: Any, reason: str) -> None:
        """Events were lost here (``gone`` to the subscribers)."""

    def lost(self, reason: str) -> None:
        """A feed failed for good: the subscribers are told ``reason``."""


class Source(Protocol):
    """What the relay asks of the engines' feeds, wherever they come from.

    The API knows this as the port :class:`tiffany.ports.feed.FeedSource`,
    which picks the implementation once, at start: :class:`SocketFeed` or
    :class:`tiffany.feed.pg.PgFeed`.

    Attributes:
        upstreams: One :class:`Upstream` an engine followed (engine 0 first).
        merged: Several engines' feeds merged: the relay re-keys each event
            (see :class:`Upstream`) and a resume older than its ring is
            ``gone`` (no one engine can replay the relay's keys).
    """

    upstreams: list[Upstream]

    @property
    def merged(self) -> bool:
        """Whether the relay re-keys events (several feeds, or engines learnt as they speak)."""

    @property
    def connected(self) -> bool | None:
        """Whether every engine's feed answered lately (None: one not tried yet)."""

    @property
    def failed(self) -> str | None:
        """Why following stopped for good (a failure reconnecting cannot mend), or None."""

    @property
    def upstream_cutoffs(self) -> int:
        """Times an engine cut the relay's feed off for falling behind."""

    async def run(self, sink: Sink) -> None:
        """Follow the feeds into ``sink`` until cancelled (reconnecting on its own)."""

    def replay(self, since: int) -> AsyncIterator[dict[str, Any]]:
        """The one engine's events after ``since``, as it still holds them (not merged only)."""

    async def head(self) -> int:
        """The one engine's last seq (not merged only; OSError or EOFError if unreachable)."""


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

    def __init__(self, engine: int, path: Path | None = None) -> None:
        self.engine = engine
        #: The engine's feed socket (None: its feed comes through the database).
        self.path = path
        #: The engine's own seq of its last event taken (the resume point).
        self.last_seq: int | None = None
        self.received = 0
        #: Resumes in a row cut off without one new event.
        self.stuck = 0
        #: Whether the engine's feed answered lately (None: not tried yet).
        self.connected: bool | None = None


class SocketFeed:
    """The engines' feed sockets, one connection an engine (module docstring).

    Args:
        paths: Each engine's feed socket, engine 0 first.
        lines_fn: The live feed client (:func:`tiffany.feed.transport.follow_lines`).
        follow_fn: The catch-up client (:func:`tiffany.feed.transport.follow`).
        head_fn: Asks a feed for its last seq (:func:`tiffany.feed.transport.feed_head`).
    """

    def __init__(
        self,
        paths: list[Path],
        *,
        lines_fn: FollowLines = follow_lines,
        follow_fn: Follow = follow,
        head_fn: Callable[[Path], Awaitable[int]] = feed_head,
    ) -> None:
        #: One upstream a feed: an engine's (``serve --engines N``: one an engine).
        self.upstreams = [Upstream(i, p) for i, p in enumerate(paths)]
        self.paths = list(paths)
        self._lines = lines_fn
        self._follow = follow_fn
        self._head = head_fn
        self.upstream_cutoffs = 0
        #: Why the relay stopped following (a failure reconnecting cannot mend), or None.
        self.failed: str | None = None

    @property
    def merged(self) -> bool:
        """Several engines' feeds (``serve --engines N``): each event re-keyed."""
        return len(self.upstreams) > 1

    @property
    def connected(self) -> bool | None:
        """Whether every engine's feed answered lately (None: one not tried yet)."""
        states = [up.connected for up in self.upstreams]
        if False in states:
            return False
        return None if None in states else True

    def replay(self, since: int) -> AsyncIterator[dict[str, Any]]:
        """Engine 0's events after ``since``, one connection, no reconnect (a catch-up)."""
        return self._follow(self.paths[0], since=since, reconnect=False)

    async def head(self) -> int:
        """Engine 0's last seq (a ``head`` question to its feed)."""
        return await self._head(self.paths[0])

    async def run(self, sink: Sink) -> None:
        """Follow every engine's feed (one task each); stop them all together."""
        if len(self.upstreams) == 1:
            await self._run(self.upstreams[0], sink)
            return
        tasks = [asyncio.create_task(self._run(up, sink)) for up in self.upstreams]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, up: Upstream, sink: Sink) -> None:
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
                    await self._follow_once(up, sink, policy, attempt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported, then the relay stops
            up.connected = False
            self.failed = f"{type(exc).__name__}: {exc}"[:500]
            log.error("feed relay stopped: the engine's feed failed", error=self.failed)
            sink.lost("the API lost the engine's feed: reload state over HTTP")

    async def _follow_once(
        self, up: Upstream, sink: Sink, policy: Reconnects, attempt: tenacity.AttemptManager
    ) -> None:
        """One connection to an engine's feed, until it ends (always raises FeedClosed)."""
        since = up.last_seq
        if up.stuck >= STUCK_RESUMES and since is not None:
            log.warning("feed relay gives up resuming; taking the live feed", last_seq=since)
            reason = "the API fell behind the engine's feed: reload state over HTTP"
            sink.mark_gap(None, reason)
            since, up.stuck = None, 0
        before = up.received
        cut = False
        async for batch in self._lines(self.paths[up.engine], since=since):
            policy.progressed(attempt)
            for head, text in batch:
                if head.type == "cutoff":
                    self.upstream_cutoffs += 1
                    log.warning("the engine cut the API's feed off", last_seq=up.last_seq)
                    cut = True
                    break
                sink.accept(head, text, up)
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
