"""Python tool functions of the exact re-run tests (the engine imports them: TOOL_MODULES)."""

from __future__ import annotations

import json
from typing import Any

from tiffany.agents.tools.python import python_tool

#: Levels of nesting of the odd value's ``deep`` part: past the store's ``MAX_JSON_DEPTH`` (64).
DEPTH = 80


def odd() -> dict[str, Any]:
    """A value JSON cannot hold: NUL, bytes, non-finite floats, tuples, sets, deep nesting."""
    deep: Any = "bottom"
    for i in range(DEPTH):
        deep = [i, deep] if i % 2 else {"level": deep}
    return {
        "nul": "a\x00b",
        "bytes": b"\x00\xff tiffany",
        "inf": float("inf"),
        "minus_inf": float("-inf"),
        "tuple": (1, "two", (3.5, None)),
        "set": {3, 1, 2},
        "frozen": frozenset({7, 5}),
        "deep": deep,
    }


def tagged(value: Any) -> Any:
    """``value`` with its type at every level, as JSON (what "equal in type and value" compares)."""
    if value is None or isinstance(value, bool):
        return [type(value).__name__, value]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, str):
        return ["str", value.encode("utf-8", "surrogatepass").hex()]
    if isinstance(value, bytes):
        return ["bytes", value.hex()]
    if isinstance(value, dict):
        return ["dict", [[k, tagged(v)] for k, v in value.items()]]
    if isinstance(value, list | tuple):
        return [type(value).__name__, [tagged(v) for v in value]]
    if isinstance(value, set | frozenset):
        return [type(value).__name__, sorted(json.dumps(tagged(v)) for v in value)]
    return ["other", repr(value)]


@python_tool("test.odd_value")
def odd_value() -> dict[str, Any]:
    """Return :func:`odd`."""
    return odd()


@python_tool("test.gate")
def gate(open_: bool) -> bool:
    """Fail unless ``open_``: the step a re-run restarts from."""
    if not open_:
        raise ValueError("the gate is closed")
    return True


@python_tool("test.describe")
def describe(value: Any) -> str:
    """Return :func:`tagged` of ``value``, as JSON text (any store keeps it as it is)."""
    return json.dumps(tagged(value))
