"""Journal values as the store shows them: made JSON, bounded, and errors read.

The records themselves are :mod:`tiffany.wire.records` (the store decodes them
with the same typed structs the durable layer writes). What is left here
is the store's reading of the values they hold: tuples, sets, bytes,
stand-ins for unencodable values (which keep a ``repr``), and errors
packed as ``[type, args, repr, fields]``, made into JSON every store takes.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from tiffany.store.models import TaskState

__all__ = [
    "BLOCKING_KINDS",
    "MAX_JSON_DEPTH",
    "attempt_times",
    "error_dict",
    "excerpt",
    "jsonable",
    "text",
]


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
    "receive": TaskState.BLOCKED_SYNC,  # a signal (tiffany/agents/tools/signal.py)
}


#: How deep :func:`jsonable` follows nested values; deeper ones become a marker.
MAX_JSON_DEPTH: Final = 64
#: Integers a JSON column keeps as numbers: 64-bit signed (others become text).
MAX_INT_BITS: Final = 63
#: Integers longer than this become a marker (``str()`` of them is slow and capped).
MAX_INT_TEXT_BITS: Final = 10_000
#: The longest excerpt of a quarantined record's fields, in characters.
MAX_EXCERPT_CHARS: Final = 2_000

_EXCERPT: Final = reprlib.Repr()
_EXCERPT.maxlevel = 4
_EXCERPT.maxstring = 200
_EXCERPT.maxother = 200
_EXCERPT.maxlong = 60


def _clean(value: str) -> str:
    """Return ``value`` as text SQL stores: NUL escaped, lone surrogates escaped."""
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _number(value: int) -> int | str:
    bits = value.bit_length()
    if bits <= MAX_INT_BITS:
        return value
    return str(value) if bits <= MAX_INT_TEXT_BITS else f"<int of {bits} bits>"


_json_encode: Final = msgspec.json.Encoder().encode
_json_decode: Final = msgspec.json.Decoder().decode
#: ``bytes.translate`` tables: digits to ``9`` and the rest to a space; and
#: the bytes deleted to leave only brackets, quotes and backslashes.
_DIGITS_ONLY: Final = bytes(57 if 48 <= b <= 57 else 32 for b in range(256))
_NOT_STRUCTURE: Final = bytes(b for b in range(256) if b not in b'[]{}"\\')
#: A run of 19 digits (2**63 has 19): an integer that may not fit in 63 bits.
_LONG_NUMBER: Final = b"9" * 19
#: A JSON string, once everything but brackets and quotes is gone.
_STRING: Final = re.compile(rb'"[^"]*"')
#: An innermost empty pair of brackets.
_EMPTY_PAIR: Final = re.compile(rb"\[\]|\{\}")


def _shallow(text: bytes) -> bool:
    """True if JSON ``text`` nests at most ``MAX_JSON_DEPTH`` containers deep."""
    if text.count(b"[") + text.count(b"{") <= MAX_JSON_DEPTH:
        return True
    # Escapes go first (an escaped backslash, an escaped quote, then the
    # rest: \\n, \\uXXXX...), then strings: what is left is the brackets.
    left = text.translate(None, _NOT_STRUCTURE)
    if b"\\" in left:
        left = left.replace(b"\\\\", b"").replace(b'\\"', b"").replace(b"\\", b"")
    left = left.replace(b'""', b"")
    if b'"' in left:  # strings that hold brackets
        left = _STRING.sub(b"", left)
    for _ in range(MAX_JSON_DEPTH):  # each pass takes away one level, innermost first
        left = _EMPTY_PAIR.sub(b"", left)
        if not left:
            return True
    return False


def _plain(value: dict[Any, Any] | list[Any]) -> bool:
    r"""True if :func:`jsonable` would return ``value`` as it is: found in C, not by a walk.

    msgspec encodes it and decodes it back equal: no tuples, sets, bytes,
    stand-ins or non-string keys, no non-finite float (it comes back
    ``null``); lone surrogates do not encode. The text then shows no NUL
    (``\u0000``), no run of 19 digits (an integer that may need more than
    63 bits) and no nesting past ``MAX_JSON_DEPTH``. A false alarm (say,
    19 digits inside a string) only sends the value the long way.
    """
    try:
        text = _json_encode(value)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
        return False
    if b"\\u0000" in text or _LONG_NUMBER in text.translate(_DIGITS_ONLY):
        return False
    return _json_decode(text) == value and _shallow(text)


def jsonable(value: Any, _depth: int = 0) -> Any:
    """Return ``value`` as plain JSON data every store takes, deterministically.

    Journal values may hold tuples, sets, bytes and stand-ins for values the
    journal could not encode (which keep a ``repr``); JSON columns take none
    of them. What SQL cannot store is made text the same way every time:
    non-finite floats by ``repr`` (PostgreSQL refuses NaN), NUL characters
    and lone surrogates escaped, integers beyond 64 bits as text. Values
    nested deeper than ``MAX_JSON_DEPTH`` become a marker string, so neither
    this function nor the JSON encoder recurses without bound.
    """
    cls = value.__class__
    if _depth == 0 and (cls is dict or cls is list) and value and _plain(value):
        return value  # plain JSON already: itself, not a copy
    if cls is str:  # the common cases first, by exact type (subclasses take the long way)
        return _clean(value)
    if cls is int:
        return value if value.bit_length() <= MAX_INT_BITS else _number(value)
    if cls is dict and _depth < MAX_JSON_DEPTH:
        return {_key(k): jsonable(v, _depth + 1) for k, v in value.items()}
    return _jsonable_other(value, _depth)


def _jsonable_other(value: Any, _depth: int) -> Any:
    """:func:`jsonable` of anything but a plain ``str``, ``int`` or shallow ``dict``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, int):
        return _number(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if _depth >= MAX_JSON_DEPTH:
        return f"<nested deeper than {MAX_JSON_DEPTH}>"
    depth = _depth + 1
    if isinstance(value, Mapping):
        return {_key(k): jsonable(v, depth) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, depth) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((jsonable(v, depth) for v in value), key=repr)
    if isinstance(value, bytes | bytearray | memoryview):
        return _clean(bytes(value).decode("utf-8", "replace"))
    text = getattr(value, "repr", None)  # a stand-in: tiffany.wire.values.Unencodable
    return _clean(text) if isinstance(text, str) else excerpt(value)


def _key(key: Any) -> str:
    return _clean(key) if isinstance(key, str) else excerpt(key)


def text(value: Any) -> str:
    """Return ``value`` as text a column takes (no NUL, no lone surrogate, bounded repr)."""
    return _clean(value if isinstance(value, str) else excerpt(value))


def excerpt(value: Any, limit: int = MAX_EXCERPT_CHARS) -> str:
    """Return a bounded, sanitized ``repr`` of ``value`` (safe on any depth or size)."""
    if isinstance(value, str):
        out = value
    elif isinstance(value, int) and not isinstance(value, bool):
        out = str(_number(value))
    else:
        try:
            out = _EXCERPT.repr(value)
        except Exception as exc:  # noqa: BLE001 - a hostile __repr__: say so
            out = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
    return _clean(out[:limit])


def error_dict(packed: Any) -> dict[str, Any]:
    """Return a journaled error (``[type, args, repr, fields]``) as a JSON object.

    The ``steps`` summary a failed plan carries in its fields is left out:
    the steps table holds it.
    """
    if isinstance(packed, list | tuple) and len(packed) >= 3 and isinstance(packed[0], str):
        args = packed[1] if isinstance(packed[1], list | tuple) else []
        message = args[0] if args and isinstance(args[0], str) else text(packed[2])
        out: dict[str, Any] = {
            "type": _clean(packed[0]),
            "message": _clean(message),
            "args": jsonable(args),
            "repr": jsonable(packed[2]),
        }
        fields = packed[3] if len(packed) > 3 else None
        if isinstance(fields, Mapping):
            out["fields"] = {_key(k): jsonable(v) for k, v in fields.items() if k != "steps"}
        return out
    value = jsonable(packed)
    return {"message": value if isinstance(value, str) else excerpt(value), "repr": value}


def attempt_times(attempts: Any, made: Any = None) -> dict[str, Any]:
    """Return the step's start and end times from its attempt records.

    ``made``: ``attempts`` made JSON-able already (:func:`jsonable`), if the caller has it.
    """
    if not isinstance(attempts, list) or not attempts:
        return {}
    out: dict[str, Any] = {"attempts": jsonable(attempts) if made is None else made}
    first, last = attempts[0], attempts[-1]
    if isinstance(first, Mapping) and isinstance(first.get("started_at"), int | float):
        out["started_at"] = float(first["started_at"])
    if isinstance(last, Mapping) and isinstance(last.get("ended_at"), int | float):
        out["ended_at"] = float(last["ended_at"])
    return out
