"""Journal records as the durable layer writes and replays them: errors, packed.

The records themselves (types, layouts, codec, the carried-dispatch rule)
are defined once in :mod:`tiffany.wire.records`, which the store reads too, and
the values inside them are packed by :mod:`tiffany.wire.values`.
What is left here is the durable layer's own business: an exception
raised in a run is journaled as ``[type, args, repr, fields]``
(:func:`pack_error`), and a replay rebuilds the same exception from it
(:func:`unpack_error`, which imports the type by name: the store, which
only shows errors, never does).
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Iterable
from typing import Any

from tiffany.errors import TiffanyError
from tiffany.wire.values import ENCODE_ERRORS, pack_value, stand_in, stand_in_text, unpack_value

__all__ = ["ReplayedError", "pack_error", "unpack_error"]


class ReplayedError(TiffanyError):
    """A recorded exception whose type could not be rebuilt on replay."""

    code = "replay.error"


def pack_error(exc: BaseException) -> list[Any]:
    """Return ``[qualified type, args, repr, fields]`` for a journaled exception.

    ``fields`` holds a :class:`~tiffany.errors.TiffanyError`'s structured
    fields (a tool error's exit code and output), so a replay rebuilds the
    same error, not just its message.

    Never raises: an argument or the fields that do not pack (a structure
    holding itself) are kept as their stand-in, the repr as
    :func:`~tiffany.wire.values.stand_in_text` keeps it. The result may still
    not *encode* (a message holding a lone surrogate): the recorder then
    keeps it :func:`~tiffany.wire.values.encodable` (``durable/recorder.py``).
    """
    cls = type(exc)
    args = [_packed(a) for a in exc.args]
    fields = getattr(exc, "fields", None)
    packed_fields = _packed(fields) if isinstance(fields, dict) else None
    return [f"{cls.__module__}:{cls.__qualname__}", args, stand_in_text(exc), packed_fields]


def _packed(value: Any) -> Any:
    """:func:`~tiffany.wire.values.pack_value`, or the value's stand-in where it raises."""
    try:
        return pack_value(value)
    except ENCODE_ERRORS:
        return stand_in(value)


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
