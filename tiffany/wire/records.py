"""Journal records: their one typed definition, their codec, and the rules readers share.

The WAL stores opaque ``(type, payload)`` records; this module gives them a
meaning, for every layer that reads or writes them (the durable layer
records and replays, the store projects, the CLI dumps). It is a leaf: it
imports only the standard library, msgspec, ``tiffany.wire.values`` and ``tiffany.wire.entries``.

Every record of a run starts with the run's number as a 4-byte
little-endian prefix, so a reader can skip other runs' records without
decoding them; the rest is a msgpack array, one struct per record type
(``msgspec.Struct(array_like=True)``: the array is the struct's fields in
order; old layout: see docs/wal-format.md, compatibility)::

    RUN_START  1  run_no | [run_id, name, entry, ts, compat?]
    SPAWN      2  run_no | [n, ltid, parent_ltid, name, role?, step_id?, tool?]
    DISPATCH   3  run_no | [n, ltid, kind, arg]
    OUTCOME    4  run_no | [n, ltid, kind, value]           Now(), Random()
    STEP_START 5  run_no | [n, ltid, ordinal, name, attempt]
    WAKE       6  run_no | [at, ltid, cause, ok, value]      from outside the run
    TASK_EXIT  7  run_no | [n, ltid, state, value]
    RUN_END    8  run_no | [status, value, ts]
    (9)           reserved: CANCEL, never written (see below)
    HOLD      10  run_no | [n, ltid, ordinal, name, reason]  a step held, not started

``?`` marks optional trailing fields, which decode with their defaults when
absent (old layout: see docs/wal-format.md, compatibility). The full grammar,
the version history and how to change it are in ``docs/wal-format.md``.

Carried dispatches: every dispatch has exactly one record whose ``n``
first reaches its number. Usually a DISPATCH; but a ``NewTask``, ``Now()``,
``Random()`` or ``Step`` dispatch, and the ``return`` that ends a task other
than the run's root, is journaled by the record it causes, which then
stands for the DISPATCH record it implies (:func:`carried`, the one
implementation every reader uses)::

    SPAWN      [n, ltid, parent, name]           -> DISPATCH [n, parent, "new_task", name]
    OUTCOME    [n, ltid, kind, value]            -> DISPATCH [n, ltid, kind, None]
    STEP_START [n, ltid, ordinal, name, attempt] -> DISPATCH [n, ltid, "step", name]
    TASK_EXIT  [n, ltid, state, value]           -> DISPATCH [n, ltid, "return", None]

(names cut to ``MAX_ARG_CHARS``, as a DISPATCH argument is). A record of
these types whose ``n`` does not pass the last dispatch seen carries
nothing: the root's SPAWN (``n`` 0), an OUTCOME after its DISPATCH
(``Sleep``), a step re-run at recovery, the exit of a task closed by a
second kill (no dispatch), the root's exit (after its explicit
``return``), and older journals' records (old layout: see docs/wal-format.md, compatibility).

Discussion: CANCEL (type 9) was declared and never written. A cancel
request enters a run at a wait stage like any other external event, and
the journal records it there as a WAKE with cause ``"cancel"`` (its ``at``
places it among the run's dispatches, which replay needs); a separate
CANCEL record would say the same thing twice, without the position. The
number stays reserved so that no later record type reuses it.

Values that came from outside (step results, ``Now()``, thread results),
in the ``value`` fields, are packed by
``tiffany/wire/values.py`` (:func:`~tiffany.wire.values.pack_value`: tuples, sets and
stand-ins as msgpack extensions, sets sorted); the decoders here unpack
those extensions with its :func:`~tiffany.wire.values.ext_hook`.

Discussion: the run prefix is fixed-width on purpose. A variable-width
msgpack int would force a decode to learn the run; with 4 raw bytes,
``bytes[:4] == prefix`` filters a shared WAL at memcmp speed.
"""

from __future__ import annotations

import enum
import struct
from typing import Any, ClassVar, Final, Literal

import msgspec

from tiffany.wire.entries import EntryKind, entry_kind
from tiffany.wire.values import ext_hook

__all__ = [
    "CHILD_SIGNAL_PREFIX",
    "JOURNAL_COMPAT",
    "MAX_ARG_CHARS",
    "RESERVED_SIGNAL_PREFIXES",
    "ROLES",
    "RUN_PREFIX",
    "SLOT_SIGNAL",
    "WORKFLOW_CALL_PREFIXES",
    "Dispatch",
    "Hold",
    "Outcome",
    "Record",
    "RecordType",
    "Role",
    "RunEnd",
    "RunStart",
    "Spawn",
    "StepStart",
    "TaskExit",
    "TaskLabel",
    "Undecodable",
    "Unknown",
    "Wake",
    "as_list",
    "carried",
    "decode",
    "decode_body",
    "decode_dispatch",
    "decode_record",
    "encode",
    "function_missing_reason",
    "held_for",
    "legacy_role",
    "reserved_signal",
    "reserved_signal_message",
    "root_role",
    "run_of",
    "tool_disabled_reason",
]

