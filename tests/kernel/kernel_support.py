"""Helpers shared by the kernel tests: a recording instrument and small coroutines.

The recorder is trio's trick: an instrument that appends one tuple per hook,
so a test asserts the exact sequence of scheduler events instead of guessing
from side effects.
"""

from __future__ import annotations

import types
from typing import Any

from tiffany.kernel import RETURNED, Instrument, ManualClock, Scheduler, SystemCall

DISPATCH_HOOKS = ("before_dispatch", "after_dispatch")


def describe(value: Any) -> Any:
    """A stable, comparable description of what a task yielded."""
    if value is None:
        return None
    if value is RETURNED:
        return "RETURNED"
    if isinstance(value, SystemCall):
        return value.kind
    if isinstance(value, types.GeneratorType):
        return "generator"
    return repr(value)


class Recorder(Instrument):
    """Append ``(hook, task id, ...)`` for every hook the scheduler calls."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def task_spawned(self, task: Any) -> None:
        self.events.append(("task_spawned", task.id, task.state.value))

    def before_dispatch(self, task: Any) -> None:
        self.events.append(("before_dispatch", task.id, task.state.value))

    def after_dispatch(self, task: Any, yielded: Any) -> None:
        self.events.append(("after_dispatch", task.id, describe(yielded)))

    def task_blocked(self, task: Any, call: Any) -> None:
        assert task.blocked_on is call
        self.events.append(("task_blocked", task.id, task.state.value, call.kind))

    def task_woken(self, task: Any, value: Any) -> None:
        on = task.blocked_on.kind if task.blocked_on is not None else None
        self.events.append(("task_woken", task.id, task.state.value, on))

    def task_exited(self, task: Any) -> None:
        self.events.append(("task_exited", task.id, task.state.value))

    def task_crashed(self, task: Any, error: BaseException) -> None:
        self.events.append(("task_crashed", task.id, type(error).__name__))

    def before_wait(self, timeout: float | None) -> None:
        self.events.append(("before_wait", timeout))

    def after_wait(self, events: int) -> None:
        self.events.append(("after_wait", events))

    # -- queries ---------------------------------------------------------------

    def of(self, tid: int) -> list[tuple[Any, ...]]:
        """The events of task ``tid``, without the task id."""
        return [
            (e[0], *e[2:])
            for e in self.events
            if len(e) > 1 and e[1] == tid and e[0] not in ("before_wait", "after_wait")
        ]

    def hooks(self, name: str) -> list[tuple[Any, ...]]:
        """The events of one hook."""
        return [e for e in self.events if e[0] == name]

    def dispatches(self) -> list[int]:
        """Task ids in the order they were resumed."""
        return [e[1] for e in self.events if e[0] == "before_dispatch"]

    def turns(self) -> list[int]:
        """Task ids in the order they got a turn (consecutive resumes merged)."""
        out: list[int] = []
        prev_after: tuple[Any, ...] | None = None
        for e in self.events:
            if e[0] == "before_dispatch":
                continued = prev_after is not None and prev_after[1] == e[1]
                if not continued:
                    out.append(e[1])
                prev_after = None
            elif e[0] == "after_dispatch":
                prev_after = e
            elif e[0] in (
                "before_wait",
                "after_wait",
                "task_blocked",
                "task_woken",
                "task_exited",
                "task_crashed",
            ):
                prev_after = None
        return out

    def exits(self) -> list[int]:
        """Task ids in the order they ended (any outcome)."""
        return [e[1] for e in self.events if e[0] in ("task_exited", "task_crashed")]


def make_sched(**kwargs: Any) -> tuple[Scheduler, Recorder, ManualClock]:
    """A scheduler on an autojumping manual clock with a recorder attached."""
    clock = kwargs.pop("clock", None) or ManualClock()
    rec = Recorder()
    sched = Scheduler(clock=clock, instruments=[rec, *kwargs.pop("instruments", ())], **kwargs)
    return sched, rec, clock


def noop(value: Any = None) -> Any:
    """A task that yields once and returns ``value``."""
    yield
    return value


def returns_now(value: Any = None) -> Any:
    """A task that returns ``value`` without ever yielding to the scheduler."""
    return value
    yield  # pragma: no cover - makes this a generator


def spin(n: int) -> Any:
    """A task that yields ``n`` times."""
    for _ in range(n):
        yield
