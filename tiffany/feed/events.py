"""Activity events: what the Process Activity Log (PAL) streams, schema v2.

One event per thing that happened to a task, for dashboards and ``tail``
tools. Unlike the WAL (the durability contract) and the logs (best effort
text), the PAL is a product stream: a documented, versioned schema.

Schema v2 (JSON object, one per event)::

    v          2
    seq        int, the feed key: strictly increasing per data dir, across
               engine restarts, never taken from a clock (see below)
    wal_seq    int, the WAL's clock: the seq of the journal record that
               carries the event's dispatch, or else of the last record
               written before the event (0: none yet); never decreasing
    ts         float, wall-clock seconds (for display only: nothing orders
               by it)
    engine     int, the engine that published it (``serve --engines N``:
               0..N-1); its ``wal_seq`` lies in that engine's range
               (``tiffany/wire/shards.py``)
    run_id     str | null (null for tasks outside any run)
    task_id    int, the engine's task id;  ltid: int | null, the run-local id
    task       str, the task's name;  task_kind: planner | worker | tool | step | task
               (the task's role, as its run's journal labels it: never parsed
               from the name);  step_id: str | null, the plan step it serves
    kind       spawned | step | blocked | woke | exit | crash | cancelled |
               tool.started | tool.output | tool.finished | retry | llm.usage |
               run.started | run.finished
    label      str, a short human text ("sleep 2s", "waiting on task 7")
    data       object, small details (never large payloads); a plan step's
               worker's ``exit``: ``ok`` (the step's outcome), ``attempts``,
               and a failed step's ``error`` (``code``, ``type``, ``message``
               cut to 500 characters)

How ``seq`` is made: ``seq = max(previous seq + 1, (wal_seq - base) *
SEQS_PER_RECORD)`` (``base``: the seq before the engine's first record, 0
for engine 0), so the events after record ``W`` get the keys from
``W * 1_000_000`` up (``seq // 1_000_000`` is the record, the rest a counter)
and ``seq`` grows by one between two records. Across a restart the hub
starts above both the WAL's end (``next_seq * 1_000_000``) and the last key
it handed out before (kept in ``<data dir>/feed.seq``, written before the
events leave the hub), so a client resuming with ``since`` from the
previous run of the engine gets the new events: a clock stepped back
changes nothing. Consumers that need the store's position use ``wal_seq``
(``GET /api/runs/{id}?min_seq=<wal_seq>``): ``seq // 1_000_000`` equals it
only while fewer than a million events share one record. Seqs are not
consecutive (they jump at each new record): a gap in ``seq`` is not a lost
event.

Changes from v1: ``seq`` was microseconds of the wall clock at engine start
plus a counter (a clock stepped back across a restart silenced resuming
clients); ``wal_seq`` is new.

An event always encodes: text holding a lone surrogate (a task named from
data, an error's message) is sent escaped, and a part of ``data`` with no
JSON form as its repr (``tiffany.wire.values.encodable``); a hub that could not
encode an event would stop for every run.

Control frames on the feed (not events): ``{"type": "gone", "oldest": seq}``
when a resume asks for events older than the ring holds, and
``{"type": "cutoff", "last_seq": seq, "reason": ...}`` when a slow subscriber
is disconnected.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from tiffany.wire.values import ENCODE_ERRORS, encodable, stand_in_text

__all__ = [
    "EVENT_KINDS",
    "SCHEMA_VERSION",
    "SEQS_PER_RECORD",
    "Event",
    "TaskFields",
    "encode_event",
    "encode_task_event",
]

SCHEMA_VERSION: Final = 2

#: Feed keys per WAL record: an event's ``seq`` is at least ``wal_seq`` times this.
SEQS_PER_RECORD: Final = 1_000_000

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
        "signal",
        "store.quarantined",
    }
)


class Event(msgspec.Struct, kw_only=True, omit_defaults=False):
    """One activity event (schema v2)."""

    seq: int
    ts: float
    wal_seq: int = 0
    engine: int = 0
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
    """Return the event as one line of JSON (no newline); never raises (:func:`_safe`)."""
    try:
        return _encoder.encode(event)
    except ENCODE_ERRORS:
        return _safe(event)


def _safe(value: Any) -> bytes:
    """JSON of ``value`` whatever it holds: text escaped, the rest as its repr."""
    try:
        return _encoder.encode(value)
    except ENCODE_ERRORS:
        pass
    try:
        plain = msgspec.to_builtins(value, enc_hook=stand_in_text)
    except ENCODE_ERRORS:
        plain = stand_in_text(value)
    return _encoder.encode(encodable(plain, stand_in_text))


_encode = _encoder.encode
_NO_DATA: Final = b"{}"
_TASK_EVENT: Final = (
    b'{"seq":%d,"ts":%b,"wal_seq":%d,"engine":%d,"kind":%b,%b,"label":%b,"data":%b,"v":%d}'
)
#: Each kind's JSON string, encoded once.
_KINDS: Final = {kind: _encode(kind) for kind in EVENT_KINDS}


class TaskFields:
    """The fields every event of one task shares, encoded once for all of them.

    A task causes a dozen events or more (one per dispatch); its ids, name,
    role and plan step never change, so :func:`encode_task_event` splices
    this JSON into each frame instead of building and encoding an
    :class:`Event` (the activity log keeps one per live task).
    """

    __slots__ = ("json", "run_id", "task_kind")

    def __init__(
        self,
        task_id: int,
        ltid: int | None,
        run_id: str | None,
        task: str,
        task_kind: str,
        step_id: str | None,
    ) -> None:
        self.run_id, self.task_kind = run_id, task_kind
        self.json = b'"task_id":%d,"ltid":%b,"run_id":%b,"task":%b,"task_kind":%b,"step_id":%b' % (
            task_id,
            _safe(ltid),
            _safe(run_id),
            _safe(task),
            _safe(task_kind),
            _safe(step_id),
        )


def encode_task_event(
    seq: int,
    ts: float,
    wal_seq: int,
    engine: int,
    kind: str,
    fields: TaskFields,
    label: str,
    data: dict[str, Any] | None,
) -> bytes:
    """Return the same line :func:`encode_event` would for this task's event (never raises)."""
    try:
        text, details = _encode(label), _encode(data) if data else _NO_DATA
    except ENCODE_ERRORS:
        text, details = _safe(label), _safe(data) if data else _NO_DATA
    return _TASK_EVENT % (
        seq,
        _encode(ts),
        wal_seq,
        engine,
        _KINDS.get(kind) or _safe(kind),
        fields.json,
        text,
        details,
        SCHEMA_VERSION,
    )
