"""The scheduler: a single-threaded loop that runs generator-based tasks.

This is the Tiffany kernel (Beazley's PyOS and curio lineage). Design
principles, in the manner of curio's kernel header:

* **Microkernel.** The loop runs tasks and handles system calls; nothing
  else. The journal, the activity log and metrics attach as instruments
  (``instrument.py``); the kernel imports none of them.
* **Determinism.** A FIFO ready queue; each pass runs only the tasks that
  were ready when it began (asyncio's ``_run_once``); task ids come from a
  per-scheduler counter; time and randomness come from an injected clock and
  a seeded generator, reached by tasks only through system calls. For the
  same sequence of external events (I/O readiness, thread completions, timer
  expiries) the dispatch order is the same.
* **Task errors are task outcomes; kernel errors are fatal.** A task that
  raises is recorded as crashed and its joiners are told; the loop goes on.
  A misuse (yielding garbage) becomes an exception thrown into the task. An
  exception escaping a handler is a kernel bug and stops the loop as
  :class:`~tiffany.errors.KernelInternalError`.
* **The loop never blocks** except in the selector, when nothing is ready.

One loop iteration (see :meth:`Scheduler.run`):

1. *dispatch*: run each task that was ready at the start of the pass until it
   yields; handle what it yielded. Calls that complete at once resume the
   same task (up to ``MAX_IMMEDIATE_RESUMES``); a bare ``yield`` requeues it.
2. *commit*: the injectors (replay's recorded wake-ups), then the
   ``before_wait`` hook once (the journal's group commit), then the effects
   the pass requested (thread jobs) are released unless the hook held them
   or the scheduler was stopped (``stop``: from then on nothing starts).
3. *wait*: poll the reactor's selector (blocking only if nothing is ready)
   and fire due timers; woken tasks join the ready queue for the next pass.

The reactor (``reactor.py``: timers, selector, thread pool) is a part the
scheduler holds, not a base class. Layers above reach the kernel through
the public methods under "ports" below (``find``, ``throw``, ``wake_at``,
``hold_effects``...), never through its attributes.

Handlers are plain functions ``handler(sched, task, call)`` looked up by the
call's exact type in a table built once. A handler returns the value to send
into the task at once, or :data:`PARKED` when the task is parked or
requeued; to raise in the task at once a kernel handler sets ``task._throw``
and returns None (a handler from a layer above returns the value, or parks
the task and later wakes it with :meth:`Scheduler.wake` or
:meth:`Scheduler.throw`).
"""

from __future__ import annotations

import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final

import structlog

from tiffany.errors import (
    InstrumentFailure,
    KernelError,
    KernelInternalError,
    SystemCallMisuse,
    TaskCancelled,
    TiffanyError,
    UnknownTask,
)
from tiffany.kernel.calls import Coroutine, SystemCall
from tiffany.kernel.clock import Clock, MonotonicClock
from tiffany.kernel.entropy import Entropy
from tiffany.kernel.handlers import HANDLERS, UNPARKERS, Handler, Unparker
from tiffany.kernel.instrument import Instrument, InstrumentSet
from tiffany.kernel.markers import PARKED, RETURNED, CloseTask, join_error
from tiffany.kernel.reactor import Reactor
from tiffany.kernel.sync import QueueGet, queue_get
from tiffany.kernel.sysmon import DEFAULT_BOUND_S, Sysmon
from tiffany.kernel.task import Task, TaskState

__all__ = [
    "MAX_IMMEDIATE_RESUMES",
    "PARKED",
    "RETURNED",
    "Handler",
    "Scheduler",
    "current_task",
]

log = structlog.get_logger("tiffany.kernel")

#: Consecutive immediate resumes of one task before it must requeue.
MAX_IMMEDIATE_RESUMES: Final = 100

_READY = TaskState.READY
_RUNNING = TaskState.RUNNING
_BLOCKED_SYNC = TaskState.BLOCKED_SYNC
_QUEUE_GET = QueueGet
_GENERATOR = types.GeneratorType
_Hook = Callable[..., None]
#: The scheduler running on this thread (``Scheduler.run`` sets it): :func:`current_task`.
_running = threading.local()
#: ``_wait_timeout`` when nothing can wake a task (the hook hears ``None``).
_NOTHING_TO_WAIT_FOR: Final = -1.0
#: What ``_loop`` returns when it ended for a stop, or on a substitute when
#: the helped call's thread took the loop back (see ``sysmon.py``).
_STOPPED: Final = "stopped"
_HANDED_BACK: Final = "handed back"


def current_task() -> Task | None:
    """Return the task this thread's scheduler is dispatching, or None.

    For code that a task calls (not yields), which must know which task it
    runs in: a workflow's ``tool(...)`` finds its run through the task's
    inherited ``context`` (``tiffany/workflows``). None outside a dispatch
    (another thread, a handler between passes, no scheduler running).

    Discussion: trio's ``current_task()``. The loop pays one attribute store
    per turn; nothing else reads it. Rejected: a system call answering the
    context, which costs a journaled dispatch for every call that needs it.
    """
    sched = getattr(_running, "sched", None)
    return sched.current if sched is not None else None


