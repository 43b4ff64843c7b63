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

Seqs (schema v2, ``events.py``): each event is stamped on publish with the
WAL's position (the last record appended: the journal's hooks run before
the activity log's, so a dispatch's own record is already there), and the
hub thread turns that into the feed key ``max(last seq + 1, wal_seq *
SEQS_PER_RECORD)``. Invariants: ``seq`` strictly increases, and so does it
across restarts of the engine on the same data dir: a new hub starts above
the WAL's end and above the high-water mark the last one wrote to its seq
file before any of its events left. A resume at or after :attr:`Hub.floor`
is served from the ring; an older one gets ``gone``. At start the floor is
that high-water mark, not the WAL's end: a client that saw the last life's
last event missed nothing of it, and every event of this life is in the
ring, so its resume is gapless even when it comes after this life's first
events (a relay reconnecting after a restart while runs already go on).

Discussion: the WAL alone does not order two engine lives that wrote no
record in between (a replay, or tool output while nothing is journaled):
their events share the same last record. The seq file is the high-water
mark for those. It is written (``pwrite``, no fsync) once per drain, on the
hub's thread, so it survives a kill -9 (the page cache does); a power loss
may lose it: when the WAL holds records after the mark's, the WAL's own
end is the floor. Rejected: the wall
clock (v1: a clock stepped back silenced every resuming client); an fsync
per drain (a disk flush 200 times a second for a product stream); a new WAL
record at each start (the journal's format for the feed's sake).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

import msgspec

from tiffany.feed.events import (
    SEQS_PER_RECORD,
    Event,
    TaskFields,
    encode_event,
    encode_task_event,
)

__all__ = ["FEED_SEQ_FILE", "Hub", "Subscription", "WalPosition"]

#: Events kept for resumes.
RING_SIZE: Final = 100_000
#: Frames a subscriber may have queued before it is cut off.
SUBSCRIBER_QUEUE_FRAMES: Final = 10_000
#: How often the hub thread drains the inbox, in seconds.
DRAIN_INTERVAL_S: Final = 0.005

#: File name of the hub's high-water mark inside the data dir.
FEED_SEQ_FILE: Final = "feed.seq"

Filter = Callable[[Event], bool]


class WalPosition(Protocol):
    """What the hub reads of the WAL (:class:`tiffany.wal.Wal` has it)."""

    @property
    def next_seq(self) -> int:
        """The seq the next record gets."""
        ...


