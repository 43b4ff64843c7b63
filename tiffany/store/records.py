"""Journal records as the store reads them: record types, and values made JSON.

The store sits below the durable layer and may not import it, so it keeps
its own copy of the record type numbers (a test checks it against
``tiffany.durable.records.RecordType``) and its own reading of the values
the journal stores: tuples, sets, bytes, stand-ins for unencodable values
(which keep a ``repr``), and errors packed as ``[type, args, repr, fields]``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, Final

from tiffany.store.models import TaskKind, TaskState

__all__ = [
    "BLOCKING_KINDS",
    "FIELD_COUNTS",
    "RecordType",
    "attempt_times",
    "error_dict",
    "jsonable",
    "task_kind",
    "text",
    "tool_of",
]


class RecordType(enum.IntEnum):
    """The journal's record types (a copy of ``tiffany.durable.records.RecordType``).

    The store may not import the durable layer; a test checks the two agree.
    """

    RUN_START = 1
    SPAWN = 2
    DISPATCH = 3
    OUTCOME = 4
    STEP_START = 5
    WAKE = 6
    TASK_EXIT = 7
    RUN_END = 8
    CANCEL = 9
    HOLD = 10


#: The fields each record type has (records.py of the durable layer); a
#: record with fewer is not applied.
FIELD_COUNTS: Final[Mapping[int, int]] = {
    RecordType.RUN_START: 4,
    RecordType.SPAWN: 4,
    RecordType.DISPATCH: 4,
    RecordType.OUTCOME: 4,
    RecordType.STEP_START: 5,
    RecordType.WAKE: 5,
    RecordType.TASK_EXIT: 4,
    RecordType.RUN_END: 3,
    RecordType.CANCEL: 2,
    RecordType.HOLD: 5,
}

#: Dispatched call kinds that park the task, and the state they park it in.
BLOCKING_KINDS: Final[Mapping[str, TaskState]] = {
    "sleep": TaskState.BLOCKED_SLEEP,
    "wait_task": TaskState.BLOCKED_JOIN,
    "step": TaskState.BLOCKED_THREAD,
    "run_in_thread": TaskState.BLOCKED_THREAD,
    "read_wait": TaskState.BLOCKED_IO,
    "write_wait": TaskState.BLOCKED_IO,
    "queue_get": TaskState.BLOCKED_SYNC,
    "event_wait": TaskState.BLOCKED_SYNC,
}


def jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON data (tuples as lists, bytes as text, others by repr).

    Journal values may hold tuples, sets, bytes and stand-ins for values the
    journal could not encode (which keep a ``repr``); JSON columns take none
    of them, and PostgreSQL refuses NaN.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    text = getattr(value, "repr", None)  # the durable layer's Unencodable
    return text if isinstance(text, str) else repr(value)


def text(value: Any) -> str:
    """Return ``value`` as text a column takes (PostgreSQL refuses NUL characters)."""
    out = value if isinstance(value, str) else str(value)
    return out.replace("\x00", "\\x00") if "\x00" in out else out


def error_dict(packed: Any) -> dict[str, Any]:
    """Return a journaled error (``[type, args, repr, fields]``) as a JSON object.

    The ``steps`` summary a failed plan carries in its fields is left out:
    the steps table holds it.
    """
    if isinstance(packed, list | tuple) and len(packed) >= 3 and isinstance(packed[0], str):
        args = packed[1] if isinstance(packed[1], list | tuple) else []
        message = args[0] if args and isinstance(args[0], str) else str(packed[2])
        out: dict[str, Any] = {
            "type": packed[0],
            "message": message,
            "args": jsonable(args),
            "repr": jsonable(packed[2]),
        }
        fields = packed[3] if len(packed) > 3 else None
        if isinstance(fields, Mapping):
            out["fields"] = {str(k): jsonable(v) for k, v in fields.items() if k != "steps"}
        return out
    return {"message": str(jsonable(packed)), "repr": jsonable(packed)}


def task_kind(name: str, ltid: int, plan: bool) -> tuple[TaskKind, str | None]:
    """Return a task's kind and the plan step it serves, from its name."""
    if ltid == 1:
        return (TaskKind.PLANNER if plan else TaskKind.TASK), None
    if name.startswith("worker:"):
        return TaskKind.WORKER, name[len("worker:") :]
    if name.startswith("tool:"):
        parts = name.split(":", 2)
        return TaskKind.TOOL, parts[2] if len(parts) == 3 else None
    if name.startswith("step:"):
        return TaskKind.STEP, None
    return TaskKind.TASK, None


def tool_of(name: str) -> str | None:
    """Return the tool of a tool task's name (``tool:TOOL:STEP``)."""
    parts = name.split(":", 2)
    return parts[1] if len(parts) == 3 else None


def attempt_times(attempts: Any) -> dict[str, Any]:
    """Return the step's start and end times from its attempt records."""
    if not isinstance(attempts, list) or not attempts:
        return {}
    out: dict[str, Any] = {"attempts": jsonable(attempts)}
    first, last = attempts[0], attempts[-1]
    if isinstance(first, Mapping) and isinstance(first.get("started_at"), int | float):
        out["started_at"] = float(first["started_at"])
    if isinstance(last, Mapping) and isinstance(last.get("ended_at"), int | float):
        out["ended_at"] = float(last["ended_at"])
    return out