class Scheduler:
    """Runs tasks until none is left.

    Args:
        clock: Where time comes from (default: the real clock).
        seed: Seed of the generator behind ``Random()``.
        instruments: Observers to attach (see :class:`Instrument`).
        max_threads: Size of the ``RunInThread`` pool.
        handlers: Extra ``{call type: handler}`` entries (extensions such as
            the durable layer's system calls).
        help_bound_s: A lone ``Step(fn)`` (nothing else ready or pending) runs
            on the loop's thread, and one that runs longer than this is
            handed the loop's passes to another thread (``sysmon.py``);
            0 sends every step to the pool.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        seed: int = 0,
        instruments: Iterable[Instrument] = (),
        max_threads: int = 8,
        handlers: dict[type[SystemCall], Handler] | None = None,
        help_bound_s: float = DEFAULT_BOUND_S,
    ) -> None:
        self.clock: Clock = clock or MonotonicClock()
        self._reactor = Reactor(self.clock, self.wake, self.remove_joiner, max_threads)
        # While true, the wait stage keeps the effects tasks requested queued
        # (see ``hold_effects``).
        self._effects_held = False
        # Set by ``stop``: the loop returns before the next pass. Also set,
        # with ``_handback``, to make a substitute return (``_ask_back``);
        # ``_stop_asked`` then tells whether a stop was asked as well.
        self._stop_requested = False
        self._stop_asked = False
        self._handback = False
        # The monitor of helped steps, and how a substitute's loop ended.
        self._sysmon = Sysmon(self._substitute, help_bound_s) if help_bound_s > 0 else None
        self._sub_outcome: Any = None
        self.entropy = Entropy(seed)
        self._ready: deque[Task] = deque()
        self._tasks: dict[int, Task] = {}
        self._next_id = 1
        self._alive = 0
        self._handlers: dict[type, Handler] = dict(HANDLERS)
        if handlers:
            self._handlers.update(handlers)
        self._unparkers: dict[type, Unparker] = dict(UNPARKERS)
        # Wake-ups handed to the next wait stage (see ``defer_wake``), and
        # callables run at every wait stage (see ``add_injector``).
        self._deferred: list[tuple[Task, Any, BaseException | None]] = []
        self._injectors: list[Callable[[], None]] = []
        self._instruments = InstrumentSet(self._hooks_changed, self._instrument_fatal)
        self._hooks_dirty = True
        self._fatal: BaseException | None = None
        self._running = False
        self._closed = False
        #: How many turns (a task run until it parks or requeues) so far.
        self.turns = 0
        #: The task being dispatched (None between passes): :func:`current_task`.
        self.current: Task | None = None
        # Hooks the handlers call (the loop keeps its own locals).
        self._on_block: Callable[[Task, SystemCall], None] | None = None
        self._on_wake: Callable[[Task, Any], None] | None = None
        self._on_spawn: Callable[[Task], None] | None = None
        for inst in instruments:
            self.add_instrument(inst)

    # -- public API ----------------------------------------------------------

    def spawn(self, coro: Coroutine, name: str | None = None, *, daemon: bool = False) -> int:
        """Create a top-level task running ``coro``; return its id."""
        return self._spawn(coro, name, None, daemon).id

    def run(self) -> None:
        """Run until no task is left (or none can ever run again).

        Raises:
            InstrumentFailure: A critical instrument (the journal) failed.
            KernelInternalError: A bug in the kernel.
        """
        if self._running:
            raise KernelError("the scheduler is already running")
        if self._closed:
            raise KernelError("the scheduler is closed")
        self._running = True
        outer = getattr(_running, "sched", None)
        _running.sched = self
        sysmon = self._sysmon
        if sysmon is not None:
            sysmon.claim.acquire()  # this thread runs the loop (sysmon.py's invariants)
        self._hooks_dirty = True  # the loop's cached hooks are its own: a new loop reads them
        hooks = self._instruments.hooks
        if not self._stop_requested:  # stopped before it ran: it returns at once
            self._reactor.resume()
        try:
            before_run = hooks["before_run"]
            if before_run is not None:
                before_run()
            self._loop()
        finally:
            # Whatever ended the loop (stop, a critical instrument's failure,
            # a kernel bug, no task left), nothing starts until it runs again.
            self._reactor.halt()
            self._running = False
            self.current = None
            _running.sched = outer
            after_run = hooks["after_run"]
            try:
                if after_run is not None:
                    after_run()
            finally:
                if sysmon is not None:
                    sysmon.claim.release()

    def wake(self, task: Task, value: Any = None) -> None:
        """Make the parked ``task`` ready; ``value`` is what its yield returns.

        For kernel primitives (``Queue.put``, ``Event.set``); callable from
        task code running on this scheduler, never from another thread.
        """
        self._reschedule(task, value)
        on_wake = self._on_wake
        if on_wake is not None:
            on_wake(task, value)
        task.blocked_on = None

    def kill(self, tid: int) -> bool:
        """Cancel task ``tid`` from outside any task (as ``KillTask`` does).

        Returns True if the task was alive. Call it from the scheduler's
        thread (an injector, a hook or before ``run``), never from another.
        """
        target = self._tasks.get(tid)
        if target is None or target.finished:
            return False
        self._kill(target, None)
        return True

    def stop(self) -> None:
        """Start no effect from now on, and make :meth:`run` return before the next pass.

        Nothing is killed or closed: a journaled run stays unfinished in the
        WAL and is resumed by recovery, and ``run`` may be called again
        (effects start again then). Any thread may call it, a signal handler
        included; from another thread, wake the loop afterwards if it may be
        waiting for events (the engine's inbox does).

        Once it returned no effect starts: thread jobs not yet started stay
        unstarted (a job a worker runs already finishes), effects held or
        requested by this pass are not released, and a generator step whose
        task has not begun does not begin. A step so left is journaled as
        started and not finished, and recovery runs it once, as a re-run.
        """
        self._stop_asked = True  # first: see ``_reclaimed``
        self._stop_requested = True
        self._reactor.halt()

    def drain(self, timeout: float) -> int:
        """After a stop, wait up to ``timeout`` s for the thread jobs in flight; return those left.

        Only wait stages run, and they start nothing (the scheduler stays
        halted): no task is dispatched, but the completions of the jobs a
        worker had begun are delivered to their tasks, which the journal
        records as wake-ups and commits (``before_wait``, ``after_run``).
        Recovery then finds those steps ended and does not run them again;
        without a drain each was journaled as started only and ran twice.
        Timers and descriptors that fire meanwhile wake their tasks too
        (recorded the same way); the tasks run when ``run`` runs again, or
        are replayed by the next start.

        Call it from the scheduler's thread once :meth:`run` returned
        halted (a :meth:`stop`). A critical instrument's failure (the
        journal cannot write) ends it and is raised.

        Raises:
            KernelError: The scheduler is running, closed or not halted.
            InstrumentFailure: A critical instrument failed.
        """
        if self._running or self._closed or not self._reactor.halted:
            raise KernelError("drain() is for a stopped scheduler, between runs")
        reactor = self._reactor
        deadline = time.monotonic() + timeout
        self._running = True
        try:
            while reactor.in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wait_hook("before_wait", left)
                woken = reactor.poll(left, idle=False)
                self._wait_hook("after_wait", woken)
        finally:
            self._running = False
            after_run = self._instruments.hooks["after_run"]
            if after_run is not None:
                after_run()  # the commit of what was delivered
        if self._fatal is not None:
            raise self._fatal
        return reactor.in_flight

    @property
    def handed_over(self) -> int:
        """How many helped steps blocked past the bound, the loop handed to another thread."""
        return 0 if self._sysmon is None else self._sysmon.takeovers

    @property
    def halted(self) -> bool:
        """True from :meth:`stop` (or the end of :meth:`run`) until ``run`` starts again."""
        return self._reactor.halted

    def gate_effects(self, gate: Callable[[], bool] | None) -> None:
        """Ask ``gate()`` (any thread) right before each thread job starts.

        A job the gate refuses stays unstarted until :meth:`reopen_effects`.
        The journal's lease uses it: a worker of an engine paused past its
        lease starts nothing before the lease is known to be held again.
        """
        self._reactor.set_gate(gate)

    def reopen_effects(self) -> None:
        """The gate opened again (any thread): the jobs it held back may start."""
        self._reactor.reopen()

    def defer_wake(self, task: Task, value: Any = None, error: BaseException | None = None) -> None:
        """Wake ``task`` at the next wait stage, as if by an external event.

        For completions of work outside the task tree's deterministic part
        (a durable step's worker): they then enter the ready queue at a loop
        boundary, exactly where thread completions and timers do, which is
        what makes them replayable.
        """
        self._deferred.append((task, value, error))

    def add_injector(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at the start of every wait stage (replay injects wake-ups there)."""
        self._injectors.append(fn)
        self._hooks_dirty = True

    def remove_injector(self, fn: Callable[[], None]) -> None:
        """Stop running ``fn`` at wait stages."""
        if fn in self._injectors:
            self._injectors.remove(fn)
        self._hooks_dirty = True

    def register(
        self,
        call_type: type[SystemCall],
        handler: Handler,
        unpark: Callable[[Scheduler, Task, Any], None] | None = None,
    ) -> Handler | None:
        """Install ``handler`` for ``call_type``; return the handler it replaces.

        Args:
            call_type: The exact system-call class.
            handler: ``handler(sched, task, call)``: the value to send at once,
                or :data:`PARKED` (use :meth:`park`).
            unpark: Called as ``unpark(sched, task, call)`` when a task parked
                on such a call is killed, to take it off whatever holds it.
        """
        self._hooks_dirty = True  # the loop caches which fast paths apply
        previous = self._handlers.get(call_type)
        self._handlers[call_type] = handler
        if unpark is not None:
            self._unparkers[call_type] = unpark
        return previous

    def handler(self, call_type: type[SystemCall]) -> Handler | None:
        """Return the handler installed for ``call_type``."""
        return self._handlers.get(call_type)

    def task(self, tid: int) -> Task:
        """Return the task record for ``tid`` (alive or finished, not yet reaped)."""
        try:
            return self._tasks[tid]
        except KeyError:
            raise UnknownTask(f"no task {tid}", tid=tid) from None

    @property
    def records(self) -> int:
        """How many task records are kept (alive, or finished and not yet reaped or forgotten)."""
        return len(self._tasks)

    def tasks(self) -> list[Task]:
        """Return every task on record, in id order."""
        return list(self._tasks.values())

    def result(self, tid: int) -> Any:
        """Return the result of finished task ``tid``, raising as ``WaitTask`` would."""
        task = self.task(tid)
        if not task.finished:
            raise KernelError(f"task {tid} has not finished", tid=tid, state=task.state.value)
        err = join_error(task)
        if err is not None:
            raise err
        return task.result

    def forget(self, tid: int) -> None:
        """Drop the record of finished top-level task ``tid``."""
        task = self.task(tid)
        if not task.finished:
            raise KernelError(f"task {tid} is still alive", tid=tid)
        del self._tasks[tid]

    @property
    def alive(self) -> int:
        """How many tasks have not finished."""
        return self._alive

    def add_instrument(self, instrument: Instrument) -> None:
        """Attach an observer (takes effect at the next dispatch)."""
        self._instruments.add(instrument)

    def remove_instrument(self, instrument: Instrument) -> None:
        """Detach an observer."""
        self._instruments.remove(instrument)

    @property
    def instruments(self) -> list[Instrument]:
        """The attached instruments."""
        return list(self._instruments.instruments)

    def close(self) -> None:
        """Release the selector and the thread pool. Alive tasks are closed.

        Thread jobs in flight finish; the ones not started are discarded
        (never run: see :meth:`stop`).
        """
        if self._closed:
            return
        self._closed = True
        if self._sysmon is not None:
            self._sysmon.close()
        for task in list(self._tasks.values()):
            if not task.finished:
                for gen in [task.coro, *reversed(task.stack or ())]:
                    if gen is not None:
                        try:
                            gen.close()
                        except Exception as exc:  # noqa: BLE001 - logged
                            log.warning("kernel.close_failed", tid=task.id, error=repr(exc))
        discarded = self._reactor.close()
        if discarded:
            log.info("kernel.effects_discarded", jobs=discarded, note="never started")

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ------------------------------------------------------------

    def _loop(self) -> str | None:
        """Run passes until no task is left, :meth:`stop`, or a fatal failure.

        Returns ``_STOPPED`` after a stop, ``_HANDED_BACK`` on a substitute
        whose helped call returned (``sysmon.py``), None when nothing is left.

        The shape is trio's ``unrolled_run``: a pass dispatches the tasks
        that were ready when it began (stage 1), then waits (stages 2 and 3,
        :meth:`_wait`). A task's *turn* resumes it until it parks or ends;
        a system call that completes at once resumes it again, up to
        ``MAX_IMMEDIATE_RESUMES`` times, and a bare ``yield`` or the spent
        budget ends the turn at the back of the ready queue (:meth:`_reschedule`
        inlined at both: the bare yield's is the commonest turn, and a shared
        tail costs it a store and a jump).

        Hooks are guarded by the instrument set, so calling one never
        raises, but for the two dispatch hooks: the loop calls those bare in
        a ``try`` of its own and hands a failure to the set
        (``InstrumentSet.raised``). A failure dirties the hooks, and the
        re-read after the call (:meth:`_refresh_hooks`) raises a critical
        instrument's failure.

        Discussion: everything the loop reads per dispatch is a local, and
        the two commonest yields are completed inline: a bare ``yield``, and
        ``yield q.get()`` (``queue_get`` inlined while it is the installed
        handler and no instrument watches blocks; see ``sync.py``'s header).
        Other yields go to their handler; a yield with none is a nested
        coroutine, a nested return value or a misuse (:meth:`_no_handler`).
        """
        ready = self._ready
        popleft = ready.popleft
        append = ready.append
        handlers = self._handlers
        reactor = self._reactor
        returned = RETURNED
        before = after = None
        wait_hooks = fast_queue = False
        while True:
            if self._hooks_dirty:
                before, after, wait_hooks, fast_queue = self._refresh_hooks()
            if self._stop_requested:  # Scheduler.stop(): one read per pass
                if self._handback:  # a substitute: the helped call's thread takes the loop
                    self._handback = False
                    self._stop_requested = self._stop_asked
                    return _HANDED_BACK
                self._stop_requested = self._stop_asked = False
                if self._sysmon is None or not self._sysmon.taken:
                    log.info("kernel.stopped", alive=self._alive)  # (a substitute: its owner logs)
                return _STOPPED
            ntodo = len(ready)
            self.turns += ntodo
            # -- stage 1: dispatch what was ready when the pass began --------
            while ntodo:
                ntodo -= 1
                task = popleft()
                self.current = task
                task.state = _RUNNING
                task.blocked_on = None  # a queue hand-off leaves it set until now
                value = task._send
                budget = MAX_IMMEDIATE_RESUMES
                while True:  # the task's turn
                    if before is not None:
                        try:
                            before(task)
                        except Exception as hook_exc:  # noqa: BLE001 - the set's policy
                            self._instruments.raised("before_dispatch", hook_exc)
                        if self._hooks_dirty:  # an instrument went or came
                            before, after, wait_hooks, fast_queue = self._refresh_hooks()
                    coro = task.coro
                    exc = task._throw
                    if exc is not None:
                        task._throw = None
                        if exc.__class__ is CloseTask:
                            self._close_for_good(task)
                            break
                    try:
                        y = coro.send(value) if exc is None else coro.throw(exc)  # type: ignore[union-attr]
                    except StopIteration as stop:
                        y, value, error = returned, stop.value, None
                    except BaseException as err:  # noqa: BLE001 - the task's outcome
                        y, value, error = returned, None, err
                    if after is not None:
                        try:
                            after(task, y)
                        except Exception as hook_exc:  # noqa: BLE001 - the set's policy
                            self._instruments.raised("after_dispatch", hook_exc)
                        if self._hooks_dirty:
                            before, after, wait_hooks, fast_queue = self._refresh_hooks()
                    if y is None:  # a bare yield: to the back of the queue
                        task._send = None
                        task.state = _READY
                        append(task)
                        break
                    if y is returned:
                        if task.stack:  # a nested coroutine returned to its caller
                            task.coro = task.stack.pop()
                            task._throw = error
                            continue
                        self._task_returned(task, value, error)
                        break
                    cls = y.__class__
                    if cls is _QUEUE_GET and fast_queue:
                        q = y.queue
                        if q._items:
                            value = q._items.popleft()
                        elif q._sched is self:
                            if q._getters is None:
                                q._getters = [task]
                            else:
                                q._getters.append(task)
                            task.state = _BLOCKED_SYNC
                            task.blocked_on = y
                            break
                        else:
                            value = queue_get(self, task, y)
                            if value is PARKED:
                                break
                    else:
                        handler = handlers.get(cls)
                        if handler is None:
                            value = self._no_handler(task, y)
                        else:
                            try:
                                value = handler(self, task, y)
                            except Exception as handler_exc:
                                raise KernelInternalError(
                                    f"handler for {cls.__name__} failed", tid=task.id
                                ) from handler_exc
                            if value is PARKED:
                                break
                    budget -= 1
                    if budget:  # completed at once: resume it again
                        continue
                    # The budget is spent: to the back of the queue, as a bare yield.
                    task._send = value
                    task.state = _READY
                    append(task)
                    break
            self.current = None
            if self._hooks_dirty:  # a critical failure stops the loop before the commit
                before, after, wait_hooks, fast_queue = self._refresh_hooks()
            # -- stages 2 and 3: commit, then wait for events ------------------
            if (
                wait_hooks
                or self._deferred
                # reactor.busy, inlined: a property call per pass is a
                # measurable share of a message ring where one task is ready
                # per pass.
                or reactor.timers
                or reactor.io_waiting
                or reactor.threads_pending
                or reactor.outbox
            ):
                if not self._wait():
                    break
            elif not ready:
                break
        if self._alive:
            log.info("kernel.stalled", blocked=self._alive)
        return None

    def _no_handler(self, task: Task, y: Any) -> Any:
        """Handle a yield no handler is registered for; return what to send back.

        A generator is a nested coroutine call (trampolining). A plain value
        yielded by a nested coroutine is its result, PyOS-style (the seed's
        ``yield client, addr`` in Accept). Anything else, a system call with
        no handler included, is a misuse at any depth: it is thrown back
        into the task.
        """
        coro = task.coro
        if y.__class__ is _GENERATOR:
            if task.stack is None:
                task.stack = [coro]  # type: ignore[list-item]
            else:
                task.stack.append(coro)  # type: ignore[arg-type]
            task.coro = y
            return None
        if task.stack and not isinstance(y, SystemCall):
            coro.close()  # type: ignore[union-attr]
            task.coro = task.stack.pop()
            return y
        what = (
            "no handler is registered for it"
            if isinstance(y, SystemCall)
            else "expected a system call, a generator or None"
        )
        task._throw = SystemCallMisuse(
            f"task {task.id} ({task.name}) yielded {y!r}: {what}",
            tid=task.id,
            yielded=repr(y)[:200],
        )
        return None

    def _task_returned(self, task: Task, result: Any, error: BaseException | None) -> None:
        """The task's own coroutine returned ``result`` or raised ``error``: it ended.

        ``KeyboardInterrupt`` and ``SystemExit`` end the task and then the loop.
        """
        if error is None:
            self._finish(task, result)
            return
        self._crash(task, error)
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise error

    # -- the wait stage (stages 2 and 3) ---------------------------------------

    def _wait(self) -> bool:
        """Inject, commit, release effects, poll for events and fire due timers.

        Returns False when nothing is ready and nothing can ever wake a task.

        Discussion: the injectors (replay's recorded wake-ups, cancel
        requests) run first, so the timeout is decided once, on what they
        left ready, and the commit point (``before_wait``) is called once
        per stage with the timeout the loop will really block for. (They
        used to run after it: when they found nothing to deliver, the hook
        was called a second time, because a group commit must not sit in a
        buffer while the loop sleeps.) Their records join this stage's
        commit; what they wake is not external (the replay reproduces it).
        """
        if self._stop_requested:
            return True  # back to the top of the loop, which stops (Scheduler.stop)
        reactor = self._reactor
        reactor.purge_timers()
        for inject in self._injectors:
            inject()
        timeout = self._wait_timeout()
        self._wait_hook("before_wait", None if timeout == _NOTHING_TO_WAIT_FOR else timeout)
        woken = self._wake_deferred() if self._deferred else 0
        alive = bool(self._ready) or reactor.busy
        if alive:
            polled = self._poll(timeout)
            if polled < 0:  # a substitute ran this stage's end and more passes
                return self._reclaimed()
            woken += polled
        self._wait_hook("after_wait", woken)
        return alive

    def _wait_hook(self, name: str, arg: Any) -> None:
        """Call the wait stage's hook ``name``; a critical failure stops the loop here."""
        hook = self._instruments.hooks[name]
        if hook is not None:
            hook(arg)
            if self._fatal is not None:
                raise self._fatal

    def _poll(self, timeout: float | None) -> int:
        """Release the pass's effects (unless held), then wait for events; return wake-ups.

        -1: a helped step blocked and a substitute ran the loop meanwhile
        (``sysmon.py``); the stage is over, the substitute ended it.
        """
        reactor = self._reactor
        if reactor.outbox:
            if not self._effects_held:
                sysmon = self._sysmon
                helping = (
                    sysmon is not None
                    and not sysmon.taken
                    and not self._ready
                    and not self._deferred
                )
                if reactor.release(self._help if helping else None):
                    return -1
            if self._ready or reactor.outbox:  # inline steps completed, or effects held
                timeout = 0.0
        return reactor.poll(timeout, idle=not self._ready)

    # -- helped steps (sysmon.py) ----------------------------------------------

    def _help(
        self, task: Task, call: Any, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> bool | None:
        """Run the lone step ``call`` on this thread; True if the loop ran elsewhere meanwhile.

        None: declined (its function blocked here before), the pool runs it.
        Its outcome wakes the task as a worker's would; a KeyboardInterrupt
        (a SIGINT on this, the main, thread) leaves the step started and
        not finished, as it leaves an ``inline`` step, and ends the loop.
        """
        sysmon = self._sysmon
        assert sysmon is not None
        if not sysmon.helps(call.fn):
            return None
        _running.sched = None  # current_task() in a step's function is None, as on a worker
        sysmon.begin(call.fn)
        try:
            value, error = fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - the step's outcome, as a worker's
            value, error = None, exc
        took = sysmon.end(self._ask_back)
        _running.sched = self
        reactor = self._reactor
        if self._handback and not took:  # asked back, but no substitute ran: the stage goes on
            self._handback = False
            self._stop_requested = self._stop_asked
        if isinstance(error, KeyboardInterrupt):
            reactor.threads_pending -= 1
            if took:
                self._reclaimed()
            raise error
        if took:
            # The loop moved on meanwhile: the outcome arrives as a worker's
            # does, at a wait stage (where the journal records wake-ups as
            # external), not here, between two of the substitute's passes.
            reactor.complete((task, call), value, error)
            return True
        reactor.threads_pending -= 1
        if task.blocked_on is call:
            if error is not None:
                task._throw = error
            self.wake(task, value)
        return took

    def _ask_back(self) -> None:
        """Make a substitute return at its next pass boundary (the helped call's thread)."""
        self._handback = True
        self._stop_requested = True
        self._reactor.nudge()

    def _substitute(self) -> None:
        """Run the loop on the monitor's thread until the helped call's thread asks it back.

        It ends the wait stage the helped call interrupted (a poll that does
        not block, and ``after_wait``), then runs passes. How they ended is
        left in ``_sub_outcome`` for the loop's own thread (``_reclaimed``).
        """
        _running.sched = self
        self._hooks_dirty = True  # the loop's cached hooks are its own thread's
        sysmon = self._sysmon
        assert sysmon is not None
        fn = sysmon.fn
        # Debug, not info: expected and handled (``make run``'s demo meets it
        # at its first file write); /metrics counts them.
        log.debug(
            "kernel.step_blocked",
            fn=f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}",
            bound_ms=sysmon.bound_s * 1000,
            note="the loop goes on on another thread; this function runs in the pool from now on",
        )
        outcome: Any
        try:
            woken = self._reactor.poll(0.0, idle=False)
            self._wait_hook("after_wait", woken)
            outcome = self._loop()
        except BaseException as exc:  # noqa: BLE001 - raised on the loop's own thread
            outcome = exc
        finally:
            self.current = None
            _running.sched = None
            self._hooks_dirty = True
        self._sub_outcome = outcome

    def _reclaimed(self) -> bool:
        """The loop's thread has the loop back after a substitute: carry on as it left it.

        A stop the substitute took is taken again here; a failure it met is
        raised here, on the thread that called :meth:`run`.
        """
        outcome, self._sub_outcome = self._sub_outcome, None
        self._handback = False
        self._hooks_dirty = True
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome == _STOPPED:
            self._stop_asked = True
        self._stop_requested = self._stop_asked
        return True

    def _wait_timeout(self) -> float | None:
        """How long this wait stage may block: 0 (poll), seconds, None (until an event).

        Thread jobs in the outbox start at this stage (``_poll``) and count
        as pending already, so they block like jobs in flight: a chain of
        steps through the pool then waits once a step, not once for
        nothing and again for its worker. Inline steps (they make their
        task ready) and jobs a rate limit may delay (a timer ``poll`` would
        not know of yet) poll instead.
        """
        reactor = self._reactor
        if (
            self._ready
            or self._deferred
            or (reactor.outbox and (reactor.outbox_inline or reactor.admit is not None))
        ):
            return 0.0
        if reactor.timers or reactor.delayed:
            return reactor.timeout()
        if reactor.io_waiting or reactor.threads_pending:
            return None
        return _NOTHING_TO_WAIT_FOR

    def _wake_deferred(self) -> int:
        deferred, self._deferred = self._deferred, []
        for task, value, error in deferred:
            if error is not None:
                task._throw = error
            self.wake(task, value)
        return len(deferred)

    def _refresh_hooks(self) -> tuple[_Hook | None, _Hook | None, bool, bool]:
        """Raise a critical instrument's failure; else re-read what the loop keeps in locals.

        Returns the dispatch hooks, whether the wait stage has hooks, and
        whether ``yield q.get()`` may be completed inline (the standard
        handler is installed and no instrument watches blocks).

        Discussion: the loop re-reads them at the start of a pass and, when
        they are dirty, right after calling a hook and at the end of a pass:
        an instrument removed mid-pass (failed, or detached by a task) is
        then never called again, and one attached mid-pass sees the next
        dispatch. With no instrument attached the re-check costs nothing.
        """
        if self._fatal is not None:
            raise self._fatal
        self._hooks_dirty = False
        hooks = self._instruments.hooks
        wait_hooks = (
            hooks["before_wait"] is not None
            or hooks["after_wait"] is not None
            or bool(self._injectors)
        )
        fast_queue = self._handlers.get(QueueGet) is queue_get and self._on_block is None
        bare = self._instruments.bare  # called inside the loop's try (InstrumentSet.raised)
        return bare["before_dispatch"], bare["after_dispatch"], wait_hooks, fast_queue

    def _spawn(self, coro: Coroutine, name: str | None, parent: Task | None, daemon: bool) -> Task:
        if coro.__class__ is not _GENERATOR:
            raise SystemCallMisuse(
                f"a task must be a generator, got {coro!r}", got=repr(coro)[:200]
            )
        tid = self._next_id
        self._next_id = tid + 1
        task = Task(tid, coro, name, parent.id if parent is not None else None, daemon)
        self._tasks[tid] = task
        if parent is not None:
            task.context = parent.context
            if parent.children is None:
                parent.children = {}
            parent.children[tid] = task
        self._alive += 1
        self._reschedule(task, None)
        on_spawn = self._on_spawn
        if on_spawn is not None:
            on_spawn(task)
        return task

    def _reschedule(self, task: Task, value: Any) -> None:
        """Put ``task`` at the back of the ready queue; ``value`` is what its yield returns.

        The one way onto the ready queue (trio's ``reschedule``): a spawn,
        a wake-up, ``Sleep(0)``. Two paths run once per message and inline
        it: the end of a turn in :meth:`_loop`, and ``Queue.put``'s hand-off.
        """
        task._send = value
        task.state = _READY
        self._ready.append(task)

    def _finish(self, task: Task, result: Any) -> None:
        task.result = result
        task.state = TaskState.DONE
        self._ended(task)

    def _crash(self, task: Task, err: BaseException) -> None:
        task.error = err
        if isinstance(err, TaskCancelled):
            task.state = TaskState.CANCELLED
        else:
            task.state = TaskState.CRASHED
            if isinstance(err, TiffanyError) and err.outcome:
                # Reported where it belongs (a step's attempt, the run's end): a
                # tool failing before its retry, a plan whose steps failed.
                log.debug("kernel.task_crashed", tid=task.id, name=task.name, error=repr(err))
            elif task.joiners:
                # Someone waits for it: the error is theirs to handle (a worker
                # retrying a tool); record it without a traceback.
                log.warning("kernel.task_crashed", tid=task.id, name=task.name, error=repr(err))
            else:
                log.error(
                    "kernel.task_crashed",
                    tid=task.id,
                    name=task.name,
                    error=repr(err),
                    exc_info=(type(err), err, err.__traceback__),
                )
        self._ended(task)

    def _ended(self, task: Task) -> None:
        _ = task.name  # fix the name before the generator goes
        task.coro = None
        task.stack = None
        task.blocked_on = None
        self._alive -= 1
        joiners = task.joiners
        if joiners:
            task.joiners = None
            err = join_error(task)
            for waiter in joiners:
                self._reactor.cancel_timer(waiter)
                if err is not None:
                    waiter._throw = err
                self.wake(waiter, task.result if err is None else None)
        hooks = self._instruments.hooks
        if task.state is TaskState.CRASHED:
            crashed = hooks["task_crashed"]
            if crashed is not None:
                crashed(task, task.error)
        else:
            exited = hooks["task_exited"]
            if exited is not None:
                exited(task)
        self._reap(task)

    def _reap(self, task: Task) -> None:
        """Drop records nobody can wait for any more (see ``NewTask``)."""
        tasks = self._tasks
        if task.children:
            for child in task.children.values():
                if child.finished:
                    tasks.pop(child.id, None)
            task.children = None
        if task.parent is not None:
            parent = tasks.get(task.parent)
            if parent is None or parent.finished:
                tasks.pop(task.id, None)
            elif task.daemon:
                tasks.pop(task.id, None)
                if parent.children:
                    parent.children.pop(task.id, None)
        elif task.daemon:
            tasks.pop(task.id, None)

    def _kill(self, target: Task, caller: Task | None) -> None:
        target.kills += 1
        if target.kills > 1 and target is not caller:
            if target.state is _READY:  # still in the ready queue: close it there
                target._throw = CloseTask()
            else:
                self._close_for_good(target)
            return
        by = f"task {caller.id}" if caller is not None else "the host"
        exc = TaskCancelled(f"task {target.id} killed by {by}")
        if target is caller or target.state is _READY:
            if self._handed_off(target):
                self._unpark(target)
            target._throw = exc
            return
        self._unpark(target)
        target._throw = exc
        self.wake(target, None)

    @staticmethod
    def _handed_off(task: Task) -> bool:
        """True when ``task`` is ready with an item ``Queue.put`` handed it, not yet received.

        Such a task still holds its ``QueueGet`` in ``blocked_on`` until it
        runs; a kill must give the item back (:func:`~.sync.unpark_queue_get`).
        """
        return task.state is _READY and task.blocked_on.__class__ is QueueGet

    def _close_for_good(self, target: Task) -> None:
        """The second kill: close the generators; ``finally`` blocks run now."""
        if target.state.blocked or self._handed_off(target):
            self._unpark(target)
        err: BaseException = TaskCancelled(f"task {target.id} killed twice: closed")
        for gen in [target.coro, *reversed(target.stack or ())]:
            if gen is None:
                continue
            try:
                gen.close()
            except Exception as exc:  # noqa: BLE001 - recorded as the task's error
                err = exc
        self._crash(target, err)

    def _unpark(self, task: Task) -> None:
        """Remove a killed task from whatever holds it (its call's unparker)."""
        call = task.blocked_on
        self._reactor.cancel_timer(task)
        unpark = self._unparkers.get(type(call))
        if unpark is not None:
            unpark(self, task, call)
        task.blocked_on = None

    def park(self, task: Task, call: SystemCall, state: TaskState) -> Any:
        """Mark ``task`` blocked on ``call``; return :data:`PARKED` (for handlers)."""
        task.state = state
        task.blocked_on = call
        on_block = self._on_block
        if on_block is not None:
            on_block(task, call)
        return PARKED

    # -- ports: what a journal (or another layer above) may hold or decide ----

    def find(self, tid: int) -> Task | None:
        """Return the record of task ``tid``, or None (ended and reaped, or unknown)."""
        return self._tasks.get(tid)

    @property
    def ready_count(self) -> int:
        """How many tasks are in the ready queue (read at a wait stage: the next pass)."""
        return len(self._ready)

    def throw(self, task: Task, error: BaseException) -> None:
        """Make the parked ``task`` ready with ``error`` raised at its yield."""
        task._throw = error
        self.wake(task, None)

    def refuse_wake(self, task: Task, error: BaseException) -> None:
        """From a ``task_woken`` hook: ``task`` gets ``error`` at its yield, not its value.

        For the journal, when the value a task was just woken with cannot be
        recorded: the task must then see what a replay will hand it back.
        Only for a task made ready and not dispatched since.
        """
        if task.state is not _READY:
            raise KernelError(f"refuse_wake: task {task.id} is not ready", task=task.id)
        task._send = None
        task._throw = error

    def wake_at(self, task: Task, deadline: float) -> None:
        """Arm a timer that wakes the parked ``task`` at ``deadline`` (``clock.monotonic``).

        For a task a layer above parked itself (with :meth:`park`) on a
        ``Sleep`` or a timed ``WaitTask`` whose deadline it decided.
        """
        self._reactor.add_timer(task, deadline)

    def set_admission(self, admit: Callable[[Any], float] | None) -> None:
        """Delay thread jobs (plain-function steps): ``admit(call)`` -> seconds to wait first.

        For rate limits: a job waits, queued, without holding a thread, and
        its task stays parked on it; a replay starts no job, so it never asks.
        """
        self._reactor.admit = admit

    def disarm(self, task: Task) -> None:
        """Cancel the timer armed for the parked ``task`` (something else wakes it first)."""
        self._reactor.cancel_timer(task)

    def add_joiner(self, task: Task, target: Task) -> None:
        """Make ``task`` one of ``target``'s joiners: woken with its outcome when it ends."""
        if target.joiners is None:
            target.joiners = [task]
        else:
            target.joiners.append(task)

    def remove_joiner(self, task: Task, tid: int) -> None:
        """Take ``task`` off the joiners of task ``tid`` (if it is one)."""
        target = self._tasks.get(tid)
        if target is not None and target.joiners and task in target.joiners:
            target.joiners.remove(task)

    def start_thread(self, task: Task, call: Any) -> Any:
        """Park ``task`` on ``call`` and run ``call.fn(*call.args)`` in the pool.

        The job starts after the current pass's commit point; its outcome
        wakes the task at a wait stage. Returns :data:`PARKED` (for handlers).
        """
        self._reactor.submit(task, call)
        return self.park(task, call, TaskState.BLOCKED_THREAD)

    def hold_effects(self) -> None:
        """Keep the effects requested so far (thread jobs, inline steps) from starting.

        For the instrument that makes records durable: it holds them when it
        defers its commit at a commit point (group commit across passes), and
        releases them when it commits. Effects then never leave the process
        before the records that led to them are durable.
        """
        self._effects_held = True

    def release_effects(self) -> None:
        """Let held effects start at the next wait stage (after its commit point)."""
        self._effects_held = False

    @property
    def effects_held(self) -> bool:
        """True while :meth:`hold_effects` keeps effects queued."""
        return self._effects_held

    # -- instruments ---------------------------------------------------------

    def _hooks_changed(self) -> None:
        """The instrument set recompiled its hooks: the handlers' copies and the loop's go stale."""
        hooks = self._instruments.hooks
        self._on_block = hooks["task_blocked"]
        self._on_wake = hooks["task_woken"]
        self._on_spawn = hooks["task_spawned"]
        self._hooks_dirty = True

    def _instrument_fatal(self, failure: InstrumentFailure) -> None:
        """A critical instrument failed: start nothing more, and stop the loop (``run`` raises)."""
        self._reactor.halt()  # first: nothing starts meanwhile
        if self._fatal is None:
            self._fatal = failure
        self._hooks_dirty = True  # the loop's next re-read raises it
