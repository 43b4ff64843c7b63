"""Journal records: what the durable layer writes into the WAL, and how.

The WAL stores opaque ``(type, payload)`` records; this module gives them a
meaning. Every record of a run starts with the run's number as a 4-byte
little-endian prefix, so a reader can skip other runs' records without
decoding them; the rest is a msgpack array (msgspec).

Record types (the WAL's type byte)::

    RUN_START  run_no | [run_id, name, entry, ts]
    SPAWN      run_no | [n, ltid, parent_ltid, name]
    DISPATCH   run_no | [n, ltid, kind, arg]
    OUTCOME    run_no | [n, ltid, kind, value]          Now(), Random()
    STEP_START run_no | [n, ltid, ordinal, name, attempt]
    WAKE       run_no | [at, ltid, cause, ok, value]     from outside the run
    TASK_EXIT  run_no | [n, ltid, state, value]
    RUN_END    run_no | [status, value, ts]
    CANCEL     run_no | [reason, ts]                     a cancel request
    HOLD       run_no | [n, ltid, ordinal, name, reason] a step held, not started

``n`` counts the run's dispatches (1, 2, ...); ``ltid`` is the task's id
within its run (1 for the root), so a replay in a fresh scheduler, where
global task ids differ, compares like with like. ``at`` is the run's
dispatch count when an external wake-up entered the ready queue.

Carried dispatches: every dispatch has exactly one record whose ``n`` first
reaches its number. Usually a DISPATCH; but a ``NewTask``, ``Now()``,
``Random()`` or ``Step`` dispatch, and the ``return`` that ends a task other
than the run's root, is journaled by the record it causes, which then
stands for the DISPATCH record it implies::

    SPAWN      [n, ltid, parent, name]           -> DISPATCH [n, parent, "new_task", name]
    OUTCOME    [n, ltid, kind, value]            -> DISPATCH [n, ltid, kind, None]
    STEP_START [n, ltid, ordinal, name, attempt] -> DISPATCH [n, ltid, "step", name]
    TASK_EXIT  [n, ltid, state, value]           -> DISPATCH [n, ltid, "return", None]

(names cut to 120 characters, as a DISPATCH argument is). A record of these
types whose ``n`` does not pass the last dispatch seen carries nothing: the
root's SPAWN (``n`` 0), an OUTCOME after its DISPATCH (``Sleep``), a step
re-run at recovery, the exit of a task closed by a second kill (no
dispatch), the root's exit (after its explicit ``return``), and everything
in journals written before this rule.

A HOLD says that a step was due to start and the engine's ``step_gate``
held it back (its tool is disabled on this engine); the task waits, parked,
until an engine that lets it start replays the run. It is a note for
readers (the store shows the step waiting, with ``reason``): replay ignores
it, and a reader that does not know a record type skips it. A held step's
dispatch is journaled by an explicit DISPATCH (no STEP_START carries it),
so the dispatches after it keep their numbers on replay.

Values that came from outside (step results, ``Now()``, thread results) are
stored in full with :func:`pack_value`, which keeps tuples, sets and bytes
apart from lists and strings; exceptions become ``[type, args, repr]``.

Discussion: the run prefix is fixed-width on purpose. A variable-width
msgpack int would force a decode to learn the run; with 4 raw bytes,
``bytes[:4] == prefix`` filters a shared WAL at memcmp speed.
"""

from __future__ import annotations

import builtins
import enum
import importlib
import struct
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from tiffany.errors import TiffanyError

__all__ = [
    "RUN_PREFIX",
    "RecordType",
    "ReplayedError",
    "canonical",
    "decode",
    "decode_fields",
    "encode",
    "encode_fields",
    "pack_error",
    "pack_value",
    "run_of",
    "unpack_error",
    "unpack_value",
]

RUN_PREFIX: Final = struct.Struct("<I")


class RecordType(enum.IntEnum):
    """The WAL type byte of each journal record (0 is the WAL's, reserved)."""

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


_EXT_TUPLE: Final = 1
_EXT_SET: Final = 2
_EXT_FROZENSET: Final = 3
_EXT_UNENCODABLE: Final = 4

_encoder = msgspec.msgpack.Encoder()


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _EXT_TUPLE:
        return tuple(unpack_value(x) for x in _decoder.decode(data))
    if code == _EXT_SET:
        return {unpack_value(x) for x in _decoder.decode(data)}
    if code == _EXT_FROZENSET:
        return frozenset(unpack_value(x) for x in _decoder.decode(data))
    if code == _EXT_UNENCODABLE:
        return Unencodable(bytes(data).decode("utf-8", "replace"))
    raise ValueError(f"unknown msgpack extension {code}")


_decoder = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


