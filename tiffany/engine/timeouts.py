"""Timeouts that hold no thread: one thread calls each expired timeout's function.

A control request that waits for the loop (a submission waits for its group
commit) answers through a future, so it holds no control worker while it
waits; its timeout is an entry here, dropped when the answer comes first.
One daemon thread sleeps until the oldest entry expires, calls it, and
sleeps again. Every entry has the same delay, so the entries expire in the
order they came: a dict in insertion order is the queue, and an answered
entry leaves it at once (the table holds only what is in flight, which
keeps a collapse from growing the heap the collector walks). For the same
reason nothing ever wakes the thread early: with nothing in flight it sleeps
one delay, and an entry that came meanwhile expires after that. (It was
notified when an entry came to an empty table: with submissions answered
within milliseconds that is nearly every one, a wake-up and a wait for the
GIL each.)

Discussion: the control workers used to wait in ``Future.result(timeout)``.
Sixteen of them capped the submissions in flight at sixteen: once a commit
cycle outlasted sixteen submissions' arrivals the queue grew, and longer
passes made the cycle longer still (bench/HISTORY.md, 2026-11-25).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import structlog

__all__ = ["Timeouts"]

log = structlog.get_logger(__name__)


class Timeouts:
    """Call ``fn()`` ``delay_s`` seconds after :meth:`start` unless cancelled first.

    Args:
        delay_s: Every entry's delay.
        name: The thread's name.
    """

    def __init__(self, delay_s: float, name: str = "tiffany-timeouts") -> None:
        self.delay_s = delay_s
        self._name = name
        self._entries: dict[int, tuple[float, Callable[[], None]]] = {}
        self._tokens = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, fn: Callable[[], None]) -> int:
        """Call ``fn()`` after the delay; return the token :meth:`cancel` takes (any thread)."""
        token = next(self._tokens)
        at = time.monotonic() + self.delay_s
        with self._cond:
            if self._closed:
                return token
            self._entries[token] = (at, fn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return token

    def cancel(self, token: int) -> None:
        """Drop the entry (it was answered in time); nothing if it expired already."""
        with self._cond:
            self._entries.pop(token, None)

    def close(self) -> None:
        """Stop the thread; the entries left are dropped, never called."""
        with self._cond:
            self._closed = True
            self._entries.clear()
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        entries, cond = self._entries, self._cond
        while True:
            with cond:
                due: list[Callable[[], None]] = []
                while not self._closed and not due:
                    if not entries:  # whatever comes now expires after this wait
                        cond.wait(self.delay_s)
                        continue
                    token = next(iter(entries))
                    at, fn = entries[token]
                    wait = at - time.monotonic()
                    if wait > 0:
                        cond.wait(wait)  # an entry cancelled meanwhile: look again
                        continue
                    del entries[token]
                    due.append(fn)
                if self._closed:
                    return
            for fn in due:
                try:
                    fn()
                except Exception:  # one handler's failure must not stop the others
                    log.exception("timeouts.handler_failed")
