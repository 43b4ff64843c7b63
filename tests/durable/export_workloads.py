"""Code whose journal the export tests record, then change (``MODE``) and replay.

``TIFFANY_EXPORT_MODE=b`` (or ``MODE["value"] = "b"`` in the test's process)
is the same code after a change that alters what it yields: a replay of a
run recorded in mode ``a`` must name the first divergence.
"""

from __future__ import annotations

import os

from tiffany.agents.tools.python import python_tool
from tiffany.durable import Step
from tiffany.kernel import NewTask, Now, Sleep, WaitTask

MODE = {"value": os.environ.get("TIFFANY_EXPORT_MODE", "a")}
#: Calls of the python tool (a replay never calls it: its step's result is journaled).
CALLS: list[int] = []


def double(x: int) -> int:
    """A step's function: its result is journaled, a replay never calls it."""
    return x * 2


def _child(i: int) -> object:
    yield Sleep(0.001)
    return (yield Step(double, i))


def fan(n: int) -> object:
    """A ``callable`` run: children, steps, a durable sleep, ``Now()``."""
    tids = []
    for i in range(n):
        tids.append((yield NewTask(_child(i), name=f"child-{i}")))
    if MODE["value"] == "a":
        yield Now()
    else:
        yield Sleep(0.001)  # the change: a sleep where a clock read was
    total = 0
    for t in tids:
        total += yield WaitTask(t)
    return total


@python_tool("export_test.count")
def count(n: int) -> object:
    """A generator python tool: one durable step, its result journaled."""
    CALLS.append(n)
    total = 0
    for i in range(n):
        if MODE["value"] == "a":
            yield Sleep(0.001)
        else:
            yield Now()  # the change: a clock read where a sleep was
        total += i
    return total


PLAN = {
    "name": "export-plan",
    "steps": [
        {
            "id": "a",
            "tool": "python",
            "args": {"function": "export_test.count", "kwargs": {"n": 3}},
        },
        {
            "id": "b",
            "tool": "python",
            "args": {"function": "export_test.count", "kwargs": {"n": 2}},
            "after": ["a"],
        },
    ],
    "outputs": {"a": "${steps.a.output}", "b": "${steps.b.output}"},
}
