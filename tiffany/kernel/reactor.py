"""The reactor half of the scheduler: timers, descriptors and the thread pool.

Everything that wakes a task from outside the task tree lives here: the
timer heap (deadline, sequence, task) with lazy cancellation, the selector
(epoll) with one reader and one writer slot per descriptor, and the thread
pool whose completions arrive through an eventfd. The scheduler's wait
stage drives it; the loop itself never touches these structures.

Invariants: a timer entry is live only while it is its task's ``_timer``;
``_io_waiting`` counts tasks parked in the selector; ``_threads_pending``
counts thread jobs queued or running whose completion is still to come.
"""

from __future__ import annotations

import errno
import heapq
import selectors
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from tiffany.errors import KernelError, WaitTimeout
from tiffany.kernel.calls import ReadWait, SystemCall, WaitTask, WriteWait
from tiffany.kernel.clock import Clock
from tiffany.kernel.instrument import InstrumentSet
from tiffany.kernel.task import Task, TaskState
from tiffany.kernel.threads import ThreadPool

__all__ = ["MAX_SELECT_TIMEOUT_S", "TIMER_COMPACT_FRACTION", "TIMER_COMPACT_MIN", "Reactor"]

#: The longest the selector blocks in one call, in seconds (asyncio's cap).
MAX_SELECT_TIMEOUT_S: Final = 24 * 3600.0

#: Compact the timer heap when more than this fraction of it is cancelled...
TIMER_COMPACT_FRACTION: Final = 0.5
#: ...and it holds at least this many entries.
TIMER_COMPACT_MIN: Final = 100


