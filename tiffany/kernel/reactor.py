"""The reactor: timers, descriptors and the thread pool of one scheduler.

Everything that wakes a task from outside the task tree lives here: the
timer heap (deadline, sequence, task) with lazy cancellation, the selector
(epoll) with one reader and one writer slot per descriptor, and the thread
pool whose completions arrive through an eventfd. The scheduler holds one
(``Scheduler._reactor``, as trio's ``Runner`` holds its ``IOManager``) and
drives it from its wait stage; the dispatch loop itself never touches it.

The reactor knows tasks only as records to wake: it reaches the scheduler
through the two callables it is given (``wake`` and ``unjoin``), never
through the scheduler's attributes.

Invariants: a timer entry is live only while it is its task's ``_timer``;
``io_waiting`` counts tasks parked in the selector; ``threads_pending``
counts thread jobs queued or running whose completion is still to come;
``outbox`` holds the jobs requested by the current pass, released after its
commit point. While ``halted`` (from :meth:`Reactor.halt` until
:meth:`Reactor.resume`) no job starts: the outbox is not released, delayed
jobs stay delayed, and the pool sets aside what it had not started.

Rejected: the reactor as a mixin of the scheduler (what it was). The two
shared a dozen private attributes both ways and the wait stage reached into
both; composed, each side's state has one owner and the interface between
them is the methods below.
"""

from __future__ import annotations

import errno
import heapq
import selectors
from collections.abc import Callable
from typing import Any, Final

from tiffany.errors import KernelError, WaitTimeout
from tiffany.kernel.calls import ReadWait, WaitTask, WriteWait
from tiffany.kernel.clock import Clock
from tiffany.kernel.task import Task, TaskState
from tiffany.kernel.threads import ThreadPool

__all__ = ["MAX_SELECT_TIMEOUT_S", "TIMER_COMPACT_FRACTION", "TIMER_COMPACT_MIN", "Reactor"]

#: The longest the selector blocks in one call, in seconds (asyncio's cap).
MAX_SELECT_TIMEOUT_S: Final = 24 * 3600.0

#: Compact the timer heap when more than this fraction of it is cancelled...
TIMER_COMPACT_FRACTION: Final = 0.5
#: ...and it holds at least this many entries.
TIMER_COMPACT_MIN: Final = 100

_BLOCKED_SLEEP = TaskState.BLOCKED_SLEEP

#: ``help(task, call, fn, args)``: runs a lone step job on the loop's thread
#: (True: the loop ran elsewhere meanwhile), or declines it (None).
Helper = Callable[[Task, Any, Callable[..., Any], tuple[Any, ...]], "bool | None"]