class _HighWater:
    """The last seq a hub handed out, kept in a small file (module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        raw = os.pread(self._fd, 32, 0).strip()
        self.value = int(raw) if raw.isdigit() else 0
        #: The last write's error (the mark then lags: a restart may answer ``gone``).
        self.error: str | None = None

    def write(self, seq: int) -> None:
        try:
            os.pwrite(self._fd, b"%020d\n" % seq, 0)
            self.value = seq
        except OSError as exc:
            self.error = str(exc)

    def close(self) -> None:
        os.close(self._fd)


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
        # The reader is woken once per drain (Hub.drain), not once a frame.

    def _wake_reader(self) -> None:
        """Wake the reader waiting in :meth:`get` (the hub, once per drain)."""
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


def _fan_out(subs: list[Subscription], seq: int, frame: bytes, event: Event | None) -> None:
    """Queue one event for every subscriber whose filter takes it.

    ``event`` is None for a task's event: decoded only if a subscriber filters.
    """
    for sub in subs:
        if sub.filter is None:
            sub._push(seq, frame)
            continue
        if event is None:
            event = msgspec.json.decode(frame, type=Event)
        if sub.filter(event):
            sub._push(seq, frame)


class Hub:
    """Ring + fan-out for activity events (see module docstring).

    Args:
        ring_size: Events kept for resumes.
        wal: The WAL whose position stamps each event (None: ``wal_seq`` 0,
            and seqs are consecutive from ``seq0``).
        seq_file: The high-water mark's file (:data:`FEED_SEQ_FILE` in the
            data dir); None keeps none (tests).
        seq0: The lowest seq this hub may hand out.
        engine: The engine publishing (``tiffany/wire/shards.py``): each event
            carries it, and feed keys count from the engine's first WAL
            seq (``base``), so they stay far below 2^53 whatever the engine.
        base: The seq before the engine's first WAL record.
    """

    def __init__(
        self,
        ring_size: int = RING_SIZE,
        *,
        wal: WalPosition | None = None,
        seq_file: str | os.PathLike[str] | None = None,
        seq0: int = 1,
        engine: int = 0,
        base: int = 0,
    ) -> None:
        self.engine, self.base = engine, base
        self.inbox: deque[tuple[Any, ...]] = deque()
        self._seqs: deque[int] = deque(maxlen=ring_size)
        self._ring: deque[bytes] = deque(maxlen=ring_size)
        self._subs: list[Subscription] = []
        self._lock = threading.RLock()  # subscribers and ring; never taken by the scheduler thread
        self._wal: WalPosition | None = None
        self._mark = _HighWater(seq_file) if seq_file is not None else None
        floor = seq0 - 1 if self._mark is None else max(seq0 - 1, self._mark.value)
        #: The seq of the last event handed out (before the first: the floor).
        self.last_seq = floor
        #: The ``wal_seq`` of the last event handed out.
        self.wal_seq = 0
        #: A resume at or after this seq is served from the ring (older: ``gone``).
        self.floor = floor
        if wal is not None:
            self.follow_wal(wal)
        self.published = 0
        self.dropped_subscribers = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow_wal(self, wal: WalPosition) -> None:
        """Stamp events with ``wal``'s position; start above its end (before publishing)."""
        self._wal = wal
        start = max(0, wal.next_seq - self.base) * SEQS_PER_RECORD - 1
        self.last_seq = max(self.last_seq, start)
        mark = self._mark.value if self._mark is not None else 0
        if mark // SEQS_PER_RECORD < max(0, wal.next_seq - 1 - self.base):
            # No earlier life on record, or the WAL holds records after the
            # mark's (a power loss may have lost the mark's last writes):
            # nobody can resume gaplessly below the WAL's end.
            self.floor = max(self.floor, start)

    # -- scheduler side ------------------------------------------------------------

    def publish(self, kind: str, *, wal_seq: int | None = None, **fields: Any) -> None:
        """Queue an event (any thread; O(1), never blocks).

        ``wal_seq`` defaults to the WAL's last record; pass the seq of a
        record about to be written when the event announces it.
        """
        if wal_seq is None:
            wal = self._wal
            wal_seq = wal.next_seq - 1 if wal is not None else 0
        self.inbox.append((time.time(), wal_seq, kind, fields))  # noqa: TID251 - display only

    def publish_task(
        self, kind: str, task: TaskFields, label: str, data: dict[str, Any] | None = None
    ) -> None:
        """Queue a task's event (the activity log's path: no dict of fields to build).

        The same event as ``publish(kind, label=..., data=..., **ids)``;
        ``task`` holds the task's ids, encoded once for all its events.
        """
        wal = self._wal
        wal_seq = wal.next_seq - 1 if wal is not None else 0
        self.inbox.append((time.time(), wal_seq, kind, task, label, data))  # noqa: TID251

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
        if self._mark is not None:
            self._mark.close()
            self._mark = None

    def _run(self) -> None:
        while not self._stop.wait(DRAIN_INTERVAL_S):
            self.drain()

    def drain(self) -> int:
        """Turn queued tuples into events, keep them, fan them out; return how many."""
        with self._lock:
            events = self._stamp()
            if not events:
                return 0
            if self._mark is not None:
                self._mark.write(self.last_seq)  # before any of them leaves the hub
            subs = list(self._subs)
            seqs, ring = self._seqs, self._ring
            for seq, frame, event in events:
                if len(seqs) == seqs.maxlen:
                    self.floor = seqs[0]  # about to be dropped from the ring
                seqs.append(seq)
                ring.append(frame)
                _fan_out(subs, seq, frame, event)
            for sub in subs:
                if sub.frames or sub.closed:
                    sub._wake_reader()  # one wake per drain, for every frame it got
        self.published += len(events)
        return len(events)

    def _stamp(self) -> list[tuple[int, bytes, Event | None]]:
        """Take the inbox, give each event its seq (module docstring) and encode it."""
        inbox = self.inbox
        last, wal_seq, base, engine = self.last_seq, self.wal_seq, self.base, self.engine
        events: list[tuple[int, bytes, Event | None]] = []
        while inbox:
            entry = inbox.popleft()
            at = entry[1]
            if at > wal_seq:
                wal_seq = at
            last = max(last + 1, max(0, wal_seq - base) * SEQS_PER_RECORD)
            if len(entry) == 6:  # publish_task
                ts, _, kind, task, label, data = entry
                frame = encode_task_event(last, ts, wal_seq, engine, kind, task, label, data)
                events.append((last, frame, None))
            else:
                ts, _, kind, fields = entry
                event = Event(seq=last, wal_seq=wal_seq, ts=ts, kind=kind, engine=engine, **fields)
                events.append((last, encode_event(event), event))
        self.last_seq, self.wal_seq = last, wal_seq
        return events

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
                if since < self.floor:
                    oldest = self._seqs[0] if self._seqs else self.last_seq + 1
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
