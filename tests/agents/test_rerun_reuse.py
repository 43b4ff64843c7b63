"""Which steps a re-run reuses (``tiffany/agents/rerun.py``): the DAG, dynamic children, errors.

The DAG is the store's reading of the run (``tiffany/store/graph.py``), as
the engine passes it (``tiffany/engine/stored_runs.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tiffany.agents.plan import PlanError
from tiffany.agents.rerun import journal_reuse, reused_origin, reused_output
from tiffany.agents.rerun import rerun_reuse as _rerun_reuse
from tiffany.store.graph import plan_graph
from tiffany.wire.records import TaskExit

PLAN = {
    "name": "p",
    "steps": [
        {"id": "a", "tool": "sleep", "args": {"seconds": 0}},
        {"id": "plan", "tool": "llm", "args": {"prompt": "x"}, "after": ["a"], "dynamic": True},
        {"id": "z", "tool": "sleep", "args": {"seconds": 0}, "after": ["a"]},
    ],
}
CHILDREN = {
    "steps": [{"id": "k1", "tool": "sleep"}, {"id": "k2", "tool": "sleep", "after": ["k1"]}]
}


def rerun_reuse(
    plan: dict[str, Any], steps: dict[str, dict[str, Any]], from_step: str | None, run_id: str
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    graph = plan_graph(plan, {sid: s["output"] for sid, s in steps.items()})
    return _rerun_reuse({sid: n.after for sid, n in graph.items()}, steps, from_step, run_id)


def _steps(**status: str) -> dict[str, dict[str, Any]]:
    return {
        sid: {"status": st, "output": CHILDREN if sid == "plan" else sid, "run_id": "r0", "seq": i}
        for i, (sid, st) in enumerate(status.items(), 1)
    }


def test_the_failed_steps_and_their_dependents_run_again_the_rest_is_reused() -> None:
    steps = _steps(a="succeeded", plan="succeeded", z="succeeded", k1="failed", k2="skipped")
    reuse, restart = rerun_reuse(PLAN, steps, None, "r1")
    assert restart == ["k1"]
    assert sorted(reuse) == ["a", "plan", "z"]  # k2 depends on k1: runs again
    assert reuse["plan"] == {"output": CHILDREN, "run_id": "r0", "seq": 2}


def test_from_a_step_everything_downstream_runs_again_dynamic_children_included() -> None:
    steps = _steps(a="succeeded", plan="succeeded", z="succeeded", k1="succeeded", k2="succeeded")
    reuse, restart = rerun_reuse(PLAN, steps, "plan", "r1")
    assert (restart, sorted(reuse)) == (["plan"], ["a", "z"])
    reuse, _ = rerun_reuse(PLAN, steps, "k2", "r1")
    assert sorted(reuse) == ["a", "k1", "plan", "z"]


def test_a_step_that_is_not_there_or_no_failure_to_restart_is_refused() -> None:
    steps = _steps(a="succeeded", plan="succeeded", z="succeeded", k1="succeeded", k2="succeeded")
    with pytest.raises(PlanError) as info:
        rerun_reuse(PLAN, steps, "nope", "r1")
    assert info.value.errors[0]["loc"] == "from_step"
    with pytest.raises(PlanError, match="no failed step"):
        rerun_reuse(PLAN, steps, None, "r1")


def test_reused_outputs_are_the_journal_records_and_the_projection_is_marked() -> None:
    """The worker's TASK_EXIT holds the exact output; a lost record falls back, marked."""
    exact = {"t": (1, 2), "s": {3}, "b": b"\x00", "inf": float("inf")}
    reuse = {
        "a": {"output": {"t": [1, 2]}, "run_id": "r0", "seq": 7},  # the store's projection
        "z": {"output": "from the store", "run_id": "r0", "seq": 9},
    }
    outcome = {"step_id": "a", "ok": True, "output": exact, "error": None, "attempts": []}
    records = {7: TaskExit(5, 3, "done", outcome)}
    journaled, projected = journal_reuse(reuse, records)
    assert projected == ["z"]
    out = reused_output(journaled["a"])
    assert out == exact
    assert isinstance(out["t"], tuple)
    assert isinstance(out["s"], set)
    assert reused_origin(journaled["a"]) == {"run_id": "r0", "seq": 7}
    assert reused_output(journaled["z"]) == "from the store"
    assert reused_origin(journaled["z"]) == {"run_id": "r0", "seq": 9, "projected": True}
    failed = {**outcome, "ok": False}  # a record that did not settle the step: not taken
    assert journal_reuse(reuse, {7: TaskExit(5, 3, "done", failed)})[1] == ["a", "z"]
