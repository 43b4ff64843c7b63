"""The activity relay: one upstream feed connection, fanned out to websockets.

The engine serves its PAL feed on ``<data dir>/feed.sock``
(:class:`tiffany.feed.transport.FeedServer`). Each API process keeps exactly
one live subscription to it through its source (``upstream.py``: the
sockets, or PostgreSQL's ``NOTIFY``, ``pg.py``; the following, reconnects
and resumes are the source's) and fans the events out to its websockets
itself: the engine's hub thread shares the GIL with the scheduler loop, so it
must serve one subscriber per API process, not one per browser.

Design (a ring with cursors, in the manner of a disruptor or a Kafka
partition, rather than a queue per subscriber):

* the relay appends each event once to a fixed-size ring of
  ``(key, run_id, text)`` entries (:class:`tiffany.feed.ring.Ring`), each
  encoded to JSON text once;
* a subscriber is a cursor (a position in the ring). Publishing never
  touches a subscriber: an event costs the same with 1 or 1,000 websockets
  attached. When the relay wakes (:data:`FLUSH_S` after a trickle of events,
  at once after :data:`FLUSH_ENTRIES`), one pass writes each subscriber what
  it is due (:meth:`FeedRelay._push_all`): the message for a ring position
  and filter is framed once and the same bytes go to every subscriber at
  that position, straight to its transport (:mod:`tiffany.feed.wsdirect`),
  with no task switch or trip through ASGI per subscriber. A subscriber whose
  transport pushes back (its buffer above the high-water mark) is skipped,
  its cursor kept, until the transport drains; under a server without the
  direct writer, a sender task per websocket reads the ring from its cursor
  and sends through ASGI (:meth:`FeedSubscriber.next_frames`);
* backpressure: after every batch the relay checks the cursors; a subscriber
  more than ``queue_frames`` entries behind (or off the ring's tail) is cut
  off: its sender is stopped and it gets ``{"type": "cutoff", "last_seq":
  <last seq it was sent>}``; the others never wait for it, and memory is the
  ring's, whatever the number and speed of the websockets;
* budgets per subscriber: ``queue_frames`` entries and ``queue_bytes`` bytes
  of lag, and a send deadline (``send_timeout_s``): a socket that does not
  drain within it (a direct subscriber's transport that stays above its
  high-water mark, a sender's blocked send) is cut off the same way (checked by a timer, every
  :data:`DEADLINE_CHECK_S`), and its websocket handler ends even though the
  client neither reads nor closes. Each websocket's kernel send buffer is
  fixed (:func:`tiffany.feed.wsdirect.bound_send_buffer`), so a client that
  never reads blocks after some 200 KB instead of megabytes;
* a cap (``max_subscribers``): the route refuses one more with close code
  1013 (try again later), logged as a warning;
* fairness: the senders take turns at the loop (:meth:`FeedRelay.turn`), a
  slice of each pass of the loop, so the requests of the same process are
  served between them however many websockets there are;
* each event is encoded to JSON text once; what is left per subscriber is
  the websocket framing (and, in batch mode, joining the texts), which ASGI
  does per message.

Resumes (``since``): a seq the ring still covers is served from the ring.
An older one (the API restarted, or the client was away long) is served by a
catch-up connection to the engine (the source's ``replay(since)``) until that stream
meets the ring, then from the ring; if the engine no longer holds it either,
the client gets ``{"type": "gone"}`` and should reload state over HTTP.

Engine restarts: ``follow`` reconnects with the last seq; a new engine has a
new ring and answers ``gone``. The relay stores that ``gone`` in its ring
between the old and the new seqs (with a key halfway), so live subscribers
receive it in order and a later resume across it receives it too.

Seqs are strictly increasing but not consecutive (schema v2: they jump at
each new WAL record), so the ring covers a resume point ``since`` when
``since`` is at least the key of the last entry it dropped (or, before it
dropped any, of its first entry); an older one catches up from the engine.

Capacity: a websocket message costs the API a fixed price (uvicorn, the
websockets framing and a ``send`` system call) however small it is, so one
event a message caps the whole process's message rate well below what a
hundred websockets following everything at the engine's full event rate
need: they need ``?batch=true`` (a JSON array of up to 512 frames a message); without it they
are cut off and resume, and the engine is never slowed. Senders yield to the
loop after every round so the relay's reading is never starved; should the
relay still fall a hub queue behind the engine, see :meth:`FeedRelay._run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, NamedTuple

import msgspec
import structlog

from tiffany.feed.fairshare import FairShare
from tiffany.feed.ring import Entry, Ring
from tiffany.feed.transport import FEED_SOCKET, FrameHead
from tiffany.feed.upstream import Source, Upstream
from tiffany.feed.wsdirect import DirectWriter, text_frame

__all__ = ["FEED_SOCKET", "FeedRelay", "FeedSubscriber", "feed_path"]

log = structlog.get_logger(__name__)

#: Entries a sender takes from the ring at a time.
READ_BATCH_ENTRIES: Final = 512

#: How long the relay gathers a trickle of events before it wakes the senders, in seconds.
FLUSH_S: Final = 0.025
#: Entries gathered that wake the senders at once.
FLUSH_ENTRIES: Final = 64
#: How often the relay looks for sends stuck past their deadline, in seconds.
DEADLINE_CHECK_S: Final = 0.25
#: Loop time one pass of direct writes may take before it yields, in seconds.
DIRECT_SLICE_S: Final = 0.0005

#: ``run_id`` of ring entries that go to every subscriber (control frames).
EVERYONE: Final = "*"

_encode = msgspec.json.Encoder().encode

_PING_FRAME: Final = text_frame('{"type":"ping"}')
_PING_BATCH: Final = text_frame('[{"type":"ping"}]')


class _Message(NamedTuple):
    """What a direct subscriber at a ring position is due: frames, and where it then is."""

    cursor: int
    frames: bytes
    last_seq: int | None


#: The messages framed in one pass, by (ring position, run filter, batch).
_Made = dict[tuple[int, str | None, bool], _Message]


def feed_path(data_dir: str | Path) -> Path:
    """Return the engine's feed socket path for a data dir."""
    return Path(data_dir) / FEED_SOCKET


