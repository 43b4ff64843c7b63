"""System-call handlers of the kernel, one function per call type.

A handler is ``handler(sched, task, call)``. It returns the value to send
into the task at once, or :data:`~tiffany.kernel.markers.PARKED` when the
task is parked (or requeued); to raise in the task at once it sets
``task._throw`` and returns None. A handler never raises for a task-level
problem: an exception escaping a handler is a kernel bug.

An unparker is ``unpark(sched, task, call)``: it takes a killed ``task``
off whatever holds it while it is parked on ``call``.

The tables at the bottom are built once; a scheduler copies them and layers
above add their own calls with ``Scheduler.register``. The queue's and the
event's handlers and unparkers live with them, in ``sync.py``.
"""

from __future__ import annotations

import inspect
import selectors
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tiffany.errors import KernelError, SystemCallMisuse, TaskKilled, UnknownTask, WaitTimeout
from tiffany.kernel.calls import (
    Coroutine,
    GetTid,
    KillTask,
    NewTask,
    Now,
    Patched,
    Random,
    ReadWait,
    RunInThread,
    Sleep,
    Step,
    WaitTask,
    WriteWait,
)
from tiffany.kernel.markers import PARKED, join_error
from tiffany.kernel.sync import (
    EventWait,
    QueueGet,
    event_wait,
    queue_get,
    unpark_event_wait,
    unpark_queue_get,
)
from tiffany.kernel.task import Task, TaskState

if TYPE_CHECKING:
    from tiffany.kernel.scheduler import Scheduler

__all__ = ["HANDLERS", "UNPARKERS", "Handler", "Unparker"]

Handler = Callable[["Scheduler", Task, Any], Any]
Unparker = Callable[["Scheduler", Task, Any], None]


def _h_patched(sched: Scheduler, task: Task, call: Patched) -> Any:
    return call.applies


def _h_get_tid(sched: Scheduler, task: Task, call: GetTid) -> Any:
    return task.id


def _h_new_task(sched: Scheduler, task: Task, call: NewTask) -> Any:
    try:
        return sched._spawn(call.coro, call.name, task, call.daemon).id
    except SystemCallMisuse as exc:
        task._throw = exc
        return None


def _h_wait_task(sched: Scheduler, task: Task, call: WaitTask) -> Any:
    target = sched._tasks.get(call.tid)
    if target is None:
        task._throw = UnknownTask(f"no task {call.tid} to wait for", tid=call.tid)
        return None
    if target is task:
        task._throw = KernelError(f"task {task.id} cannot wait for itself", tid=task.id)
        return None
    if target.finished:
        err = join_error(target)
        if err is not None:
            task._throw = err
        return target.result if err is None else None
    if call.timeout is not None:
        if call.timeout <= 0:
            task._throw = WaitTimeout(
                f"task {call.tid} has not finished", tid=call.tid, timeout=call.timeout
            )
            return None
        sched.wake_at(task, sched.clock.monotonic() + call.timeout)
    sched.add_joiner(task, target)
    return sched.park(task, call, TaskState.BLOCKED_JOIN)


def _h_kill_task(sched: Scheduler, task: Task, call: KillTask) -> Any:
    target = sched._tasks.get(call.tid)
    if target is None or target.finished:
        return False
    sched._kill(target, task)
    return True


def _h_sleep(sched: Scheduler, task: Task, call: Sleep) -> Any:
    if call.seconds <= 0:
        sched._reschedule(task, None)
        return PARKED
    sched.wake_at(task, sched.clock.monotonic() + call.seconds)
    return sched.park(task, call, TaskState.BLOCKED_SLEEP)


def _h_read_wait(sched: Scheduler, task: Task, call: ReadWait) -> Any:
    return _io_wait(sched, task, call, selectors.EVENT_READ)


def _h_write_wait(sched: Scheduler, task: Task, call: WriteWait) -> Any:
    return _io_wait(sched, task, call, selectors.EVENT_WRITE)


