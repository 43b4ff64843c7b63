"""What the journal records of a dispatch, and which dispatches another record carries.

A dispatch is journaled as ``(kind, argument)``: the call's stable ``kind``
and one small deterministic argument (a name, a duration, a run-local task
id), so that a replay compares like with like without serialising the call.
Some dispatches need no DISPATCH record of their own: the record they cause
at once stands for them (see ``tiffany/wire/records.py``, "Carried dispatches"):
:func:`carried` is the writer's half of that rule (which calls need no
DISPATCH record), ``tiffany.wire.records.carried`` the readers' half.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from types import GeneratorType
from typing import Any, Final

from tiffany.kernel import (
    RETURNED,
    KillTask,
    NewTask,
    Now,
    Patched,
    Random,
    Receive,
    RunInThread,
    Sleep,
    Step,
    SystemCall,
    WaitTask,
)
from tiffany.wire.records import MAX_ARG_CHARS
from tiffany.wire.values import (
    ENCODE_ERRORS,
    Unencodable,
    canonical,
    legacy_canonical,
    stand_in_text,
    text_of,
)

__all__ = ["CARRIED_CALLS", "MAX_ARG_CHARS", "carried", "describe", "is_generator_step", "same"]

#: Calls whose dispatch is always carried by the record they cause (see ``carried``).
CARRIED_CALLS: Final = frozenset({Now, Random, Step})

_GENERATOR_KIND: Final = "call"
#: ``co_flags`` bit of a generator function's code (``inspect.CO_GENERATOR``).
_CO_GENERATOR: Final = inspect.CO_GENERATOR


def describe(ltid_of: Callable[[int], int | None], y: Any) -> tuple[str, Any]:
    """Return the (kind, argument) recorded for a yielded value.

    ``ltid_of`` maps a global task id to its run-local id (for joins and kills).
    An argument that is not a number is recorded as text: ``str()`` of it,
    cut to ``MAX_ARG_CHARS``, made encodable (:func:`~tiffany.wire.values.text_of`:
    a name holding a lone surrogate is kept escaped, a ``__str__`` that
    raises is named), the same for the recorder and the replay.
    """
    kind, arg = _described(ltid_of, y)
    if arg is not None and not isinstance(arg, int | float | bool):
        arg = text_of(arg)[:MAX_ARG_CHARS]
    return kind, arg


def _described(ltid_of: Callable[[int], int | None], y: Any) -> tuple[str, Any]:
    if y is None:
        return "yield", None
    if y is RETURNED:
        return "return", None
    cls = y.__class__
    if cls is WaitTask or cls is KillTask:
        return y.kind, ltid_of(y.tid)
    if cls is Sleep:
        return "sleep", y.seconds
    if cls is Receive:
        return "receive", y.channel
    if cls is NewTask:
        return "new_task", y.fields()["name"]
    if cls is Patched:
        return "patched", y.patch_id
    if cls is Step or cls is RunInThread:
        return y.kind, y.fields()["fn"]
    if isinstance(y, SystemCall):
        return y.kind, None
    if isinstance(y, Generator):
        return _GENERATOR_KIND, getattr(y, "__qualname__", "?")
    return "value", type(y).__name__


def carried(y: Any) -> bool:
    """True if the record that follows this dispatch stands for it (no DISPATCH record).

    ``NewTask`` (its SPAWN; not when the kernel refuses a non-generator),
    ``Now()`` and ``Random()`` (their OUTCOME), ``Step`` (its STEP_START).
    A task's final ``return`` is decided by the journal (it knows the root).
    """
    cls = y.__class__
    if cls in CARRIED_CALLS:
        return True
    return cls is NewTask and y.coro.__class__ is GeneratorType


def is_generator_step(call: Step | RunInThread) -> bool:
    """True for a ``Step`` of a generator function (it runs as a task, not in a thread)."""
    if not isinstance(call, Step):
        return False
    code = getattr(call.fn, "__code__", None)  # functions and bound methods
    if code is not None:
        return bool(code.co_flags & _CO_GENERATOR)
    return inspect.isgeneratorfunction(call.fn)  # partials and other callables


def same(recorded: Any, actual: Any) -> bool:
    """Compare a journaled value (decoded) with a value produced by the replay.

    Both are compared in their journaled form (:func:`~tiffany.wire.values.pack_value`),
    so a dataclass result equals the dict it was recorded as, and a tuple
    still differs from a list. The replay rebuilds from the journal, stand-ins
    included, so a value holding one packs as it did when recorded: a stand-in
    packs as itself. A whole value's stand-in (a result too large for its
    record) is compared with the text the value would have been kept as.

    A value that differs is compared once more with
    :func:`~tiffany.wire.values.legacy_canonical` (old layout: see
    docs/wal-format.md, compatibility). Only a divergence pays for it.
    """
    if recorded.__class__ is Unencodable:
        return recorded.repr == stand_in_text(actual)
    try:
        if canonical(recorded) == canonical(actual):
            return True
        return bool(legacy_canonical(recorded) == legacy_canonical(actual))
    except ENCODE_ERRORS:  # the replay's value has no journaled form: not the recorded one
        return False