class FeedSubscriber:
    """One websocket's view of the relay: a cursor, a filter and a wake-up.

    Attributes:
        run_id: Only events of this run (None: every event).
        cursor: The next ring position to read.
        last_seq: The last event seq handed to the websocket (or the resume
            point), what a ``cutoff`` frame reports.
        since: The resume point the client asked for (None: live only).
        cut: Set when the relay cuts the subscriber off.
        catching_up: True while the subscriber is fed by a catch-up connection.
    """

    def __init__(self, relay: FeedRelay, run_id: str | None, since: int | None) -> None:
        self.relay = relay
        self.run_id = run_id
        self.since = since
        self.cursor = relay.ring.end
        self.last_seq: float | None = since if since is not None else relay.last_seq
        self.cut = asyncio.Event()
        self.cut_reason = ""
        self.catching_up = False
        #: Called once when the relay cuts the subscriber off (the websocket's reaction).
        self.on_cut: Callable[[], Any] | None = None
        self._cut_task: Any = None
        self._wake = asyncio.Event()
        self._idle = False
        #: When the send in progress began (monotonic), None between sends; for a
        #: direct subscriber, since when its transport has not taken more.
        self.send_since: float | None = None
        #: Written to by the relay itself (:meth:`FeedRelay.go_direct`), or None
        #: (its websocket's sender task reads :meth:`next_frames`).
        self.direct: DirectWriter | None = None
        #: Direct: JSON arrays of frames (``?batch=true``) rather than one a message.
        self.batch = False
        #: Direct: an idle subscriber gets a ping this often, in seconds.
        self.ping_s = 15.0
        #: Direct: when the relay last wrote to it (monotonic).
        self.last_write = 0.0

    async def next_frames(
        self, timeout: float, limit: int = READ_BATCH_ENTRIES
    ) -> list[tuple[int | None, str]]:
        """Return the next ``(seq, text)`` frames for the websocket; ``[]`` after ``timeout`` idle.

        Events come with strictly increasing seqs; control frames (``gone``)
        have seq None. The caller records each event it sends with
        :meth:`sent_event`, so a cutoff reports what the client really got.
        """
        relay = self.relay
        while True:
            ring = relay.ring
            if self.cursor < ring.end:
                if self.cursor < ring.start:
                    relay.cut_off(self, "slow subscriber: fell off the ring")
                    return []
                entries = ring.read(self.cursor, limit)
                self.cursor += len(entries)
                last = self.last_seq
                frames: list[tuple[int | None, str]] = []
                for key, run_id, text in entries:
                    if last is not None and key <= last:
                        continue  # already sent (by a catch-up connection)
                    if run_id == EVERYONE:
                        frames.append((None, text))
                    elif self.run_id is None or run_id == self.run_id:
                        frames.append((int(key), text))
                if frames:
                    return frames
                continue
            # A timer rather than asyncio.wait_for, which costs a task a call.
            self._wake.clear()
            self._idle = False
            timer = asyncio.get_running_loop().call_later(timeout, self._on_idle)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
            if self._idle and self.cursor >= relay.ring.end:
                return []

    def _on_idle(self) -> None:
        self._idle = True
        self._wake.set()

    async def send(self, send: Callable[[str], Awaitable[Any]], text: str) -> None:
        """Await ``send(text)`` under the relay's fair share and the send deadline.

        The relay cuts the subscriber off when one send takes longer than
        its ``send_timeout_s`` (the socket does not drain); the stuck send is
        then cancelled by the cutoff.
        """
        await self.relay.turn()
        self.send_since = time.monotonic()
        try:
            await send(text)
        finally:
            self.send_since = None

    def sent_event(self, seq: int) -> None:
        """Record that the event ``seq`` went out to the client."""
        self.last_seq = seq

    def cutoff_frame(self) -> str:
        """Return the ``cutoff`` control frame for this subscriber."""
        last = self.last_seq
        return _encode(
            {
                "type": "cutoff",
                "last_seq": int(last) if last is not None else None,
                "reason": self.cut_reason,
            }
        ).decode()