def _io_wait(sched: Scheduler, task: Task, call: ReadWait | WriteWait, event: int) -> Any:
    error = sched._reactor.io_wait(task, call.fd, event)
    if error is not None:
        task._throw = error
        return None
    return sched.park(task, call, TaskState.BLOCKED_IO)


def _h_now(sched: Scheduler, task: Task, call: Now) -> Any:
    return sched.clock.time()


def _h_random(sched: Scheduler, task: Task, call: Random) -> Any:
    return sched.entropy.random()


def _h_run_in_thread(sched: Scheduler, task: Task, call: RunInThread) -> Any:
    return sched.start_thread(task, call)


def _h_step(sched: Scheduler, task: Task, call: Step) -> Any:
    if not inspect.isgeneratorfunction(call.fn):
        return sched.start_thread(task, call)
    name = call.fields()["fn"]
    child = sched._spawn(step_body(sched, task, call), f"step:{name}", task, True)
    # A step's body is one unit whose outcome alone is journaled: it is not
    # its caller's code, and does not inherit its context (a workflow's calls
    # made there would not replay: a replay does not run the body again).
    child.context = None
    call.child = child.id
    return sched.park(task, call, TaskState.BLOCKED_JOIN)


def _unpark_join(sched: Scheduler, task: Task, call: WaitTask) -> None:
    sched.remove_joiner(task, call.tid)


def _unpark_io(sched: Scheduler, task: Task, call: ReadWait | WriteWait) -> None:
    sched._reactor.io_forget(task, call)


def unpark_step(sched: Scheduler, task: Task, call: Step) -> None:
    """Kill a generator step's task when its caller is killed."""
    if call.child is not None:
        sched.kill(call.child)


def step_body(sched: Scheduler, caller: Task, call: Step) -> Coroutine:
    """Run a generator step as a task; hand its outcome to the caller at a wait stage.

    Discussion: the outcome goes through ``defer_wake`` rather than a direct
    wake, so the caller re-enters the ready queue at a loop boundary, like a
    thread completion: that is what lets a replay put it back at the same
    place without running the step.

    Discussion: the body begins in the pass after its STEP_START was
    committed; the scheduler may have been stopped in between (``stop``,
    from the same pass or a signal handler). A stopped scheduler starts no
    effect: the body then waits, not begun, for the loop to run again (the
    loop returns before the next pass; ``close`` closes it unstarted).
    """
    while sched.halted:
        yield
    try:
        result = yield call.fn(*call.args)
    except Exception as exc:  # noqa: BLE001 - delivered to the caller as the step's outcome
        if caller.blocked_on is call:
            sched.defer_wake(caller, None, exc)
        return None
    except BaseException:
        if caller.blocked_on is call:
            name = call.fields()["fn"]
            sched.defer_wake(caller, None, TaskKilled(f"step {name} was killed", step=name))
        raise
    if caller.blocked_on is call:
        sched.defer_wake(caller, result)
    return result


HANDLERS: dict[type, Handler] = {
    Step: _h_step,
    GetTid: _h_get_tid,
    Patched: _h_patched,
    NewTask: _h_new_task,
    WaitTask: _h_wait_task,
    KillTask: _h_kill_task,
    Sleep: _h_sleep,
    ReadWait: _h_read_wait,
    WriteWait: _h_write_wait,
    Now: _h_now,
    Random: _h_random,
    RunInThread: _h_run_in_thread,
    QueueGet: queue_get,
    EventWait: event_wait,
}

#: A task parked on a ``RunInThread`` needs none: the thread runs on, and its
#: completion finds the task gone.
UNPARKERS: dict[type, Unparker] = {
    Step: unpark_step,
    WaitTask: _unpark_join,
    ReadWait: _unpark_io,
    WriteWait: _unpark_io,
    QueueGet: unpark_queue_get,
    EventWait: unpark_event_wait,
}
