"""Activity events: what the Process Activity Log (PAL) streams, schema v1.

One event per thing that happened to a task, for dashboards and ``tail``
tools. Unlike the WAL (the durability contract) and the logs (best effort
text), the PAL is a product stream: a documented, versioned schema.

Schema v1 (JSON object, one per event)::

    v          1
    seq        int, strictly increasing per engine (microseconds since the
               epoch at engine start, plus a counter: stays increasing
               across engine restarts)
    ts         float, wall-clock seconds
    run_id     str | null (null for tasks outside any run)
    task_id    int, the engine's task id;  ltid: int | null, the run-local id
    task       str, the task's name;  task_kind: planner | worker | tool | step | task
               (the task's role, as its run's journal labels it: never parsed
               from the name);  step_id: str | null, the plan step it serves
    kind       spawned | step | blocked | woke | exit | crash | cancelled |
               tool.started | tool.output | tool.finished | retry | llm.usage |
               run.started | run.finished
    label      str, a short human text ("sleep 2s", "waiting on task 7")
    data       object, small details (never large payloads)

Control frames on the feed (not events): ``{"type": "gone", "oldest": seq}``
when a resume asks for events older than the ring holds, and
``{"type": "cutoff", "last_seq": seq, "reason": ...}`` when a slow subscriber
is disconnected.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = ["EVENT_KINDS", "SCHEMA_VERSION", "Event", "encode_event"]

SCHEMA_VERSION: Final = 1

EVENT_KINDS: Final = frozenset(
    {
        "spawned",
        "step",
        "blocked",
        "woke",
        "exit",
        "crash",
        "cancelled",
        "tool.started",
        "tool.output",
        "tool.finished",
        "retry",
        "llm.usage",
        "run.started",
        "run.finished",
        "store.quarantined",
    }
)


class Event(msgspec.Struct, kw_only=True, omit_defaults=False):
    """One activity event (schema v1)."""

    seq: int
    ts: float
    kind: str
    task_id: int = 0
    ltid: int | None = None
    run_id: str | None = None
    task: str = ""
    task_kind: str = "task"
    step_id: str | None = None
    label: str = ""
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    v: int = SCHEMA_VERSION


_encoder = msgspec.json.Encoder()


def encode_event(event: Event) -> bytes:
    """Return the event as one line of JSON (no newline)."""
    return _encoder.encode(event)
