"""The PAL hub: a ring of recent events and bounded per-subscriber queues.

Threads: the scheduler thread only *publishes* (appends a tuple to the
inbox, an O(1) deque append that never blocks). The hub's own thread drains
the inbox every few milliseconds, turns tuples into encoded events, keeps
them in a ring and hands them to subscribers. Subscribers (the API relay,
tests) read from their own bounded queues.

Backpressure: a subscriber whose queue is full is cut off, never waited
for: it gets a ``cutoff`` frame with the last seq it received and may
resume with ``since`` (gapless while the ring still holds what it missed).
A resume older than the ring gets a ``gone`` frame: reload state over HTTP.
Memory is bounded by the ring size plus each subscriber's queue bound.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import msgspec

from tiffany.pal.events import Event, encode_event

__all__ = ["Hub", "Subscription"]

#: Events kept for resumes.
RING_SIZE: Final = 100_000
#: Frames a subscriber may have queued before it is cut off.
SUBSCRIBER_QUEUE_FRAMES: Final = 10_000
#: How often the hub thread drains the inbox, in seconds.
DRAIN_INTERVAL_S: Final = 0.005

Filter = Callable[[Event], bool]


class Subscription:
    """One consumer of the feed.

    ``maxlen`` bounds the frames queued *live*; a resume's backlog (replayed
    from the ring at subscribe time, at most the ring's size, and only
    references to the ring's frames) is allowed on top of it while it
    drains, so a resume far behind is not cut off before it could read.
    """

    def __init__(self, hub: Hub, maxlen: int, flt: Filter | None) -> None:
        self._hub = hub
        self.maxlen = maxlen
        self.filter = flt
        self.frames: deque[bytes] = deque()
        self._seqs: deque[int] = deque()  # each queued frame's seq (0: a control frame)
        #: The seq of the last event queued.
        self.last_seq = 0
        #: The seq of the last event handed out by :meth:`get` (a cutoff names it).
        self.delivered_seq = 0
        self.closed = False
        self.cutoff_reason: str | None = None
        self._limit = maxlen
        self._ready = threading.Event()

    def _push(self, seq: int, frame: bytes) -> None:
        if self.closed:
            return
        if len(self.frames) >= self._limit:
            self.closed = True
            self.cutoff_reason = "slow subscriber: queue full"
            self.frames.clear()
            self._seqs.clear()
            self._control(
                {"type": "cutoff", "last_seq": self.delivered_seq, "reason": self.cutoff_reason}
            )
            self._hub._drop(self)
        else:
            self.frames.append(frame)
            self._seqs.append(seq)
            self.last_seq = seq
        self._ready.set()

    def _backlog(self, seq: int, frame: bytes) -> None:
        """Queue a frame replayed from the ring (not counted against ``maxlen``)."""
        self.frames.append(frame)
        self._seqs.append(seq)
        self.last_seq = seq
        self._limit += 1

    def _control(self, obj: dict[str, Any]) -> None:
        self.frames.append(msgspec.json.encode(obj))
        self._seqs.append(0)

    def get(self, timeout: float | None = None) -> list[bytes]:
        """Return the queued frames (waiting up to ``timeout`` for one)."""
        if not self.frames and not self.closed:
            self._ready.wait(timeout)
        self._ready.clear()
        out = []
        frames, seqs = self.frames, self._seqs
        with self._hub._lock:  # against a concurrent _push from the hub thread
            while frames:
                out.append(frames.popleft())
                seq = seqs.popleft()
                if seq:
                    self.delivered_seq = seq
            self._limit = max(self.maxlen, self._limit - len(out))
        return out

    def close(self) -> None:
        """Unsubscribe."""
        self.closed = True
        with self._hub._lock:
            self._hub._drop(self)
        self._ready.set()


class Hub:
    """Ring + fan-out for activity events (see module docstring)."""

    def __init__(self, ring_size: int = RING_SIZE, seq0: int | None = None) -> None:
        self.inbox: deque[tuple[Any, ...]] = deque()
        self._seqs: deque[int] = deque(maxlen=ring_size)
        self._ring: deque[bytes] = deque(maxlen=ring_size)
        self._subs: list[Subscription] = []
        self._lock = threading.RLock()  # subscribers and ring; never taken by the scheduler thread
        self.next_seq = seq0 if seq0 is not None else time.time_ns() // 1000
        self.published = 0
        self.dropped_subscribers = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- scheduler side ------------------------------------------------------------

    def publish(self, kind: str, **fields: Any) -> None:
        """Queue an event (any thread; O(1), never blocks)."""
        self.inbox.append((time.time(), kind, fields))  # noqa: TID251 - event timestamps, not task code

    # -- hub side --------------------------------------------------------------------

    def start(self) -> None:
        """Start the hub's draining thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tiffany-pal-hub", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Drain what is left and stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        self.drain()

    def _run(self) -> None:
        while not self._stop.wait(DRAIN_INTERVAL_S):
            self.drain()

    def drain(self) -> int:
        """Turn queued tuples into events, keep them, fan them out; return how many."""
        inbox = self.inbox
        n = 0
        with self._lock:
            subs = list(self._subs)
            while inbox:
                ts, kind, fields = inbox.popleft()
                seq = self.next_seq
                self.next_seq = seq + 1
                event = Event(seq=seq, ts=ts, kind=kind, **fields)
                frame = encode_event(event)
                self._seqs.append(seq)
                self._ring.append(frame)
                for sub in subs:
                    if sub.filter is None or sub.filter(event):
                        sub._push(seq, frame)
                n += 1
        self.published += n
        return n

    def subscribe(
        self,
        since: int | None = None,
        flt: Filter | None = None,
        maxlen: int = SUBSCRIBER_QUEUE_FRAMES,
    ) -> Subscription:
        """Subscribe; with ``since``, first replay the ring's events after it."""
        sub = Subscription(self, maxlen, flt)
        with self._lock:
            if since is not None:
                oldest = self._seqs[0] if self._seqs else self.next_seq
                if since + 1 < oldest and since < self.next_seq - 1:
                    sub._control({"type": "gone", "oldest": oldest})
                else:
                    start = bisect.bisect_right(self._seqs, since)
                    for i in range(start, len(self._seqs)):
                        frame = self._ring[i]
                        if flt is None or flt(msgspec.json.decode(frame, type=Event)):
                            sub._backlog(self._seqs[i], frame)
            self._subs.append(sub)
        return sub

    def _drop(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)
            if sub.cutoff_reason:
                self.dropped_subscribers += 1

    @property
    def subscribers(self) -> int:
        """How many subscribers are attached."""
        return len(self._subs)