def _timed_call(clock: Clock, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run a ``Step(timed=True)``: ``[value, started, ended]`` on the scheduler's clock.

    A list, not a tuple: a journal stores a list as it is, a tuple as an
    extension type (a second encoding pass per step).
    """
    started = clock.time()
    value = fn(*args)
    return [value, started, clock.time()]


class Reactor:
    """Timers, selector and thread pool.

    Args:
        clock: The scheduler's clock (timers run on its ``monotonic``).
        wake: ``wake(task, value)``: make a parked task ready.
        unjoin: ``unjoin(task, tid)``: take ``task`` off the joiners of task ``tid``.
        max_threads: Size of the thread pool (started on first use).
    """

    def __init__(
        self,
        clock: Clock,
        wake: Callable[[Task, Any], None],
        unjoin: Callable[[Task, int], None],
        max_threads: int,
    ) -> None:
        self.clock = clock
        self._wake = wake
        self._unjoin = unjoin
        self.timers: list[tuple[float, int, Task]] = []
        self._timer_seq = 0
        self._timers_cancelled = 0
        self._selector: selectors.BaseSelector | None = None
        self.io_waiting = 0
        self._max_threads = max_threads
        self._pool: ThreadPool | None = None
        self.threads_pending = 0
        self.outbox: list[tuple[Task, Any]] = []
        #: How many of ``outbox`` are inline steps (they wake their task when released).
        self.outbox_inline = 0
        #: ``admit(call)``: how many seconds a thread job must wait before it
        #: starts (a rate limit), or None: every job starts at once.
        self.admit: Callable[[Any], float] | None = None
        #: Jobs ``admit`` delayed: ``(start at (monotonic), seq, task, call)``, a heap.
        self.delayed: list[tuple[float, int, Task, Any]] = []
        #: Set by :meth:`halt` (any thread): no job starts until :meth:`resume`.
        self.halted = False
        #: The pool's start gate (``ThreadPool.gate``), kept for a pool made later.
        self._gate: Callable[[], bool] | None = None

    @property
    def busy(self) -> bool:
        """True while something here can still wake a task (or is about to start)."""
        return bool(self.timers or self.io_waiting or self.threads_pending or self.outbox)

    @property
    def in_flight(self) -> int:
        """Thread jobs begun and not yet delivered (``ThreadPool.in_flight``)."""
        pool = self._pool
        return 0 if pool is None else pool.in_flight

    def close(self) -> int:
        """Stop the thread pool and release the selector; return the jobs never started.

        Jobs in flight in the pool finish; the ones it had not started, the
        outbox and the delayed jobs are discarded (their tasks stay parked).
        """
        self.halt()
        discarded = len(self.outbox) + len(self.delayed)
        self.outbox, self.delayed = [], []
        self.outbox_inline = 0
        if self._pool is not None:
            discarded += self._pool.close()
        if self._selector is not None:
            self._selector.close()
        return discarded

    def halt(self) -> None:
        """Start no job from now on (any thread, a signal handler included).

        Discussion: the flag first, then the pool, and :meth:`release` reads
        the flag after it made the pool: whichever of the two threads comes
        second sees the other's write, so no job starts once this returned.
        """
        self.halted = True
        pool = self._pool
        if pool is not None:
            pool.halt()

    def set_gate(self, gate: Callable[[], bool] | None) -> None:
        """Ask ``gate()`` before each thread job starts (``ThreadPool.gate``)."""
        self._gate = gate
        if self._pool is not None:
            self._pool.gate = gate

    def reopen(self) -> None:
        """The gate opened again (any thread): jobs it set aside may start."""
        if self._pool is not None:
            self._pool.reopen()

    def resume(self) -> None:
        """Let jobs start again (the scheduler, as its loop starts)."""
        self.halted = False
        if self._pool is not None:
            self._pool.resume()

    # -- waiting ---------------------------------------------------------------

    def timeout(self) -> float | None:
        """How long the wait stage may block with nothing ready (None: until an event)."""
        due = self.timers[0][0] if self.timers else None
        if self.delayed and (due is None or self.delayed[0][0] < due):
            due = self.delayed[0][0]
        if due is not None:
            delay = min(max(0.0, due - self.clock.monotonic()), MAX_SELECT_TIMEOUT_S)
            return self.clock.wait_timeout(delay)
        return None

    def poll(self, timeout: float | None, idle: bool) -> int:
        """Wait up to ``timeout`` for events, then fire due timers; return the tasks woken.

        ``idle``: nothing is ready, so a manual clock may jump to the next deadline.
        """
        woken = 0
        if self.io_waiting or self.threads_pending:
            woken = self._select(timeout)
        elif timeout:
            (self._selector or self._make_selector()).select(timeout)
        timers = self.timers
        if timers:
            now = self.clock.monotonic()
            if idle and not woken and timers[0][0] > now:
                self.clock.idle(timers[0][0])
                now = self.clock.monotonic()
            woken += self._fire_timers(now)
        if self.delayed:
            self._start_delayed(self.clock.monotonic())
        return woken

    def _start_delayed(self, now: float) -> None:
        """Start the delayed jobs whose time has come (see ``admit``)."""
        delayed, pool = self.delayed, self._pool
        while delayed and delayed[0][0] <= now and not self.halted:
            _, _, task, job = heapq.heappop(delayed)
            call: Any = job
            if pool is None or task.blocked_on is not job:  # killed while it waited
                self.threads_pending -= 1
                continue
            fn, args = call.fn, call.args
            if getattr(call, "timed", False):
                fn, args = _timed_call, (self.clock, fn, args)
            pool.submit((task, call), fn, args)

    def _make_selector(self) -> selectors.BaseSelector:
        self._selector = selectors.DefaultSelector()
        return self._selector

    def _select(self, timeout: float | None) -> int:
        sel = self._selector or self._make_selector()
        woken = 0
        pool = self._pool
        for key, mask in sel.select(timeout):
            if pool is not None and key.fd == pool.fileno():
                woken += self._thread_completions(pool)
            else:
                woken += self._io_ready(sel, key, mask)
        return woken

    def _io_ready(self, sel: selectors.BaseSelector, key: selectors.SelectorKey, mask: int) -> int:
        waiters: list[Task | None] = key.data
        left = key.events
        woken = 0
        for slot, event in ((0, selectors.EVENT_READ), (1, selectors.EVENT_WRITE)):
            task = waiters[slot]
            if mask & event and task is not None:
                waiters[slot] = None
                left &= ~event
                self.io_waiting -= 1
                self._wake(task, None)
                woken += 1
        if left:
            sel.modify(key.fd, left, waiters)
        else:
            sel.unregister(key.fd)
        return woken

    # -- timers ------------------------------------------------------------------

    def add_timer(self, task: Task, deadline: float) -> None:
        """Wake ``task`` at ``deadline`` (on the clock's ``monotonic``)."""
        self._timer_seq += 1
        entry = (deadline, self._timer_seq, task)
        task._timer = entry
        heapq.heappush(self.timers, entry)

    def cancel_timer(self, task: Task) -> None:
        """Forget ``task``'s timer, if it has one (lazily: the entry stays in the heap)."""
        if task._timer is not None:
            task._timer = None
            self._timers_cancelled += 1
            n = len(self.timers)
            if n >= TIMER_COMPACT_MIN and self._timers_cancelled > n * TIMER_COMPACT_FRACTION:
                self.timers = [e for e in self.timers if e[2]._timer is e]
                heapq.heapify(self.timers)
                self._timers_cancelled = 0

    def purge_timers(self) -> None:
        """Drop cancelled entries from the top of the heap.

        Discussion: cancellation is lazy, so a cancelled entry may still sit
        at the top. Left there it would set the selector's timeout (the loop
        would sleep until a deadline nobody waits for) and keep ``run`` from
        returning; popping them here keeps the top of the heap live.
        """
        timers = self.timers
        while timers and timers[0][2]._timer is not timers[0]:
            heapq.heappop(timers)
            self._timers_cancelled -= 1

    def _fire_timers(self, now: float) -> int:
        timers = self.timers
        woken = 0
        while timers and timers[0][0] <= now:
            entry = heapq.heappop(timers)
            task = entry[2]
            if task._timer is not entry:
                self._timers_cancelled -= 1
                continue
            task._timer = None
            woken += 1
            if task.state is _BLOCKED_SLEEP:
                self._wake(task, None)
            else:
                self._timed_out(task)
        return woken

    def _timed_out(self, task: Task) -> None:
        """A timed wait's deadline passed: a join (``WaitTask``) or a ``Receive``."""
        call = task.blocked_on
        if isinstance(call, WaitTask):
            self._unjoin(task, call.tid)
            task._throw = WaitTimeout(
                f"task {call.tid} did not finish within {call.timeout} s",
                tid=call.tid,
                timeout=call.timeout,
            )
        else:  # a Receive: the layer that parked it drops stale receivers itself
            timeout = getattr(call, "timeout", None)
            task._throw = WaitTimeout(
                f"{getattr(call, 'kind', 'wait')} timed out after {timeout} s", timeout=timeout
            )
        self._wake(task, None)

    # -- descriptors -------------------------------------------------------------

    def io_wait(self, task: Task, fd: int, event: int) -> BaseException | None:
        """Register ``task`` to wake when ``fd`` is ready for ``event``.

        Returns None when registered (the caller parks the task), or the
        error to throw into the task instead (a closed or doubly waited fd).
        """
        sel = self._selector or self._make_selector()
        slot = 0 if event == selectors.EVENT_READ else 1
        try:
            key = sel.get_key(fd)
        except ValueError as exc:  # a negative descriptor: a closed socket's fileno()
            return exc
        except KeyError:
            waiters: list[Task | None] = [None, None]
            waiters[slot] = task
            try:
                sel.register(fd, event, waiters)
            except (OSError, ValueError) as exc:
                return exc
        else:
            waiters = key.data
            other = waiters[slot]
            if other is not None:
                return KernelError(
                    f"fd {fd} is already waited on by task {other.id}", fd=fd, tid=other.id
                )
            try:
                sel.modify(fd, key.events | event, waiters)
            except OSError as exc:
                self._orphan(fd, waiters)
                return exc
            waiters[slot] = task
        self.io_waiting += 1
        return None

    def _orphan(self, fd: int, waiters: list[Task | None]) -> None:
        """Wake the waiters of a descriptor closed under them with EBADF.

        The descriptor was closed under a parked waiter and its number reused:
        epoll forgot it (ENOENT) and the selector dropped the stale key. A
        task-level error, not a kernel one.
        """
        for i, orphan in enumerate(waiters):
            if orphan is not None:
                waiters[i] = None
                self.io_waiting -= 1
                orphan._throw = OSError(errno.EBADF, f"fd {fd} was closed while waited on")
                self._wake(orphan, None)

    def io_forget(self, task: Task, call: ReadWait | WriteWait) -> None:
        """Take ``task`` off the selector (it was killed while waiting)."""
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
            self.io_waiting -= 1
            left = key.events & ~(selectors.EVENT_READ if slot == 0 else selectors.EVENT_WRITE)
            try:
                if left:
                    sel.modify(call.fd, left, waiters)
                else:
                    sel.unregister(call.fd)
            except (OSError, ValueError, KeyError):
                pass  # the descriptor was closed under us; epoll dropped it already

    # -- threads -----------------------------------------------------------------

    def submit(self, task: Task, call: Any) -> None:
        """Queue ``call.fn(*call.args)`` for ``task``; it starts at :meth:`release`."""
        self.outbox.append((task, call))
        self.threads_pending += 1
        if getattr(call, "inline", False):
            self.outbox_inline += 1

    def release(self, helper: Helper | None = None) -> bool:
        """Start the queued jobs: in the pool, or here for inline steps (unless halted).

        ``helper``: when given and the outbox holds a lone ``Step`` job and
        nothing else is pending, it is offered the job
        (``Scheduler._help``, which may decline: the pool runs it). True:
        it ran, and the loop ran on another thread meanwhile (``sysmon.py``).
        """
        if self.halted:
            return False
        pool = self._pool
        if pool is None:
            pool = self._pool = ThreadPool(self._max_threads)
            pool.gate = self._gate
            sel = self._selector or self._make_selector()
            sel.register(pool.fileno(), selectors.EVENT_READ, None)
            if self.halted:  # halted while the pool was made (see ``halt``)
                pool.halt()
        outbox, self.outbox = self.outbox, []
        self.outbox_inline = 0
        admit = self.admit
        lone = helper is not None and len(outbox) == 1 and self.threads_pending == 1
        for task, call in outbox:
            if admit is not None and not getattr(call, "inline", False):
                delay = admit(call)
                if delay > 0:  # a rate limit: start it later (still pending)
                    self._timer_seq += 1
                    start = self.clock.monotonic() + delay
                    heapq.heappush(self.delayed, (start, self._timer_seq, task, call))
                    continue
            fn, args = call.fn, call.args
            if getattr(call, "timed", False):
                fn, args = _timed_call, (self.clock, fn, args)
            if task.blocked_on is not call:  # killed before it started
                self.threads_pending -= 1
            elif getattr(call, "inline", False):
                if self.halted:  # halted meanwhile (a signal handler): it stays unstarted
                    self.outbox.append((task, call))
                    self.outbox_inline += 1
                    continue
                self.threads_pending -= 1
                self._run_inline(task, fn, args)
            else:
                if (
                    lone
                    and getattr(call, "inline", None) is False
                    and (self._gate is None or self._gate())
                ):
                    took = helper(task, call, fn, args)  # type: ignore[misc]
                    if took is not None:
                        return took
                pool.submit((task, call), fn, args)
        return False

    def complete(self, token: tuple[Task, Any], value: Any, exc: BaseException | None) -> None:
        """Hand in a job's outcome as a worker would (the pool exists: the job was released)."""
        assert self._pool is not None
        self._pool.complete((token, value, exc))

    def nudge(self) -> None:
        """Make a wait for thread completions return (any thread)."""
        if self._pool is not None:
            self._pool.nudge()

    def _run_inline(self, task: Task, fn: Any, args: tuple[Any, ...]) -> None:
        """Run a quick step on this thread; its outcome wakes the task now."""
        try:
            value = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the step's outcome, delivered to the task
            task._throw = exc
            value = None
        self._wake(task, value)

    def _thread_completions(self, pool: ThreadPool) -> int:
        woken = 0
        for (task, call), value, exc in pool.drain():
            self.threads_pending -= 1
            if task.blocked_on is not call:
                continue  # the task was killed meanwhile
            if exc is not None:
                task._throw = exc
                value = None
            self._wake(task, value)
            woken += 1
        return woken
