"""The run, step and task status vocabulary: one definition every reader imports.

The store, the projector's fold, the API (and through ``GET /api/meta`` the
dashboard), the SDK, the CLI, the activity feed and the spans all say a
run's, a step's and a task's state in these words.

A run's status is a :class:`RunStatus` where code compares and stores it
(the store's column and its check constraint, the projector's fold), and a
:data:`RunStatusName` where a schema or a signature takes the plain string
(the API's and the SDK's ``status: Literal[...]``, so the OpenAPI schema
lists the values inline and a caller passes ``"failed"``). The two list
the same values in the same order; tests/wire/test_status.py holds them to
it.

Discussion:
    Why both: a ``Literal`` cannot be built from an enum in a way mypy
    follows, and an enum in a pydantic model becomes a ``$ref`` in the
    schema, and in a signature refuses a plain string under mypy.
"""

from __future__ import annotations

import enum
from typing import Final, Literal

__all__ = [
    "STATE_LABELS",
    "TASK_STATUS",
    "TERMINAL",
    "TERMINAL_TASK",
    "RunStatus",
    "RunStatusName",
    "StepStatus",
    "TaskState",
    "status_of",
    "vocabulary",
]


class RunStatus(enum.StrEnum):
    """Where a run is (the API's ``status``).

    ``waiting``: every live step waits for a client's signal or an operator
    (a step held for its tool or function): the run needs someone, and its
    ``waiting_for`` says what for (``tiffany/store/waits.py``).
    """

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: A run's status as a plain string (the values of :class:`RunStatus`, in order).
RunStatusName = Literal["pending", "running", "waiting", "succeeded", "failed", "cancelled"]

#: The statuses of a run that has ended: it changes no more.
TERMINAL: Final[frozenset[RunStatus]] = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
)


class StepStatus(enum.StrEnum):
    """A plan step's status (the planner's names)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"


class TaskState(enum.StrEnum):
    """A task's state as the journal and the store show it (the kernel's names)."""

    READY = "ready"
    RUNNING = "running"
    BLOCKED_IO = "blocked_io"
    BLOCKED_SLEEP = "blocked_sleep"
    BLOCKED_JOIN = "blocked_join"
    BLOCKED_SYNC = "blocked_sync"
    BLOCKED_THREAD = "blocked_thread"
    DONE = "done"
    CRASHED = "crashed"
    CANCELLED = "cancelled"


#: The states of a task that has ended.
TERMINAL_TASK: Final[frozenset[TaskState]] = frozenset(
    {TaskState.DONE, TaskState.CRASHED, TaskState.CANCELLED}
)

#: A task's state in the run's words (``pending`` ... ``cancelled``): the
#: store's task rows carry it as ``status``, the feed's ``run.finished`` says
#: the root's end in it, the CLI's live view and the dashboard show it.
TASK_STATUS: Final[dict[str, RunStatus]] = {
    TaskState.READY: RunStatus.PENDING,
    TaskState.RUNNING: RunStatus.RUNNING,
    TaskState.BLOCKED_IO: RunStatus.RUNNING,
    TaskState.BLOCKED_SLEEP: RunStatus.RUNNING,
    TaskState.BLOCKED_JOIN: RunStatus.RUNNING,
    TaskState.BLOCKED_SYNC: RunStatus.RUNNING,
    TaskState.BLOCKED_THREAD: RunStatus.RUNNING,
    TaskState.DONE: RunStatus.SUCCEEDED,
    TaskState.CRASHED: RunStatus.FAILED,
    TaskState.CANCELLED: RunStatus.CANCELLED,
}

#: What a running task waits on, said to a person (a state not listed says its status).
STATE_LABELS: Final[dict[str, str]] = {
    TaskState.BLOCKED_IO: "waiting on I/O",
    TaskState.BLOCKED_SLEEP: "sleeping",
    TaskState.BLOCKED_JOIN: "waiting on task",
    TaskState.BLOCKED_SYNC: "waiting",
    TaskState.BLOCKED_THREAD: "in thread",
}

#: Words that are not a state but say one: a cancel answer's ``cancelling``.
_ALIASES: Final[dict[str, RunStatus]] = {"cancelling": RunStatus.CANCELLED}


def status_of(state: str) -> str:
    """A run, step or task state (or a feed label) in the run's words; unknown ones as given."""
    known = TASK_STATUS.get(state) or _ALIASES.get(state)
    return state if known is None else known.value


def vocabulary() -> dict[str, object]:
    """The vocabulary as a JSON document (``GET /api/meta``: what the dashboard reads).

    ``status_of`` maps every task state (and ``cancelling``) to its status;
    the run and step statuses say themselves.
    """
    return {
        "run_statuses": [s.value for s in RunStatus],
        "terminal_run_statuses": [s.value for s in RunStatus if s in TERMINAL],
        "step_statuses": [s.value for s in StepStatus],
        "task_states": [s.value for s in TaskState],
        "terminal_task_states": [s.value for s in TaskState if s in TERMINAL_TASK],
        "status_of": {str(k): v.value for k, v in (TASK_STATUS | _ALIASES).items()},
        "state_labels": {str(k): v for k, v in STATE_LABELS.items()},
    }
