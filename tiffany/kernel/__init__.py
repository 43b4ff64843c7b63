"""The Tiffany kernel: a single-threaded scheduler for generator tasks.

Public API::

    from tiffany.kernel import (Scheduler, GetTid, NewTask, WaitTask, KillTask,
        ReadWait, WriteWait, Sleep, Now, Random, RunInThread, Receive, Event, Queue)

See ``scheduler.py`` for the design and docs/architecture.md for the contract.
"""

from tiffany.errors import TaskCancelled, TaskCrashed, TaskKilled, WaitTimeout
from tiffany.kernel.calls import (
    Coroutine,
    GetTid,
    KillTask,
    NewTask,
    Now,
    Patched,
    Random,
    ReadWait,
    Receive,
    RunInThread,
    Sleep,
    Step,
    SystemCall,
    WaitTask,
    WriteWait,
)
from tiffany.kernel.clock import Clock, ManualClock, MonotonicClock
from tiffany.kernel.instrument import HOOKS, Instrument
from tiffany.kernel.scheduler import PARKED, RETURNED, Handler, Scheduler, current_task
from tiffany.kernel.sync import Event, Queue
from tiffany.kernel.task import Task, TaskState
from tiffany.kernel.watchdog import SlowDispatch, SlowDispatchWatchdog

__all__ = [
    "HOOKS",
    "PARKED",
    "RETURNED",
    "Clock",
    "Coroutine",
    "Event",
    "GetTid",
    "Handler",
    "Instrument",
    "KillTask",
    "ManualClock",
    "MonotonicClock",
    "NewTask",
    "Now",
    "Patched",
    "Queue",
    "Random",
    "ReadWait",
    "Receive",
    "RunInThread",
    "Scheduler",
    "Sleep",
    "SlowDispatch",
    "SlowDispatchWatchdog",
    "Step",
    "SystemCall",
    "Task",
    "TaskCancelled",
    "TaskCrashed",
    "TaskKilled",
    "TaskState",
    "WaitTask",
    "WaitTimeout",
    "WriteWait",
    "current_task",
]
