"""The workflow ``golden.flow`` that ``make_plan_golden.py`` records (imported by the tests too)."""

from __future__ import annotations

from tiffany import workflow
from tiffany.kernel import Now, Step
from tiffany.workflows import tool


def triple(x: int) -> int:
    return 3 * x


@workflow("golden.flow", budget={"tokens": 1000})
def flow(n: int = 2):
    got = []
    for i in range(n):
        got.append((yield Step(triple, i)))
    slept = yield tool("sleep", seconds=0.01)
    now = yield Now()
    return {"tripled": got, "slept": slept, "late": now > 0}
