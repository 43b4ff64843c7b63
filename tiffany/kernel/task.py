"""The task record: one generator-based coroutine and its scheduling state.

A :class:`Task` is a plain slotted record that the scheduler mutates; it has
no behaviour of its own (the loop lives in ``scheduler.py``, not here, so
that the hot path reads locals instead of calling methods).

Invariants:

* ``coro`` is the generator currently running: the task's own generator, or
  the innermost nested coroutine while a trampolined call is in progress.
  ``stack`` holds the callers (innermost last); it is ``None`` until the task
  first calls a nested coroutine, so a parked task stays small.
* ``_send`` / ``_throw`` hold what the next dispatch sends in; whoever makes
  the task ready sets them.
* ``state`` is one of :class:`TaskState`; ``blocked_on`` is the system call a
  blocked task waits on (``None`` otherwise). Together they say *why* a task
  is not running, which the dashboard shows.
* After the task ends, ``coro`` and ``stack`` are dropped (its frames are
  freed) and ``result`` or ``error`` holds the outcome.

Discussion: children and joiners are created lazily and the name is derived
from the generator on demand. A task parked on a queue costs its generator
frame plus about 200 bytes here.
"""

from __future__ import annotations

import enum
from typing import Any

from tiffany.kernel.calls import Coroutine, SystemCall

__all__ = ["Task", "TaskState"]


class TaskState(enum.Enum):
    """Where a task is in its life (the seed's state machine, plus outcomes)."""

    CREATED = "created"
    READY = "ready"
    RUNNING = "running"
    BLOCKED_IO = "blocked_io"
    BLOCKED_SLEEP = "blocked_sleep"
    BLOCKED_JOIN = "blocked_join"
    BLOCKED_SYNC = "blocked_sync"  # an Event or a Queue
    BLOCKED_THREAD = "blocked_thread"  # RunInThread
    DONE = "done"
    CRASHED = "crashed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the three terminal states."""
        return self in _FINISHED

    @property
    def blocked(self) -> bool:
        """True for the blocked states."""
        return self in _BLOCKED


_FINISHED = frozenset({TaskState.DONE, TaskState.CRASHED, TaskState.CANCELLED})
_DONE, _CRASHED, _CANCELLED = TaskState.DONE, TaskState.CRASHED, TaskState.CANCELLED
_BLOCKED = frozenset(
    {
        TaskState.BLOCKED_IO,
        TaskState.BLOCKED_SLEEP,
        TaskState.BLOCKED_JOIN,
        TaskState.BLOCKED_SYNC,
        TaskState.BLOCKED_THREAD,
    }
)


class Task:
    """One coroutine under the scheduler's control.

    Attributes:
        id: The task id, unique within its scheduler (1, 2, 3...).
        coro: The generator currently running (see module docstring).
        stack: Callers of ``coro`` while trampolining, or None.
        state: The :class:`TaskState`.
        blocked_on: The system call a blocked task waits on.
        parent: The id of the task that spawned it, or None.
        children: Ids of the children still on record (lazily a dict).
        joiners: Tasks blocked in ``WaitTask`` on this one (lazily a list).
        result: The return value, once DONE.
        error: The exception, once CRASHED or CANCELLED.
        daemon: Dropped from the task table as soon as it ends.
        kills: How many times ``KillTask`` targeted it.
        meta: Free for the layers above (the journal keeps the task's run
            and run-local id here); the kernel never reads it.
        context: Free for the layers above, like ``meta``, but inherited:
            a task spawned by this one starts with the same ``context``
            (a workflow run's calls find their run through it:
            ``tiffany/workflows``), except a generator step's body, which
            starts with None. The kernel only copies it.
    """

    __slots__ = (
        "__weakref__",
        "_name",
        "_send",
        "_throw",
        "_timer",
        "blocked_on",
        "children",
        "context",
        "coro",
        "daemon",
        "error",
        "id",
        "joiners",
        "kills",
        "meta",
        "parent",
        "result",
        "stack",
        "state",
    )

    def __init__(
        self,
        tid: int,
        coro: Coroutine,
        name: str | None = None,
        parent: int | None = None,
        daemon: bool = False,
    ) -> None:
        self.id = tid
        self.coro: Coroutine | None = coro
        self._name = name
        self.parent = parent
        self.daemon = daemon
        self.stack: list[Coroutine] | None = None
        self.state = TaskState.CREATED
        self.blocked_on: SystemCall | None = None
        self.children: dict[int, Task] | None = None
        self.joiners: list[Task] | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.kills = 0
        self.meta: Any = None
        self.context: Any = None
        self._send: Any = None
        self._throw: BaseException | None = None
        self._timer: Any = None

    @property
    def name(self) -> str:
        """The task's name: given at spawn, or its generator's qualified name."""
        if self._name is None:
            coro = self.stack[0] if self.stack else self.coro
            self._name = getattr(coro, "__qualname__", None) or f"task-{self.id}"
        return self._name

    @property
    def pending_error(self) -> BaseException | None:
        """The exception the task's next dispatch raises at its yield, if any.

        Set when the task is woken with an error (``Scheduler.throw``); an
        instrument's ``task_woken`` hook reads it to tell a failure from a value.
        """
        return self._throw

    @property
    def finished(self) -> bool:
        """True once the task is DONE, CRASHED or CANCELLED."""
        # Identity tests, not ``in _FINISHED``: a plain Enum hashes through a
        # Python-level ``Enum.__hash__``, and this is on every task's path.
        state = self.state
        return state is _DONE or state is _CRASHED or state is _CANCELLED

    def frames(self) -> list[tuple[str, str, int]]:
        """Return the task's coroutine stack, outermost first.

        Each entry is ``(function, filename, line)``: the trampoline stack
        plus any ``yield from`` delegation of the innermost generator. Empty
        once the task has ended.
        """
        gens: list[Any] = list(self.stack or ())
        gen: Any = self.coro
        while gen is not None:
            gens.append(gen)
            gen = getattr(gen, "gi_yieldfrom", None)
        out: list[tuple[str, str, int]] = []
        for g in gens:
            frame = getattr(g, "gi_frame", None)
            if frame is None:
                continue
            code = frame.f_code
            out.append((code.co_qualname, code.co_filename, frame.f_lineno))
        return out

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.name!r} {self.state.value}>"
