"""What records say of a run and its steps: the one reading every fold uses."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from tiffany.wire.runstate import (
    UNSETTLED_STEPS,
    run_end_status,
    run_ending,
    run_opening,
    skipped_error,
    step_report,
    task_end_status,
)
from tiffany.wire.status import RunStatus, StepStatus

PLAN_ENTRY = {
    "kind": "plan",
    "plan": {
        "name": "p",
        "inputs": {"x": 1, "y": 2},
        "steps": [
            {"id": "a", "tool": "sleep"},
            {"id": "b"},
            {"id": 3, "tool": "echo"},  # no string id: no step
            "junk",
        ],
    },
    "inputs": {"y": 5},
}


def test_a_plan_run_opens_with_its_steps_tools_and_merged_inputs() -> None:
    opening = run_opening(PLAN_ENTRY)
    assert opening.plan
    assert opening.root == "planner"
    assert opening.status is RunStatus.RUNNING
    assert opening.steps == (("a", "sleep"), ("b", None))
    assert opening.inputs == {"x": 1, "y": 5}


def test_a_limited_run_opens_pending_and_a_callable_with_its_arguments() -> None:
    limited = {**PLAN_ENTRY, "concurrency": {"key": "k", "limit": 1}}
    assert run_opening(limited).status is RunStatus.PENDING
    callable_run = run_opening(
        {"kind": "callable", "target": "m:f", "args": [1], "kwargs": {"k": 2}}
    )
    assert not callable_run.plan
    assert callable_run.root == "task"
    assert callable_run.steps == ()
    assert callable_run.inputs == {"args": [1], "kwargs": {"k": 2}}


def test_a_malformed_entry_opens_as_a_run_of_no_plan() -> None:
    # The fold lists every run; only the runtime refuses to run a malformed entry.
    for raw in (None, {"kind": "task", "args": [1]}, {**PLAN_ENTRY, "concurrency": {"key": "k"}}):
        opening = run_opening(raw)
        assert (opening.plan, opening.root, opening.kind) == (False, "task", None)
        assert opening.status is RunStatus.RUNNING
        assert opening.inputs == {}


@dataclass
class _Outcome:  # the shape of agents.worker.StepOutcome
    step_id: str
    ok: bool
    output: Any = None
    error: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)


def test_a_worker_s_outcome_reads_the_same_as_a_dict_or_an_object() -> None:
    attempts = [{"attempt": 1, "started_at": 1.0, "ended_at": 2.5, "ok": True}]
    journaled = {"step_id": "a", "ok": True, "output": 7, "error": None, "attempts": attempts}
    from_dict = step_report(journaled)
    from_object = step_report(_Outcome("a", True, 7, None, attempts))
    assert from_dict == from_object
    assert from_dict is not None
    assert from_dict.status is StepStatus.SUCCEEDED
    assert from_dict.ended_at == 2.5
    assert step_report(_Outcome("a", True), objects=False) is None  # the journal holds dicts
    assert step_report(None) is None
    assert step_report("text") is None
    failed = step_report({"ok": False, "error": {"message": "x"}, "attempts": [{"ended_at": True}]})
    assert failed is not None
    assert failed.status is StepStatus.FAILED
    assert failed.ended_at is None  # a bool is no time


def test_a_plan_s_end_gives_its_outputs_steps_and_usage() -> None:
    steps = {"a": {"status": "succeeded"}}
    ok = run_ending(
        "succeeded", {"outputs": {"o": 1}, "steps": steps, "usage": {"tokens": 3}}, plan=True
    )
    assert ok is not None
    assert ok.status is RunStatus.SUCCEEDED
    assert (ok.outputs, ok.steps, ok.usage) == ({"o": 1}, steps, {"tokens": 3})
    failed = run_ending("failed", ["PlanFailed", "m", "tb", {"steps": steps}], plan=True)
    assert failed is not None
    assert (failed.outputs, failed.steps, failed.usage) == (None, steps, None)
    callable_end = run_ending("succeeded", {"steps": steps}, plan=False)
    assert callable_end is not None
    assert (callable_end.outputs, callable_end.steps) == ({"steps": steps}, None)
    assert run_ending("exploded", None, plan=True) is None
    assert run_end_status("cancelled") is RunStatus.CANCELLED
    assert run_end_status(["cancelled"]) is None


def test_task_ends_and_unsettled_steps() -> None:
    assert task_end_status("done") is RunStatus.SUCCEEDED
    assert task_end_status("crashed") is RunStatus.FAILED
    assert task_end_status("blocked_io") is None
    assert {"pending", "running"} == UNSETTLED_STEPS
    assert skipped_error("cancelled") == {"message": "skipped: the run cancelled"}


def test_importing_it_loads_no_model_library() -> None:
    code = (
        "import sys, tiffany.wire.runstate; "
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'sqlalchemy'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
