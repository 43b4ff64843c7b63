"""Who in a run waits for a person (``tiffany/store/waits.py``), record by record.

The rule the projection and ``tiffany runs`` share: a plan run waits when
each live step waits for a client's signal or an operator; a code run when
its tasks that are not joining others do. Kept signals, the engine's own
signals, timeouts and held steps, on records as the journal writes them.
"""

from __future__ import annotations

from typing import Any

from tiffany.store.waits import RunWaits, waits_of
from tiffany.wire.records import (
    Dispatch,
    Hold,
    RunEnd,
    Spawn,
    StepStart,
    TaskExit,
    Wake,
    function_missing_reason,
    tool_disabled_reason,
)

PLANNER = Spawn(0, 1, 0, "planner", "planner")


def _worker(n: int, ltid: int, step: str) -> Spawn:
    return Spawn(n, ltid, 1, f"worker:{step}", "worker", step)


def _signal(at: int, name: str) -> Wake:
    """A client's signal, as the journal writes it (a WAKE of task 0)."""
    return Wake(at, 0, "signal", True, [name, b"\x80", f"id-{at}"])


def _plan(*records: Any) -> RunWaits:
    return waits_of(True, "planner", [PLANNER, *records])


def test_a_plan_waits_when_every_live_step_waits_for_a_signal() -> None:
    both = [_worker(1, 2, "a"), _worker(2, 3, "b"), Dispatch(3, 2, "receive", "approve")]
    half = _plan(*both)
    assert half.waiting_for() == [
        {"kind": "signal", "name": "approve", "step": "a", "task": 2, "reason": None}
    ]
    assert not half.waiting()  # step b runs
    waits = _plan(*both, Dispatch(4, 3, "receive", "go"))
    assert waits.waiting()
    assert [w["name"] for w in waits.waiting_for()] == ["approve", "go"]
    # The signal reaches its wait: the step runs again.
    waits.apply(_signal(4, "go"), None)
    assert not waits.waiting()
    assert [w["name"] for w in waits.waiting_for()] == ["approve"]


def test_a_signal_kept_before_its_wait_is_taken_without_waiting() -> None:
    waits = _plan(_worker(1, 2, "a"), _signal(1, "approve"), Dispatch(2, 2, "receive", "approve"))
    assert (waits.waiting(), waits.waiting_for(), waits.kept) == (False, [], {"approve": 0})


def test_one_signal_wakes_the_oldest_of_two_waits_for_its_name() -> None:
    waits = _plan(
        _worker(1, 2, "a"),
        _worker(2, 3, "b"),
        Dispatch(3, 3, "receive", "approve"),
        Dispatch(4, 2, "receive", "approve"),
        _signal(4, "approve"),
    )
    assert [w["step"] for w in waits.waiting_for()] == ["a"]


def test_timers_backoffs_and_the_engines_own_signals_are_not_people() -> None:
    sleeping = _plan(_worker(1, 2, "a"), Dispatch(2, 2, "sleep", 3600.0))
    assert (sleeping.waiting(), sleeping.waiting_for()) == (False, [])
    # A sub-plan's step waits for its child's end: the child is the one that waits.
    child = _plan(_worker(1, 2, "sub"), Dispatch(2, 2, "receive", "child:run-1.sub.1"))
    assert (child.waiting(), child.waiting_for()) == (False, [])
    # A wait that times out (a WAKE of its task) runs again, into its backoff.
    timed_out = _plan(_worker(1, 2, "a"), Dispatch(2, 2, "receive", "never"))
    assert timed_out.waiting()
    timed_out.apply(Wake(2, 2, "timer", True, None), None)
    assert (timed_out.waiting(), timed_out.waiting_for()) == (False, [])


def test_a_step_held_for_a_function_or_a_tool_waits_for_an_operator_until_it_starts() -> None:
    reason = function_missing_reason("mod.fn")
    waits = _plan(_worker(1, 2, "py"), Dispatch(2, 2, "step", "python:mod.fn"))
    waits.apply(Hold(2, 2, 1, "python:mod.fn", reason), None)
    assert waits.waiting()
    assert waits.waiting_for() == [
        {"kind": "function", "name": "mod.fn", "step": "py", "task": 2, "reason": reason}
    ]
    waits.apply(StepStart(2, 2, 1, "python:mod.fn", 1), None)  # an engine that has it started it
    assert (waits.waiting(), waits.waiting_for()) == (False, [])
    # A tool task's step: the worker joins it, the tool task is held.
    shell = _plan(
        _worker(1, 2, "sh"),
        Spawn(2, 3, 2, "tool:shell:sh", "tool", "sh", "shell"),
        Dispatch(3, 2, "wait_task", 3),
        Dispatch(4, 3, "step", "shell"),
        Hold(4, 3, 1, "shell", tool_disabled_reason("shell")),
    )
    assert shell.waiting()
    assert [(w["kind"], w["name"], w["step"]) for w in shell.waiting_for()] == [
        ("tool", "shell", "sh")
    ]


def test_a_code_run_waits_when_its_tasks_wait_or_join_those_that_do() -> None:
    root = Spawn(0, 1, 0, "main")  # no role: the run's root, a code run's "task"
    records = [root, Spawn(1, 2, 1, "child", "task"), Dispatch(2, 1, "wait_task", 2)]
    busy = waits_of(False, "task", [*records, Dispatch(3, 2, "sleep", 1.0)])
    assert not busy.waiting()
    waits = waits_of(False, "task", [*records, Dispatch(3, 2, "receive", "approve")])
    assert waits.waiting()
    assert waits.waiting_for() == [
        {"kind": "signal", "name": "approve", "step": None, "task": 2, "reason": None}
    ]
    waits.apply(TaskExit(3, 2, "done", None), None)
    assert (waits.waiting(), waits.waiting_for()) == (False, [])


def test_a_run_that_ends_waits_for_nothing() -> None:
    waits = _plan(_worker(1, 2, "a"), Dispatch(2, 2, "receive", "approve"))
    waits.changed = False
    waits.apply(RunEnd("cancelled", None, 0.0), None)
    assert (waits.changed, waits.waiting(), waits.waiting_for()) == (True, False, [])


def test_waits_reloaded_from_the_rows_answer_as_the_records_did() -> None:
    """A projector without a run's context rebuilds it from its tasks and its ``waiting_for``."""
    folded = _plan(_worker(1, 2, "a"), _worker(2, 3, "b"), Dispatch(3, 2, "receive", "approve"))
    tasks = [
        (1, "planner", None, "blocked_sync", "queue_get"),
        (2, "worker", "a", "blocked_sync", "receive approve"),
        (3, "worker", "b", "running", None),
    ]
    reloaded = RunWaits.reloaded(True, "planner", tasks, folded.waiting_for())
    assert (reloaded.waiting(), reloaded.waiting_for()) == (False, folded.waiting_for())
    reloaded.apply(Dispatch(4, 3, "receive", "go"), None)
    assert reloaded.waiting()
    reloaded.apply(_signal(4, "approve"), None)
    assert [w["name"] for w in reloaded.waiting_for()] == ["go"]
