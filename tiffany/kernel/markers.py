"""Markers shared by the scheduler and its handlers.

:data:`PARKED` is what a handler returns when the task does not resume at
once; :data:`RETURNED` is what ``after_dispatch`` sees when a coroutine
returned or raised instead of yielding; :func:`join_error` is what
``WaitTask`` raises for a task that did not return.
"""

from __future__ import annotations

from typing import Final

from tiffany.errors import TaskCancelled, TaskCrashed, TaskKilled
from tiffany.kernel.task import Task, TaskState

__all__ = ["PARKED", "RETURNED", "CloseTask", "join_error"]


class _Parked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "PARKED"


#: What a handler returns when the task does not resume at once.
PARKED: Final = _Parked()


class _Returned:
    __slots__ = ()

    def __repr__(self) -> str:
        return "RETURNED"


#: What ``after_dispatch`` sees when the running coroutine returned or raised
#: instead of yielding (a nested coroutine, or the task itself).
RETURNED: Final = _Returned()


class CloseTask(TaskCancelled):
    """Marks a queued task whose second kill closes it instead of throwing."""


def join_error(task: Task) -> BaseException | None:
    """What ``WaitTask`` raises for a finished ``task`` (None when it returned)."""
    if task.state is TaskState.CRASHED:
        err: BaseException = TaskCrashed(
            f"task {task.id} ({task.name}) crashed: {task.error!r}", tid=task.id, name=task.name
        )
        err.__cause__ = task.error
        return err
    if task.state is TaskState.CANCELLED:
        err = TaskKilled(f"task {task.id} ({task.name}) was killed", tid=task.id, name=task.name)
        err.__cause__ = task.error
        return err
    return None
