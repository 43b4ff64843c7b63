"""Where the engine's control threads meet the scheduler thread.

:class:`Inbox` carries work from other threads onto the loop; the loop
never waits on those threads. :class:`DurableWaits` answers the threads
waiting for the WAL to be durable past a seq.

Each waiter has its own future, woken once, when its seq is durable: a
submission costs its control thread one sleep and one wake. The shared
condition this replaces (``notify_all`` at every group commit) woke every
waiting thread at each commit, most of them only to sleep again; under
load the engine's sixteen control threads then made many context switches
a run and the kernel took a large share of the engine's CPU time
(bench/HISTORY.md, ``api.py``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, InvalidStateError
from typing import Any, Final

import structlog

from tiffany.errors import EngineNotReady
from tiffany.kernel import ReadWait

__all__ = ["INBOX_BATCH", "DurableWaits", "Inbox", "settle"]

log = structlog.get_logger(__name__)

#: Commands the inbox runs in one dispatch before letting other tasks run.
INBOX_BATCH: Final = 8


def settle(fut: Future[Any], value: Any = None, exc: BaseException | None = None) -> None:
    """Resolve ``fut`` unless it is done already (its waiter gave up and cancelled it)."""
    with contextlib.suppress(InvalidStateError):
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)


class Inbox:
    """Callables queued by other threads and run on the scheduler thread.

    :meth:`call` and :meth:`call_later` are thread-safe and never block;
    :meth:`task` is the kernel coroutine that runs them (spawned once,
    outside any run, so the journal ignores it).
    """

    def __init__(self) -> None:
        # (fn, its future, whether the inbox sets the future to fn's result)
        self._queue: deque[tuple[Callable[[], Any], Future[Any], bool]] = deque()
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Queue ``fn`` for the loop; the future gets its result or exception."""
        fut: Future[Any] = Future()
        self._queue.append((fn, fut, True))
        os.eventfd_write(self._fd, 1)
        return fut

    def call_later(self, fn: Callable[[], Any], fut: Future[Any]) -> None:
        """Queue ``fn``, which resolves ``fut`` itself, now or later.

        The inbox fails ``fut`` with what ``fn`` raises, or with
        :class:`~tiffany.errors.EngineNotReady` when it closes before ``fn``
        ran; ``fn`` is skipped if ``fut`` was cancelled.
        """
        self._queue.append((fn, fut, False))
        os.eventfd_write(self._fd, 1)

    def task(self) -> Generator[Any, Any, None]:
        """Run queued callables as they come (a kernel task)."""
        queue = self._queue
        while True:
            yield ReadWait(self._fd)
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._fd)
            done = 0
            while queue:
                if done == INBOX_BATCH:
                    done = 0
                    yield  # let other tasks run between bursts of commands
                    continue
                done += 1
                fn, fut, resolve = queue.popleft()
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    value = fn()
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    settle(fut, exc=exc)
                else:
                    if resolve:
                        fut.set_result(value)

    def close(self) -> None:
        """Fail what is still queued and close the eventfd."""
        while self._queue:
            _, fut, _ = self._queue.popleft()
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineNotReady("the engine is stopping"))
        os.close(self._fd)


class DurableWaits:
    """Futures resolved once the WAL is durable up to their seq (one wake each).

    Args:
        durable_seq: The WAL's durable seq when the engine starts.
    """

    def __init__(self, durable_seq: int) -> None:
        #: The last seq the WAL made durable.
        self.seq = durable_seq
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, Future[Any], Any]] = []
        self._order = itertools.count()
        self._failed: BaseException | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def when(self, seq: int, fut: Future[Any], value: Any = None) -> None:
        """Resolve ``fut`` with ``value`` once ``seq`` is durable (at once if it is)."""
        with self._lock:
            failed = self._failed
            if failed is None and seq > self.seq:
                heapq.heappush(self._heap, (seq, next(self._order), fut, value))
                return
        settle(fut, value, failed)

    def committed(self, seq: int) -> None:
        """The WAL is durable up to ``seq``: resolve the futures it covers (never blocks)."""
        ready = []
        with self._lock:
            self.seq = seq
            heap = self._heap
            while heap and heap[0][0] <= seq:
                ready.append(heapq.heappop(heap))
        for _seq, _order, fut, value in ready:
            settle(fut, value)

    def fail(self, exc: BaseException) -> None:
        """Fail every waiting future, and those that come later, with ``exc``."""
        with self._lock:
            self._failed = exc
            waiting, self._heap = self._heap, []
        for _seq, _order, fut, _value in waiting:
            settle(fut, exc=exc)
