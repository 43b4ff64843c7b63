"""Where a workflow run's journal is forked for its re-run (``tiffany/workflows/rerun.py``).

Pure: decoded records in, the index of the first record not copied out.
"""

from __future__ import annotations

from typing import Any

import pytest

from tiffany.wire.records import Dispatch, RunEnd, Spawn, StepStart, Wake
from tiffany.workflows.rerun import RerunRefused, call_dispatches, fork_point


def _error(**fields: Any) -> list[Any]:
    return ["tiffany.workflows.calls:ToolFailed", ["boom"], "ToolFailed('boom')", fields]


RECORDS: list[Any] = [
    Spawn(0, 1, 0, "wf", "task"),
    Dispatch(1, 1, "call", "tool:python#11111111"),  # tool_1
    StepStart(3, 1, 1, "python:a", 1),
    Wake(3, 1, "step", True, [[True, "a"], 0.0, 0.0]),
    Dispatch(4, 1, "call", "signal:go#22222222"),  # not numbered: a signal is no call
    Dispatch(5, 1, "call", "helper"),  # the user's own nested generator
    Dispatch(6, 1, "call", "child:leaf#33333333"),  # child_2
    Dispatch(9, 1, "call", "tool:python#44444444"),  # tool_3
    StepStart(11, 1, 2, "python:b", 1),
    Wake(11, 1, "step", True, [[False, {"message": "no"}], 0.0, 0.0]),
]


def test_calls_are_numbered_as_the_run_made_them() -> None:
    assert call_dispatches(RECORDS) == {"tool_1": 1, "child_2": 6, "tool_3": 7}


def test_the_default_restart_point_is_the_call_the_run_failed_at() -> None:
    failed = [*RECORDS, RunEnd("failed", _error(call="tool_3"), 0.0)]
    assert fork_point("run-1", failed, None) == (7, "tool_3")
    child = [*RECORDS, RunEnd("failed", _error(child="run-1.child_2.1"), 0.0)]
    assert fork_point("run-1", child, None) == (6, "child_2")


def test_a_named_call_is_the_restart_point_and_an_unknown_one_is_refused() -> None:
    assert fork_point("run-1", RECORDS, "child_2") == (6, "child_2")
    with pytest.raises(RerunRefused) as refused:
        fork_point("run-1", RECORDS, "tool_2")
    assert refused.value.errors[0]["loc"] == "from_step"
    assert "tool_1, child_2, tool_3" in refused.value.message


def test_a_run_that_failed_at_a_plain_step_restarts_at_that_step() -> None:
    step = [
        Spawn(0, 1, 0, "wf", "task"),
        Dispatch(1, 1, "call", "tool:python#11111111"),
        StepStart(2, 1, 1, "mod:ok", 1),
        Wake(2, 1, "step", True, 1),
        StepStart(3, 1, 2, "mod:shaky", 1),
        Wake(3, 1, "step", False, ["builtins:RuntimeError", ["shut"], "RuntimeError('shut')"]),
        RunEnd("failed", ["builtins:RuntimeError", ["shut"], "RuntimeError('shut')"], 0.0),
    ]
    assert fork_point("run-1", step, None) == (4, "step:mod:shaky")


def test_a_run_that_failed_nowhere_asks_for_the_call() -> None:
    ok = [*RECORDS[:4], RunEnd("succeeded", {"outputs": {}}, 0.0)]
    with pytest.raises(RerunRefused, match="name the call to restart from"):
        fork_point("run-1", ok, None)


def test_a_fork_that_would_leave_a_child_run_in_flight_is_refused() -> None:
    kid = "run-1.child_1.1"
    records = [
        Spawn(0, 1, 0, "wf", "task"),
        Spawn(1, 2, 1, "side", "task"),
        Dispatch(2, 1, "call", "child:leaf#11111111"),  # child_1, in task 1
        StepStart(3, 1, 1, "child", 1),
        Wake(3, 1, "step", True, {"run_id": kid}),
        Dispatch(4, 1, "receive", f"child:{kid}"),
        Dispatch(5, 2, "call", "tool:python#22222222"),  # tool_2, in task 2: the child runs on
        Wake(5, 0, "signal", True, [f"child:{kid}", {"status": "succeeded"}, f"end:{kid}"]),
        Dispatch(6, 2, "call", "tool:python#33333333"),  # tool_3: after the child's end
    ]
    with pytest.raises(RerunRefused, match="child_1") as refused:
        fork_point("run-1", records, "tool_2")
    assert kid in refused.value.message
    assert fork_point("run-1", records, "child_1") == (2, "child_1")
    assert fork_point("run-1", records, "tool_3") == (8, "tool_3")