class FeedRelay:
    """The API process's one upstream subscription and its ring (module docstring).

    Args:
        source: Where the events come from (:class:`~tiffany.feed.upstream.Source`:
            the engines' sockets or the database; the API's port
            :class:`tiffany.ports.feed.FeedSource` chooses).
        ring_events: Entries kept for resumes.
        queue_frames: How far (in entries) a subscriber may lag before it is cut off.
        queue_bytes: How far (in bytes of frames) a subscriber may lag before
            it is cut off.
        send_timeout_s: How long one send may wait for the socket to drain
            before the subscriber is cut off.
        max_subscribers: Subscribers at once; :meth:`full` says when a new
            one must be refused.
    """

    def __init__(
        self,
        source: Source,
        *,
        ring_events: int = 100_000,
        queue_frames: int = 10_000,
        queue_bytes: int = 16 * 1024 * 1024,
        send_timeout_s: float = 10.0,
        max_subscribers: int = 1000,
    ) -> None:
        #: The engines' feeds (their sockets, or ``NOTIFY tiffany_feed``) that fill the ring.
        self.source = source
        #: Several feeds merged, each event re-keyed (see :class:`Upstream`).
        self.merged = source.merged
        self.queue_frames = queue_frames
        self.queue_bytes = queue_bytes
        self.send_timeout_s = send_timeout_s
        self.max_subscribers = max_subscribers
        self.refused = 0
        self.deadline_cutoffs = 0
        #: Why the last subscribers were cut off (newest last).
        self.recent_cutoffs: deque[str] = deque(maxlen=32)
        #: The senders' fair share of the loop (ASGI senders only; see turn()).
        self.fair = FairShare()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self.ring = Ring(max(ring_events, queue_frames + READ_BATCH_ENTRIES))
        self.last_seq: int | None = None
        self.subscribers: set[FeedSubscriber] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake_pending = False
        self._wake_timer: asyncio.TimerHandle | None = None
        self._woken_at = 0  # ring end at the last wake-up
        # counters for /metrics
        self.received = 0
        self.dropped_subscribers = 0
        self.upstream_gone = 0
        self.catchups = 0

    @property
    def connected(self) -> bool | None:
        """Whether every engine's feed answered lately (None: one not tried yet)."""
        return self.source.connected

    @property
    def failed(self) -> str | None:
        """Why the relay stopped following (a failure reconnecting cannot mend), or None."""
        return self.source.failed

    @property
    def upstream_cutoffs(self) -> int:
        """Times an engine cut this relay's feed off for falling behind."""
        return self.source.upstream_cutoffs

    # -- upstream ------------------------------------------------------------------

    def start(self) -> None:
        """Start following the engines' feeds (reconnects forever)."""
        if self._task is None:
            self._task = asyncio.create_task(self.source.run(self), name="tiffany-api-feed-relay")
            self._deadline_timer = asyncio.get_running_loop().call_later(
                DEADLINE_CHECK_S, self._check_deadlines
            )

    async def stop(self) -> None:
        """Stop following and cut every subscriber off."""
        task, self._task = self._task, None
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sub in list(self.subscribers):
            self.cut_off(sub, "the API is shutting down", slow=False)

    def accept(self, head: FrameHead, text: str, up: Upstream | None = None) -> None:
        """Take one frame from an engine's feed (events and control frames), as its text.

        With several engines each event gets the relay's own key (see
        :class:`Upstream`), written into its ``seq``.
        """
        if up is None:
            up = self.source.upstreams[0]
        up.connected = True
        kind = head.type
        if kind == "gone":
            self.upstream_gone += 1
            reason = "the engine restarted or dropped events: reload state over HTTP"
            self.mark_gap(head.oldest, reason)
            return
        if kind is not None:
            return  # cutoff (handled by _run), ping, or newer control frames
        seq = head.seq
        if seq.__class__ is not int:
            return
        if up.last_seq is not None and seq <= up.last_seq:
            return  # duplicates after a reconnect
        up.last_seq = seq
        up.received += 1
        if self.merged:
            key = seq if self.last_seq is None else max(self.last_seq + 1, seq)
            if key != seq:
                text = _rekey(text, seq, key)
            seq = key
        self.last_seq = seq
        self.received += 1
        run_id = head.run_id
        if run_id is not None and run_id.__class__ is not str:
            run_id = str(run_id)
        self._append((seq, run_id, text))

    def lost(self, reason: str) -> None:
        """An engine's feed failed for good (``upstream.py``): cut every subscriber off."""
        for sub in list(self.subscribers):
            self.cut_off(sub, reason, slow=False)

    def mark_gap(self, oldest: Any, reason: str) -> None:
        """Put a ``gone`` frame in the ring, between the seqs before and after a gap."""
        if self.ring.end and self.ring.at(self.ring.end - 1)[1] == EVERYONE:
            return  # one is enough between two stretches of events
        key = (self.last_seq if self.last_seq is not None else 0) + 0.5
        self._append((key, EVERYONE, _gone(oldest, reason)))

    def _append(self, entry: Entry) -> None:
        """Add an entry; wake the senders after :data:`FLUSH_S`, or at once when many wait.

        Discussion: a run's events come a few at a time over some
        milliseconds; woken for each few, 100 websockets in batch mode sent
        100 messages a few events each, some ten times a run. Gathering them
        for a few milliseconds makes that one message a run; a busy feed
        (:data:`FLUSH_ENTRIES` waiting) wakes them at once, so lag stays low.
        """
        ring = self.ring
        ring.append(entry)
        if ring.end - self._woken_at >= FLUSH_ENTRIES:
            if self._wake_timer is not None:
                self._wake_timer.cancel()
                self._wake_timer = None
            if not self._wake_pending:
                self._wake_pending = True
                asyncio.get_running_loop().call_soon(self._wake_all)
        elif not self._wake_pending and self._wake_timer is None:
            self._wake_timer = asyncio.get_running_loop().call_later(FLUSH_S, self._wake_all)

    def _wake_all(self) -> None:
        """Wake the subscribers and cut off those too far behind."""
        self._wake_pending = False
        if self._wake_timer is not None:
            self._wake_timer.cancel()
            self._wake_timer = None
        ring = self.ring
        self._woken_at = ring.end
        direct = []
        for sub in list(self.subscribers):
            if ring.end - sub.cursor > self.queue_frames or sub.cursor < ring.start:
                self.cut_off(sub, "slow subscriber: queue full")
            elif ring.bytes_after(sub.cursor) > self.queue_bytes:
                self.cut_off(sub, "slow subscriber: queue full (bytes)")
            elif sub.direct is not None:
                direct.append(sub)
            elif not sub.catching_up:
                sub._wake.set()
        if direct:
            self._push_all(direct)

    def _check_deadlines(self) -> None:
        """Cut off the subscribers whose send has waited past the deadline (a timer)."""
        self._deadline_timer = asyncio.get_running_loop().call_later(
            DEADLINE_CHECK_S, self._check_deadlines
        )
        now = time.monotonic()
        late = now - self.send_timeout_s
        for sub in list(self.subscribers):
            since = sub.send_since
            if since is not None and since < late:
                self.deadline_cutoffs += 1
                self.cut_off(
                    sub,
                    f"slow subscriber: its socket did not drain in {self.send_timeout_s:g} s",
                )
            elif sub.direct is not None and since is None and now - sub.last_write >= sub.ping_s:
                self._write(sub, _PING_BATCH if sub.batch else _PING_FRAME, None)

    # -- direct fan-out ----------------------------------------------------------

    def go_direct(
        self, sub: FeedSubscriber, writer: DirectWriter, *, batch: bool, ping_s: float
    ) -> None:
        """From now on write ``sub``'s frames from the relay itself (:mod:`tiffany.feed.wsdirect`).

        Called once its catch-up (if any) is done; what the ring holds for it
        is written at once.
        """
        sub.batch, sub.ping_s = batch, ping_s
        sub.last_write = time.monotonic()
        sub.direct = writer
        writer.on_writable = lambda: self._drained(sub)
        self._push_all([sub])

    def _drained(self, sub: FeedSubscriber) -> None:
        """A direct subscriber's transport took its backlog: write what it is due."""
        if sub in self.subscribers:
            sub.send_since = None
            self._push_all([sub])

    def _push_all(self, subs: list[FeedSubscriber]) -> None:
        """Write each direct subscriber what it is due, framing each message once.

        Discussion: subscribers at the same ring position with the same
        filter are due the same bytes (the dashboard's list and every
        client following everything are), so a message is framed once per
        pass and written to each: a subscriber costs a ``write`` system
        call, not a task switch, a trip through ASGI and its framing. A pass
        longer than :data:`DIRECT_SLICE_S` leaves the rest to the next pass
        of the loop, so requests are served in between.
        """
        made: _Made = {}
        start = time.perf_counter()
        for i, sub in enumerate(subs):
            if sub.direct is not None and sub in self.subscribers:
                self._push(sub, made)
            if time.perf_counter() - start > DIRECT_SLICE_S and i + 1 < len(subs):
                asyncio.get_running_loop().call_soon(self._push_all, subs[i + 1 :])
                return

    def _push(self, sub: FeedSubscriber, made: _Made) -> None:
        writer = sub.direct
        assert writer is not None
        ring = self.ring
        while sub.cursor < ring.end:
            if not writer.open():
                return  # closing: its handler ends it
            if not writer.writable():
                if sub.send_since is None:
                    sub.send_since = time.monotonic()  # the deadline cuts it off if it stays
                return
            if sub.cursor < ring.start:
                self.cut_off(sub, "slow subscriber: fell off the ring")
                return
            last = sub.last_seq
            shared = last is None or ring.at(sub.cursor)[0] > last
            key = (sub.cursor, sub.run_id, sub.batch)
            message = made.get(key) if shared else None
            if message is None:
                message = self._message(sub, None if shared else last)
                if shared:
                    made[key] = message
            sub.cursor = message.cursor
            if message.frames:
                self._write(sub, message.frames, message.last_seq)

    def _write(self, sub: FeedSubscriber, frames: bytes, last_seq: int | None) -> None:
        writer = sub.direct
        if writer is None or not writer.open():
            return
        writer.write(frames)
        sub.last_write = time.monotonic()
        if last_seq is not None:
            sub.last_seq = last_seq
        if not writer.writable() and sub.send_since is None:
            sub.send_since = sub.last_write

    def _message(self, sub: FeedSubscriber, skip_upto: float | None) -> _Message:
        """Frame what ``sub`` is due from its cursor (up to a batch of entries)."""
        entries = self.ring.read(sub.cursor, READ_BATCH_ENTRIES)
        texts: list[str] = []
        last_seq = None
        for key, run_id, text in entries:
            if skip_upto is not None and key <= skip_upto:
                continue
            if run_id == EVERYONE:
                texts.append(text)
            elif sub.run_id is None or run_id == sub.run_id:
                texts.append(text)
                last_seq = int(key)
        if not texts:
            frames = b""
        elif sub.batch:
            frames = text_frame("[" + ",".join(texts) + "]")
        else:
            frames = b"".join([text_frame(text) for text in texts])
        return _Message(sub.cursor + len(entries), frames, last_seq)

    # -- fair share ---------------------------------------------------------------

    async def turn(self) -> None:
        """Wait for this sender's turn at the loop (:class:`~tiffany.feed.fairshare.FairShare`)."""
        await self.fair.turn()

    # -- subscribers ------------------------------------------------------------------

    def covers(self, since: int) -> bool:
        """True when the ring holds every event after ``since`` (or ``since`` is current)."""
        if self.last_seq is not None and since >= self.last_seq:
            return True
        ring = self.ring
        if not len(ring):
            return False
        floor = ring.dropped if ring.dropped is not None else ring.at(ring.start)[0]
        return since >= floor

    async def beyond(self, since: int) -> int | None:
        """The feed's last seq when ``since`` is beyond it (a seq it never sent), else None.

        A ``since`` up to the last event this relay took is the common case
        and costs nothing. Above it, with one engine, the engine's feed
        decides (a ``head`` question: another API process, or the engine
        itself, may be ahead of this relay by a few events); with merged
        feeds the keys are this relay's own, and it decides. An engine that
        cannot be asked lets the resume go on (its catch-up says ``gone``).

        Discussion: HTTP's ``min_seq`` beyond the journal is a 422 at once;
        before this check a websocket's ``since`` beyond the feed was taken,
        and the client then heard nothing until the feed passed its seq
        (events in between never came).
        """
        last = self.last_seq
        if last is not None and since <= last:
            return None
        if self.merged:
            return last
        try:
            last = await self.source.head()
        except (OSError, EOFError) as exc:
            log.info("feed head unknown", since=since, error=str(exc))
            return None
        return last if since > last else None

    def full(self) -> bool:
        """True when a new subscriber must be refused (:attr:`max_subscribers` attached)."""
        return len(self.subscribers) >= self.max_subscribers

    def subscribe(
        self, run_id: str | None = None, since: int | None = None, tail: int = 0
    ) -> FeedSubscriber:
        """Attach a subscriber; with ``since`` in the ring, start right after it.

        Without ``since``, ``tail`` > 0 starts that many ring entries back (the
        recent past a freshly opened page shows), else at the live end.

        When the ring does not cover ``since`` the subscriber starts at the
        live end with ``catching_up`` set: its caller runs :meth:`catch_up`.
        """
        sub = FeedSubscriber(self, run_id, since)
        if since is None and tail > 0:
            sub.cursor = max(self.ring.start, self.ring.end - tail)
            sub.last_seq = None
        elif since is not None:
            if self.covers(since):
                sub.cursor = self.ring.position_after(since)
            else:
                sub.catching_up = True
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: FeedSubscriber) -> None:
        """Detach a subscriber (idempotent)."""
        self.subscribers.discard(sub)

    def cut_off(self, sub: FeedSubscriber, reason: str, *, slow: bool = True) -> None:
        """Cut a subscriber off (its websocket sends ``cutoff`` and closes).

        ``slow`` counts it in :attr:`dropped_subscribers` (False at shutdown).
        """
        self.subscribers.discard(sub)
        if sub.cut.is_set():
            return
        if slow:
            self.dropped_subscribers += 1
        sub.cut_reason = sub.cut_reason or reason
        if slow:
            self.recent_cutoffs.append(sub.cut_reason)
        sub.cut.set()
        sub._wake.set()
        if sub.on_cut is not None:
            sub._cut_task = sub.on_cut()  # keep a reference: the loop holds tasks weakly

    async def catch_up(
        self, sub: FeedSubscriber, send: Callable[[str], Any], *, idle_timeout: float
    ) -> None:
        """Serve a resume older than the ring from the engine, until it meets the ring.

        ``send`` is awaited with each JSON text frame. Afterwards the
        subscriber reads from the ring (entries it was already sent are
        skipped by seq). If the engine no longer holds ``since``, cannot be
        reached, or does not deliver up to the ring within ``idle_timeout``,
        the subscriber is sent ``gone``.
        """
        assert sub.since is not None
        self.catchups += 1
        if self.merged:
            # The relay's keys are its own (see Upstream): no engine can
            # tell what followed one it no longer holds.
            sub.catching_up = False
            await send(_gone(None, "events that old are no longer held: reload state over HTTP"))
            sub._wake.set()
            return
        boundary = sub.cursor
        # Every event after ``upto`` is in the ring from ``boundary`` on.
        upto = self.last_seq
        reason = await self._catch_up(sub, send, boundary, upto, idle_timeout)
        sub.catching_up = False
        if reason is not None:
            await send(_gone(None, reason))
        if sub.cursor < self.ring.start or self.ring.end - sub.cursor > self.queue_frames:
            self.cut_off(sub, "slow subscriber: the live feed ran ahead of its catch-up")
        else:
            sub._wake.set()

    async def _catch_up(
        self,
        sub: FeedSubscriber,
        send: Callable[[str], Any],
        boundary: int,
        upto: int | None,
        idle_timeout: float,
    ) -> str | None:
        """Relay the engine's events after ``sub.since``; return why it fell short, or None."""
        assert sub.since is not None  # catch_up's
        try:
            stream = self.source.replay(sub.since)
        except OSError as exc:  # pragma: no cover - follow connects lazily
            return f"the engine's feed is unreachable ({exc}): reload state over HTTP"
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(anext(stream), idle_timeout)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    break
                kind = frame.get("type")
                if kind == "gone":
                    await send(
                        _gone(
                            frame.get("oldest"),
                            "the events after this seq are no longer held: reload state over HTTP",
                        )
                    )
                    return None
                if kind == "cutoff":
                    break
                seq = frame.get("seq")
                if not isinstance(seq, int):
                    continue
                if upto is not None and seq > upto:
                    return None  # the ring has it from here on
                if upto is None and self.ring.end > boundary and seq >= self.ring.at(boundary)[0]:
                    return None
                last = sub.last_seq
                if last is None or seq > last:
                    if sub.run_id is None or frame.get("run_id") == sub.run_id:
                        await send(_encode(frame).decode())
                    sub.sent_event(seq)
                if upto is not None and seq >= upto:
                    return None
        except OSError as exc:
            return (
                f"the API does not hold events that old and the engine's feed is unreachable "
                f"({exc.strerror or exc}): reload state over HTTP"
            )
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                await stream.aclose()  # type: ignore[attr-defined]
        if upto is None:
            return None  # the engine had nothing more before the relay's first event
        return "could not catch up with the engine's feed: reload state over HTTP"


def _rekey(text: str, seq: int, key: int) -> str:
    """Return an event's JSON text with its ``seq`` replaced by the relay's ``key``."""
    old = f'"seq":{seq},'
    if text.startswith("{" + old):
        return '{"seq":' + str(key) + "," + text[len(old) + 1 :]
    doc = msgspec.json.decode(text)
    doc["seq"] = key
    return _encode(doc).decode()


def _gone(oldest: Any, reason: str) -> str:
    return _encode({"type": "gone", "oldest": oldest, "reason": reason}).decode()