RUN_PREFIX: Final = struct.Struct("<I")

#: The journal-compatibility version this code writes into RUN_START: what
#: a run's replay may rely on (docs/wal-format.md, "Versions"). A run keeps
#: the version it started under for its whole life, across upgrades.
JOURNAL_COMPAT: Final = 3

#: The signal (a WAKE of the run, cause ``signal``: docs/wal-format.md) that
#: gives a run with a ``concurrency`` limit its slot; its planner waits for
#: it first (``tiffany/agents/concurrency.py``), and the store shows the run
#: ``pending`` until it is journaled.
SLOT_SIGNAL: Final = "concurrency.slot"
#: A child run's end reaches its parent as the signal ``child:<child run id>``
#: (``plan.run``: ``tiffany/agents/tools/subplan.py``).
CHILD_SIGNAL_PREFIX: Final = "child:"
#: The engine's own signal names: a name that starts with one of these is
#: never a client's. The API, the control channel and the CLI refuse it (422
#: naming ``name``), the journal takes it only from the engine
#: (``JournalInstrument.request_internal_signal``), and ``signal.wait`` cannot wait for
#: it. ``tiffany.`` is kept for the engine's signals to come.
RESERVED_SIGNAL_PREFIXES: Final = (CHILD_SIGNAL_PREFIX, "concurrency.", "tiffany.")
#: How a workflow's run-level calls' coroutines are named (``tiffany/workflows/calls.py``):
#: ``tool:NAME#digest``, ``child:NAME#digest``, ``signal:NAME#digest``. A DISPATCH
#: of kind ``call`` with such an argument is one of those calls.
WORKFLOW_CALL_PREFIXES: Final = ("tool:", "child:", "signal:")
#: Longest argument text kept in a DISPATCH record (names in carried ones too).
MAX_ARG_CHARS: Final = 120

#: What a task is in its run: the plan run's root, a step's worker, a tool
#: task, the body of a generator step, anything else.
Role = Literal["planner", "worker", "tool", "step", "task"]
ROLES: Final[frozenset[str]] = frozenset({"planner", "worker", "tool", "step", "task"})


class RecordType(enum.IntEnum):
    """The WAL type byte of each journal record (0 is the WAL's, reserved; 9 too)."""

    RUN_START = 1
    SPAWN = 2
    DISPATCH = 3
    OUTCOME = 4
    STEP_START = 5
    WAKE = 6
    TASK_EXIT = 7
    RUN_END = 8
    HOLD = 10


class RunStart(msgspec.Struct, array_like=True, frozen=True):
    """A run begins: its id, name, entry (how to rebuild its root) and start time.

    ``compat``: the journal-compatibility version the run started under
    (absent: 1; old layout: see docs/wal-format.md, compatibility).
    """

    rtype: ClassVar[int] = RecordType.RUN_START
    run_id: str
    name: str
    entry: Any
    ts: float
    compat: int = 1