def _timed_call(clock: Clock, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run a ``Step(timed=True)``: ``[value, started, ended]`` on the scheduler's clock.

    A list, not a tuple: a journal stores a list as it is, a tuple as an
    extension type (a second encoding pass per step).
    """
    started = clock.time()
    value = fn(*args)
    return [value, started, clock.time()]


class Reactor:
    """Timers, selector and thread pool, mixed into the scheduler."""

    clock: Clock
    _tasks: dict[int, Task]
    _ready: deque[Task]
    _instruments: InstrumentSet
    _deferred: list[tuple[Task, Any, BaseException | None]]
    _injectors: list[Callable[[], None]]
    _fatal: BaseException | None

    def __init__(self, max_threads: int) -> None:
        # Timers: a heap of (deadline, sequence, task); an entry is live only
        # while it is the task's ``_timer`` (lazy cancellation).
        self._timers: list[tuple[float, int, Task]] = []
        self._timer_seq = 0
        self._timers_cancelled = 0
        self._selector: selectors.BaseSelector | None = None
        self._io_waiting = 0
        self._max_threads = max_threads
        self._pool: ThreadPool | None = None
        self._threads_pending = 0
        self._outbox: list[tuple[Task, Any]] = []
        #: While true, the wait stage keeps the effects tasks requested (thread
        #: jobs, inline steps) queued instead of releasing them. The instrument
        #: that makes records durable sets it when it defers a commit at the
        #: commit point (group commit across passes), and clears it when it
        #: commits: effects still never leave before their records.
        self.effects_held = False
        # Set by Scheduler.stop: the wait stage returns at once.
        self._stop_requested = False

    def wake(self, task: Task, value: Any = None) -> None:
        """Make a parked task ready (the scheduler implements it)."""
        raise NotImplementedError

    def park(self, task: Task, call: SystemCall, state: TaskState) -> Any:
        """Mark a task blocked (the scheduler implements it)."""
        raise NotImplementedError

    def _call_hook(self, hook: Callable[..., None], *args: Any) -> None:
        raise NotImplementedError

    # -- the wait stage ------------------------------------------------------------

    def _wait(self) -> bool:
        """Commit, release effects, poll for events and fire due timers.

        Returns False when nothing is ready and nothing can ever wake a task.
        """
        if self._stop_requested:
            return True  # back to the top of the loop, which stops (Scheduler.stop)
        hooks = self._instruments.hooks
        clock = self.clock
        self._purge_timers()
        timers = self._timers
        if self._ready and not (
            timers
            or self._io_waiting
            or self._threads_pending
            or self._outbox
            or self._deferred
            or self._injectors
        ):
            # Fast path: only the hooks want this stage (the commit point).
            if hooks["before_wait"] is not None:
                self._call_hook(hooks["before_wait"], 0.0)
            if hooks["after_wait"] is not None:
                self._call_hook(hooks["after_wait"], 0)
            if self._fatal is not None:
                raise self._fatal
            return True
        if self._ready or self._outbox or self._deferred or self._injectors:
            timeout: float | None = 0.0
        elif timers:
            timeout = min(max(0.0, timers[0][0] - clock.monotonic()), MAX_SELECT_TIMEOUT_S)
            timeout = clock.wait_timeout(timeout)
        elif self._io_waiting or self._threads_pending:
            timeout = None
        else:
            timeout = -1.0  # nothing to wait for
        if hooks["before_wait"] is not None:
            self._call_hook(hooks["before_wait"], None if timeout == -1.0 else timeout)
            if self._fatal is not None:
                raise self._fatal
        woken = 0
        for inject in self._injectors:
            inject()
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for task, value, error in deferred:
                if error is not None:
                    task._throw = error
                self.wake(task, value)
                woken += 1
        if not self._ready and not self._wait_possible():
            if hooks["after_wait"] is not None:
                self._call_hook(hooks["after_wait"], woken)
            return False
        if timeout == -1.0 or (timeout == 0.0 and not self._ready and self._injectors):
            # An injector found nothing to deliver yet: wait for real events.
            blocks_now = timeout == 0.0
            timeout = self._live_timeout()
            if blocks_now and timeout != 0.0 and hooks["before_wait"] is not None:
                # The commit point was passed with 0 (injectors might have
                # made tasks ready); the loop blocks after all, so the hooks
                # hear it: a group commit must not sit in a buffer while the
                # loop sleeps.
                self._call_hook(hooks["before_wait"], timeout)
                if self._fatal is not None:
                    raise self._fatal
        if self._outbox and not self.effects_held:
            self._release_outbox()
            if self._ready:  # inline steps completed: do not block
                timeout = 0.0
        if self._io_waiting or self._threads_pending:
            woken += self._poll(timeout)
        elif timeout:
            self._sleep(timeout)
        if timers:
            now = clock.monotonic()
            if timers[0][0] > now and not woken and not self._ready:
                clock.idle(timers[0][0])
                now = clock.monotonic()
            woken += self._fire_timers(now)
        if hooks["after_wait"] is not None:
            self._call_hook(hooks["after_wait"], woken)
            if self._fatal is not None:
                raise self._fatal
        return True

    def _live_timeout(self) -> float | None:
        if self._ready or self._outbox:
            return 0.0
        if self._timers:
            timeout = min(
                max(0.0, self._timers[0][0] - self.clock.monotonic()), MAX_SELECT_TIMEOUT_S
            )
            return self.clock.wait_timeout(timeout)
        return None

    def _wait_possible(self) -> bool:
        return bool(self._timers or self._io_waiting or self._threads_pending or self._outbox)

    # -- task life -----------------------------------------------------------

    def start_thread(self, task: Task, call: Any) -> Any:
        """Park ``task`` on ``call`` and run ``call.fn(*call.args)`` in the pool.

        The job starts after the current pass's commit point; its outcome
        wakes the task at a wait stage. Returns :data:`PARKED` (for handlers).
        """
        self._outbox.append((task, call))
        self._threads_pending += 1
        return self.park(task, call, TaskState.BLOCKED_THREAD)

    def _sleep(self, timeout: float) -> None:
        sel = self._selector or self._make_selector()
        sel.select(timeout)

    def _make_selector(self) -> selectors.BaseSelector:
        self._selector = selectors.DefaultSelector()
        return self._selector

    def _poll(self, timeout: float | None) -> int:
        sel = self._selector or self._make_selector()
        woken = 0
        pool = self._pool
        for key, mask in sel.select(timeout):
            if pool is not None and key.fd == pool.fileno():
                woken += self._thread_completions(pool)
                continue
            waiters: list[Task | None] = key.data
            left = key.events
            if mask & selectors.EVENT_READ and waiters[0] is not None:
                task, waiters[0] = waiters[0], None
                left &= ~selectors.EVENT_READ
                self._io_waiting -= 1
                self.wake(task)
                woken += 1
            if mask & selectors.EVENT_WRITE and waiters[1] is not None:
                task, waiters[1] = waiters[1], None
                left &= ~selectors.EVENT_WRITE
                self._io_waiting -= 1
                self.wake(task)
                woken += 1
            if left:
                sel.modify(key.fd, left, waiters)
            else:
                sel.unregister(key.fd)
        return woken

    def _fire_timers(self, now: float) -> int:
        timers = self._timers
        woken = 0
        while timers and timers[0][0] <= now:
            entry = heapq.heappop(timers)
            task = entry[2]
            if task._timer is not entry:
                self._timers_cancelled -= 1
                continue
            task._timer = None
            woken += 1
            if task.state is TaskState.BLOCKED_SLEEP:
                self.wake(task, None)
            else:  # a WaitTask timeout
                call = task.blocked_on
                assert isinstance(call, WaitTask)
                target = self._tasks.get(call.tid)
                if target is not None and target.joiners and task in target.joiners:
                    target.joiners.remove(task)
                task._throw = WaitTimeout(
                    f"task {call.tid} did not finish within {call.timeout} s",
                    tid=call.tid,
                    timeout=call.timeout,
                )
                self.wake(task, None)
        return woken

    def _add_timer(self, task: Task, deadline: float) -> None:
        self._timer_seq += 1
        entry = (deadline, self._timer_seq, task)
        task._timer = entry
        heapq.heappush(self._timers, entry)

    def _purge_timers(self) -> None:
        """Drop cancelled entries from the top of the heap.

        Discussion: cancellation is lazy, so a cancelled entry may still sit
        at the top. Left there it would set the selector's timeout (the loop
        would sleep until a deadline nobody waits for) and keep ``run`` from
        returning; popping them here keeps the top of the heap live.
        """
        timers = self._timers
        while timers and timers[0][2]._timer is not timers[0]:
            heapq.heappop(timers)
            self._timers_cancelled -= 1

    def _cancel_timer(self, task: Task) -> None:
        if task._timer is not None:
            task._timer = None
            self._timers_cancelled += 1
            n = len(self._timers)
            if n >= TIMER_COMPACT_MIN and self._timers_cancelled > n * TIMER_COMPACT_FRACTION:
                self._timers = [e for e in self._timers if e[2]._timer is e]
                heapq.heapify(self._timers)
                self._timers_cancelled = 0

    def _io_wait(self, task: Task, fd: int, event: int, call: SystemCall) -> Any:
        sel = self._selector or self._make_selector()
        slot = 0 if event == selectors.EVENT_READ else 1
        try:
            key = sel.get_key(fd)
        except ValueError as exc:  # a negative descriptor: a closed socket's fileno()
            task._throw = exc
            return None
        except KeyError:
            waiters: list[Task | None] = [None, None]
            waiters[slot] = task
            try:
                sel.register(fd, event, waiters)
            except (OSError, ValueError) as exc:
                task._throw = exc
                return None
        else:
            waiters = key.data
            other = waiters[slot]
            if other is not None:
                task._throw = KernelError(
                    f"fd {fd} is already waited on by task {other.id}", fd=fd, tid=other.id
                )
                return None
            try:
                sel.modify(fd, key.events | event, waiters)
            except OSError as exc:
                # The descriptor was closed under a parked waiter and its
                # number reused: epoll forgot it (ENOENT) and the selector
                # dropped the stale key. A task-level error, not a kernel one;
                # the waiter parked on the old descriptor gets EBADF.
                for i, orphan in enumerate(waiters):
                    if orphan is not None:
                        waiters[i] = None
                        self._io_waiting -= 1
                        orphan._throw = OSError(errno.EBADF, f"fd {fd} was closed while waited on")
                        self.wake(orphan)
                task._throw = exc
                return None
            waiters[slot] = task
        self._io_waiting += 1
        return self.park(task, call, TaskState.BLOCKED_IO)

    def _io_forget(self, task: Task, call: ReadWait | WriteWait) -> None:
        sel = self._selector
        if sel is None:
            return
        try:
            key = sel.get_key(call.fd)
        except KeyError:
            return
        waiters = key.data
        slot = 0 if isinstance(call, ReadWait) else 1
        if waiters[slot] is task:
            waiters[slot] = None
            self._io_waiting -= 1
            left = key.events & ~(selectors.EVENT_READ if slot == 0 else selectors.EVENT_WRITE)
            try:
                if left:
                    sel.modify(call.fd, left, waiters)
                else:
                    sel.unregister(call.fd)
            except (OSError, ValueError, KeyError):
                pass  # the descriptor was closed under us; epoll dropped it already

    def _release_outbox(self) -> None:
        pool = self._pool
        if pool is None:
            pool = self._pool = ThreadPool(self._max_threads)
            sel = self._selector or self._make_selector()
            sel.register(pool.fileno(), selectors.EVENT_READ, None)
        outbox, self._outbox = self._outbox, []
        for task, call in outbox:
            fn, args = call.fn, call.args
            if getattr(call, "timed", False):
                fn, args = _timed_call, (self.clock, fn, args)
            if task.blocked_on is not call:  # killed before it started
                self._threads_pending -= 1
            elif getattr(call, "inline", False):
                self._threads_pending -= 1
                self._run_inline(task, fn, args)
            else:
                pool.submit((task, call), fn, args)

    def _run_inline(self, task: Task, fn: Any, args: tuple[Any, ...]) -> None:
        """Run a quick step on this thread; its outcome wakes the task now."""
        try:
            value = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the step's outcome, delivered to the task
            task._throw = exc
            value = None
        self.wake(task, value)

    def _thread_completions(self, pool: ThreadPool) -> int:
        woken = 0
        for (task, call), value, exc in pool.drain():
            self._threads_pending -= 1
            if task.blocked_on is not call:
                continue  # the task was killed meanwhile
            if exc is not None:
                task._throw = exc
                value = None
            self.wake(task, value)
            woken += 1
        return woken