class Unencodable:
    """Stands for a value the journal could not store (its repr is kept)."""

    __slots__ = ("repr",)

    def __init__(self, text: str) -> None:
        self.repr = text

    def __repr__(self) -> str:
        return f"Unencodable({self.repr})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unencodable) and other.repr == self.repr

    def __hash__(self) -> int:
        return hash(self.repr)


_PLAIN = (str, int, float, bool, bytes, type(None))


def pack_value(value: Any) -> Any:
    """Return ``value`` in a form msgpack keeps exactly (tuples and sets as extensions).

    A list or dict with nothing to pack inside comes back as itself, not a
    copy: encode the result before the value can change.
    """
    cls = value.__class__
    if cls in _PLAIN:
        return value
    if cls is dict:
        out: Any = None  # a copy, made only when a value packs differently
        for k, v in value.items():
            if v.__class__ not in _PLAIN:
                p = pack_value(v)
                if p is not v:
                    if out is None:
                        out = dict(value)
                    out[k] = p
        return value if out is None else out
    if cls is list:
        out = None
        for i, v in enumerate(value):
            if v.__class__ not in _PLAIN:
                p = pack_value(v)
                if p is not v:
                    if out is None:
                        out = list(value)
                    out[i] = p
        return value if out is None else out
    if cls is tuple:
        return msgspec.msgpack.Ext(_EXT_TUPLE, _encoder.encode([pack_value(v) for v in value]))
    if cls is set or cls is frozenset:
        code = _EXT_SET if cls is set else _EXT_FROZENSET
        items = sorted((pack_value(v) for v in value), key=repr)
        return msgspec.msgpack.Ext(code, _encoder.encode(items))
    try:
        return msgspec.to_builtins(value)
    except (TypeError, msgspec.EncodeError):
        return msgspec.msgpack.Ext(_EXT_UNENCODABLE, repr(value)[:2000].encode())


def unpack_value(value: Any) -> Any:
    """Invert :func:`pack_value` for values nested in decoded lists and dicts."""
    cls = value.__class__
    if cls is list:
        return [unpack_value(v) for v in value]
    if cls is dict:
        return {k: unpack_value(v) for k, v in value.items()}
    return value


class ReplayedError(TiffanyError):
    """A recorded exception whose type could not be rebuilt on replay."""

    code = "replay.error"


def pack_error(exc: BaseException) -> list[Any]:
    """Return ``[qualified type, args, repr, fields]`` for a journaled exception.

    ``fields`` holds a :class:`~tiffany.errors.TiffanyError`'s structured
    fields (a tool error's exit code and output), so a replay rebuilds the
    same error, not just its message.
    """
    cls = type(exc)
    args = [pack_value(a) for a in exc.args]
    fields = getattr(exc, "fields", None)
    packed_fields = pack_value(fields) if isinstance(fields, dict) else None
    return [f"{cls.__module__}:{cls.__qualname__}", args, repr(exc)[:2000], packed_fields]


def unpack_error(packed: Iterable[Any]) -> BaseException:
    """Rebuild a journaled exception (same type, args and fields where possible)."""
    items = list(packed)
    name, args, text = items[:3]
    fields = items[3] if len(items) > 3 else None
    module, _, qualname = str(name).partition(":")
    exc: BaseException | None = None
    try:
        obj: Any = builtins if module == "builtins" else importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            exc = obj(*[unpack_value(a) for a in args])
    except Exception:  # noqa: BLE001 - not importable or not constructible: a stand-in below
        exc = None
    if exc is None:
        return ReplayedError(f"{name}: {text}", type=name, repr=text)
    if isinstance(fields, dict) and hasattr(exc, "fields"):
        exc.fields = unpack_value(fields)
    return exc


def canonical(value: Any) -> bytes:
    """Return the journaled bytes of ``value`` (for comparing values exactly)."""
    return _encoder.encode(pack_value(value))


def encode(prefix: bytes, fields: list[Any] | tuple[Any, ...]) -> bytes:
    """Return the payload for a run's record: run prefix + msgpack array."""
    return prefix + _encoder.encode(fields)


#: ``encode_fields(fields)``: the msgpack array of a record, without the run
#: prefix (``encode`` is ``prefix + encode_fields(fields)``).
encode_fields: Final = _encoder.encode


def decode(payload: bytes | memoryview) -> tuple[int, list[Any]]:
    """Return ``(run_no, fields)`` of a journal record's payload."""
    (run_no,) = RUN_PREFIX.unpack_from(payload, 0)
    return run_no, _decoder.decode(memoryview(payload)[RUN_PREFIX.size :])


def decode_fields(payload: bytes) -> list[Any]:
    """Return only the fields of a record (the caller already knows its run)."""
    return _decoder.decode(payload[4:])  # type: ignore[no-any-return]


def run_of(payload: bytes | memoryview) -> int:
    """Return the run number of a record without decoding the rest."""
    return int(RUN_PREFIX.unpack_from(payload, 0)[0])