class Spawn(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A task was created: dispatch count, its run-local id, its parent's, its name.

    ``role``, ``step_id`` and ``tool`` say what the task is (``Role``),
    which plan step it serves and with which tool (a :class:`TaskLabel`
    the spawning code gave). Old layout (see docs/wal-format.md, compatibility):
    :func:`decode` fills them from the name (:func:`legacy_role`), except
    the root's role, which the run's entry says (:func:`root_role`):
    ``role`` is None only there.
    """

    rtype: ClassVar[int] = RecordType.SPAWN
    n: int
    ltid: int
    parent_ltid: int
    name: str
    role: str | None = None
    step_id: str | None = None
    tool: str | None = None

    def implied(self) -> Dispatch:
        """The parent's ``NewTask`` dispatch this record carries (see :func:`carried`)."""
        return Dispatch(self.n, self.parent_ltid, "new_task", self.name[:MAX_ARG_CHARS])


class TaskLabel(msgspec.Struct, frozen=True, gc=False):
    """What a spawned task is, given by the code that spawns it (``NewTask(meta=...)``).

    The journal copies it into the task's SPAWN record and its ``Task.meta``;
    readers never parse a task's name for it.
    """

    role: str = "task"
    step_id: str | None = None
    tool: str | None = None


class Dispatch(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A task yielded: dispatch count, task, the call's kind and a small argument."""

    rtype: ClassVar[int] = RecordType.DISPATCH
    n: int
    ltid: int
    kind: str
    arg: Any


class Outcome(msgspec.Struct, array_like=True, frozen=True):
    """The value a ``Now()``, ``Random()`` (or a timer's deadline) returned."""

    rtype: ClassVar[int] = RecordType.OUTCOME
    n: int
    ltid: int
    kind: str
    value: Any

    def implied(self) -> Dispatch:
        """The ``Now()`` or ``Random()`` dispatch this record carries (see :func:`carried`)."""
        return Dispatch(self.n, self.ltid, self.kind, None)


class StepStart(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A step (the task's ``ordinal``-th) starts its ``attempt``-th attempt."""

    rtype: ClassVar[int] = RecordType.STEP_START
    n: int
    ltid: int
    ordinal: int
    name: str
    attempt: int

    def implied(self) -> Dispatch:
        """The ``Step`` dispatch this record carries (see :func:`carried`)."""
        return Dispatch(self.n, self.ltid, "step", self.name[:MAX_ARG_CHARS])


class Wake(msgspec.Struct, array_like=True, frozen=True):
    """A wake-up from outside the run, at the run's dispatch count ``at``.

    ``ok`` false: ``value`` is a packed error, raised in the task.
    """

    rtype: ClassVar[int] = RecordType.WAKE
    at: int
    ltid: int
    cause: str
    ok: bool
    value: Any


class TaskExit(msgspec.Struct, array_like=True, frozen=True):
    """A task ended: ``done``, ``crashed`` or ``cancelled``, with its result or error."""

    rtype: ClassVar[int] = RecordType.TASK_EXIT
    n: int
    ltid: int
    state: str
    value: Any

    def implied(self) -> Dispatch:
        """The task's final ``return`` dispatch this record carries (see :func:`carried`)."""
        return Dispatch(self.n, self.ltid, "return", None)


class RunEnd(msgspec.Struct, array_like=True, frozen=True):
    """The run ended with ``status`` (its root's result or error) at ``ts``."""

    rtype: ClassVar[int] = RecordType.RUN_END
    status: str
    value: Any
    ts: float


class Hold(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A step was due to start and the engine held it back, for ``reason``."""

    rtype: ClassVar[int] = RecordType.HOLD
    n: int
    ltid: int
    ordinal: int
    name: str
    reason: str


class Unknown(msgspec.Struct, frozen=True):
    """A record of a type this code does not know (readers skip it; dumps show it)."""

    rtype: int
    fields: Any


Record = RunStart | Spawn | Dispatch | Outcome | StepStart | Wake | TaskExit | RunEnd | Hold

#: The struct of each record type.
TYPES: Final[dict[int, type[Record]]] = {
    cls.rtype: cls
    for cls in (RunStart, Spawn, Dispatch, Outcome, StepStart, Wake, TaskExit, RunEnd, Hold)
}


class Undecodable(msgspec.Struct, frozen=True):
    """A record whose payload did not decode (the store quarantines it).

    Attributes:
        error: What the decoder raised.
    """

    error: BaseException


# -- codec --------------------------------------------------------------------

_encoder = msgspec.msgpack.Encoder()
_values = msgspec.msgpack.Decoder(ext_hook=ext_hook)
_decoders: Final = {
    rtype: msgspec.msgpack.Decoder(cls, ext_hook=ext_hook) for rtype, cls in TYPES.items()
}
#: ``decode_dispatch(body)``: :func:`decode_body` of a DISPATCH, for the hot loops of readers.
decode_dispatch: Final = msgspec.msgpack.Decoder(Dispatch, ext_hook=ext_hook).decode

#: ``encode_body(record)``: a record's msgpack array, without the run prefix.
encode_body: Final = _encoder.encode


def encode(prefix: bytes, record: Record) -> bytes:
    """Return the payload of a run's record: run prefix + the record's msgpack array."""
    return prefix + _encoder.encode(record)


def decode(rtype: int, payload: bytes | memoryview) -> Record | Unknown:
    """Return the record of type ``rtype`` a payload (run prefix included) holds.

    Raises:
        msgspec.DecodeError: The payload is not that record (too short, a
            field of the wrong type, not msgpack).
    """
    return decode_body(rtype, memoryview(payload)[RUN_PREFIX.size :])


def decode_body(rtype: int, body: bytes | memoryview) -> Record | Unknown:
    """Return the record of type ``rtype`` its msgpack array ``body`` (no run prefix) holds."""
    decoder = _decoders.get(rtype)
    if decoder is None:
        return Unknown(rtype, _values.decode(body))
    record: Record = decoder.decode(body)
    if record.__class__ is Spawn:
        return _with_role(record)
    return record


def _with_role(spawn: Spawn) -> Spawn:
    """A SPAWN as it decodes: one without a role gets its label from its name (old layout)."""
    if spawn.role is not None or not spawn.parent_ltid:
        return spawn
    label = legacy_role(spawn.name)
    return msgspec.structs.replace(spawn, role=label.role, step_id=label.step_id, tool=label.tool)


def decode_record(
    rtype: int, payload: bytes | memoryview
) -> tuple[int, Record | Unknown | Undecodable]:
    """Return ``(run_no, record)``, never raising: a bad payload gives :class:`Undecodable`."""
    try:
        run_no = run_of(payload)
        return run_no, decode(rtype, payload)
    except Exception as exc:  # noqa: BLE001 - any decoder failure: quarantined, not fatal
        run_no = run_of(payload) if len(payload) >= RUN_PREFIX.size else 0
        return run_no, Undecodable(exc)


def run_of(payload: bytes | memoryview) -> int:
    """Return the run number of a record without decoding the rest."""
    return int(RUN_PREFIX.unpack_from(payload, 0)[0])


def as_list(record: Record | Unknown) -> list[Any]:
    """Return a record's fields as the positional list of its msgpack array."""
    if isinstance(record, Unknown):
        return list(record.fields) if isinstance(record.fields, list) else [record.fields]
    return list(msgspec.structs.astuple(record))


# -- rules readers share ------------------------------------------------------


def carried(record: Record, last_n: int) -> Dispatch | None:
    """Return the DISPATCH that ``record`` stands for, or None ("Carried dispatches").

    ``last_n`` is the last dispatch the reader has seen in the run; a
    SPAWN, OUTCOME, STEP_START or TASK_EXIT whose ``n`` passes it is that
    dispatch. Every reader (the replay, the store) calls this.
    """
    if isinstance(record, (Outcome, TaskExit, StepStart, Spawn)) and record.n > last_n:
        return record.implied()
    return None


def reserved_signal(name: str) -> str | None:
    """Return the reserved prefix signal ``name`` starts with (the engine's own), or None.

    >>> reserved_signal("child:run-1.sub.1"), reserved_signal("approve")
    ('child:', None)
    """
    for prefix in RESERVED_SIGNAL_PREFIXES:
        if name.startswith(prefix):
            return prefix
    return None


def reserved_signal_message(name: str) -> str:
    """The words every client-facing refusal of a reserved signal name uses."""
    prefixes = ", ".join(repr(p) for p in RESERVED_SIGNAL_PREFIXES)
    return (
        f"signal name {name!r} is in the engine's reserved namespace (names starting with "
        f"{prefixes}): the engine sends those signals itself (a sub-plan's end, a "
        "concurrency slot), a client never does"
    )


def tool_disabled_reason(tool: str) -> str:
    """Why an engine holds a step whose tool it does not enable (a HOLD's ``reason``)."""
    return f"tool {tool} is disabled on this engine (--enable-tool {tool})"


def function_missing_reason(function: str) -> str:
    """Why an engine holds a ``python`` step whose function it lacks (a HOLD's ``reason``)."""
    return (
        f"python function {function} is not registered on this engine "
        "(--import the module that @python_tool's it, or install its package)"
    )


def held_for(name: str, reason: str) -> tuple[Literal["tool", "function"], str]:
    """What a held step waits for an operator to provide: its tool, or its python function.

    ``name`` and ``reason`` are the HOLD record's: the step's name
    (``TOOL`` or ``TOOL:DETAIL``, a ``python`` step's detail its function)
    and why (:func:`tool_disabled_reason`, :func:`function_missing_reason`,
    the only reasons the engine gives). A reason this code does not make
    stands for the step's tool.

    >>> held_for("python:mod.fn", function_missing_reason("mod.fn"))
    ('function', 'mod.fn')
    >>> held_for("shell", tool_disabled_reason("shell"))
    ('tool', 'shell')
    """
    tool, _, detail = name.partition(":")
    if tool == "python" and detail and reason == function_missing_reason(detail):
        return "function", detail
    return "tool", tool


def root_role(entry: Any) -> Role:
    """Return the role of a run's root task, from the run's entry (RUN_START)."""
    return "planner" if entry_kind(entry) is EntryKind.PLAN else "task"


def legacy_role(name: str) -> TaskLabel:
    """Return the label of a SPAWN that has none, from its task's name.

    Old layout: see docs/wal-format.md, compatibility. This is the only place that
    reads a role from a name.
    """
    head, _, rest = name.partition(":")
    if head == "worker" and rest:
        return TaskLabel("worker", rest)
    if head == "tool" and rest:
        tool, _, step_id = rest.partition(":")
        return TaskLabel("tool", step_id or None, tool if step_id else None)
    if head == "step":
        return TaskLabel("step")
    return TaskLabel("task")
