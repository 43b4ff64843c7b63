"""Fair turns at the event loop for many senders (the activity feed's ASGI senders).

Every websocket message sent through ASGI costs the loop a fixed price; a
burst that wakes hundreds of senders at once would hold one pass of the
loop for tens of milliseconds while every HTTP request of the process
waits. :class:`FairShare` gives the senders :data:`FANOUT_SLICE_S` of each
pass and queues the rest for the next passes (see :meth:`FairShare.turn`).
The relay's direct writes (:mod:`tiffany.feed.wsdirect`) do not take turns:
they bound their own pass (``feed.DIRECT_SLICE_S``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Final

__all__ = ["FANOUT_SLICE_S", "MAX_GRANT", "FairShare"]

#: Loop time the senders may use in one pass of the event loop, in seconds
#: (then the other senders wait a pass: requests are served in between).
FANOUT_SLICE_S: Final = 0.0005
#: Most senders woken in one pass once the slice is contended.
MAX_GRANT: Final = 1024


class FairShare:
    """Turns at the loop shared among senders, a slice of each pass (module docstring)."""

    def __init__(self) -> None:
        self._slice_start: float | None = None
        self._slice_turns = 0
        self._grant = 1
        self._granted_at: float | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._next_slice_pending = False

    async def turn(self) -> None:
        """Wait for this sender's turn at the loop (before each send).

        Discussion: every websocket message costs the loop a fixed price, so
        hundreds of senders woken by one burst of events would hold one pass of the loop for
        tens of milliseconds, and every HTTP request in the process waits for
        that pass (with 200 subscribers that never read, whose sockets took
        every event until their buffers filled, submissions were several times
        slower; see :func:`tiffany.feed.wsdirect.bound_send_buffer`). Instead the senders share
        :data:`FANOUT_SLICE_S` of each pass; once it is spent, the others queue
        (FIFO) and the next passes wake as many of them as fitted in the last
        slice. A pass thus carries at most a slice of fan-out (plus one sender's
        turn) beside whatever the requests need; with the loop otherwise idle
        the passes follow each other at once and the fan-out runs at full speed.
        Rejected: an ``asyncio.sleep(0)`` per sender (300 tasks spinning
        through every pass) and a priority scheme (asyncio has none).
        """
        now = time.perf_counter()
        start = self._slice_start
        if not self._waiters:
            if start is None:
                self._open_slice(now)
                return
            if now - start < FANOUT_SLICE_S:
                self._slice_turns += 1
                return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._schedule_next_slice()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._wake_waiters(1)  # pass the turn on
            raise

    def _open_slice(self, now: float) -> None:
        self._slice_start = now
        self._slice_turns = 1
        self._schedule_next_slice()

    def _schedule_next_slice(self) -> None:
        if not self._next_slice_pending:
            self._next_slice_pending = True
            asyncio.get_running_loop().call_soon(self._next_slice)

    def _next_slice(self) -> None:
        """A new pass: wake the next waiters, as many as the slice seems to hold.

        The count adapts (halved when the woken senders and the pass took
        more than a slice, doubled when well under), so it follows the cost
        of a turn without measuring each one.
        """
        self._next_slice_pending = False
        now = time.perf_counter()
        if self._granted_at is not None:
            spent = now - self._granted_at
            if spent > FANOUT_SLICE_S:
                self._grant = max(1, self._grant // 2)
            elif spent < FANOUT_SLICE_S / 2:
                self._grant = min(self._grant * 2, MAX_GRANT)
        elif self._slice_start is not None:
            self._grant = max(1, min(self._slice_turns, MAX_GRANT))
        self._slice_start = None
        self._slice_turns = 0
        self._granted_at = None
        if self._waiters:
            self._wake_waiters(self._grant)
            self._granted_at = time.perf_counter()
            self._schedule_next_slice()

    def _wake_waiters(self, n: int) -> None:
        while n > 0 and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1
