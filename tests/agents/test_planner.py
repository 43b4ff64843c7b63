"""The planner and worker tasks on a real scheduler (manual clock)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_tools import EVENTS, FakeRegistry

from tiffany.agents import AgentEnv, PlanFailed, run_plan
from tiffany.agents.plan import MAX_STEPS
from tiffany.kernel import ManualClock, Scheduler


@pytest.fixture(autouse=True)
def _clear():
    EVENTS.clear()
    yield
    EVENTS.clear()


def _run(tmp_path, doc, inputs=None, clock=None, **options):
    env = AgentEnv(FakeRegistry(), tmp_path / "ws")  # type: ignore[arg-type]
    clock = clock or ManualClock()
    with Scheduler(clock=clock) as sched:
        tid = sched.spawn(run_plan(env, "run-1", doc, inputs or {}, **options), name="planner")
        sched.run()
        task = sched.task(tid)
        return task, clock


def test_a_dag_runs_in_dependency_order_with_independent_steps_concurrent(tmp_path):
    doc = {
        "name": "dag",
        "inputs": {"x": 1},
        "steps": [
            {"id": "a", "tool": "echo", "args": {"value": "${inputs.x}", "delay_s": 5}},
            {"id": "b", "tool": "echo", "args": {"value": 2, "delay_s": 5}},
            {
                "id": "c",
                "tool": "echo",
                "args": {"value": "${steps.a.output.value}"},
                "after": ["a", "b"],
            },
        ],
        "outputs": {
            "c": "${steps.c.output.value}",
            "both": "${steps.a.output.value}+${steps.b.output.value}",
        },
    }
    task, clock = _run(tmp_path, doc)
    assert task.state.value == "done", task.error
    assert task.result["outputs"] == {"c": 1, "both": "1+2"}
    order = [(e, s) for e, s, _ in EVENTS]
    # a and b overlap (both start before either ends); c starts after both ended
    assert order.index(("start", "b")) < order.index(("end", "a"))
    assert order.index(("start", "c")) > max(order.index(("end", "a")), order.index(("end", "b")))
    assert clock.monotonic() == pytest.approx(5.0)  # concurrent: 5 s, not 10


def test_retries_back_off_exponentially_on_durable_timers(tmp_path):
    doc = {
        "name": "r",
        "steps": [
            {"id": "a", "tool": "echo", "args": {"fail_times": 3}, "retries": 3, "backoff": 2}
        ],
    }
    task, clock = _run(tmp_path, doc)
    assert task.state.value == "done", task.error
    assert task.result["steps"]["a"]["status"] == "succeeded"
    attempts = task.result["steps"]["a"]["attempts"]
    assert [a["ok"] for a in attempts] == [False, False, False, True]
    assert [a["started_at"] - attempts[0]["started_at"] for a in attempts] == [
        0,
        2,
        6,
        14,
    ]  # 2, 4, 8
    assert clock.monotonic() == pytest.approx(14.0)


def test_a_failed_step_skips_its_dependents_and_fails_the_run(tmp_path):
    doc = {
        "name": "f",
        "steps": [
            {"id": "a", "tool": "echo", "args": {"fail_times": 9}, "retries": 1, "backoff": 0},
            {"id": "b", "tool": "echo", "after": ["a"]},
            {"id": "c", "tool": "echo", "after": ["b"]},
            {"id": "d", "tool": "echo"},
        ],
    }
    task, _ = _run(tmp_path, doc)
    assert task.state.value == "crashed"
    assert isinstance(task.error, PlanFailed)
    steps = task.error.fields["steps"]
    assert steps["a"]["status"] == "failed"
    assert len(steps["a"]["attempts"]) == 2
    assert steps["b"]["status"] == "skipped"
    assert steps["c"]["status"] == "skipped"
    assert "upstream step 'a'" in steps["b"]["error"]["message"]
    assert steps["d"]["status"] == "succeeded"


def test_continue_on_error_lets_dependents_run(tmp_path):
    doc = {
        "name": "c",
        "steps": [
            {"id": "a", "tool": "echo", "args": {"fail_times": 9}, "continue_on_error": True},
            {"id": "b", "tool": "echo", "args": {"value": "ok"}, "after": ["a"]},
        ],
        "outputs": {"b": "${steps.b.output.value}"},
    }
    task, _ = _run(tmp_path, doc)
    assert task.state.value == "done", task.error
    assert task.result["outputs"] == {"b": "ok"}
    assert task.result["steps"]["a"]["status"] == "failed"


def test_a_timeout_kills_the_tool_task_and_retries(tmp_path):
    doc = {
        "name": "t",
        "steps": [
            {
                "id": "a",
                "tool": "echo",
                "args": {"delay_s": 100},
                "timeout_s": 3,
                "retries": 1,
                "backoff": 1,
            }
        ],
    }
    task, clock = _run(tmp_path, doc)
    assert task.state.value == "crashed"
    attempts = task.error.fields["steps"]["a"]["attempts"]
    assert len(attempts) == 2
    assert all("timed out" in a["error"]["message"] for a in attempts)
    # the tool's finally ran: it was killed, not left sleeping
    assert EVENTS.count(("end", "a", 1)) == 1
    assert EVENTS.count(("end", "a", 2)) == 1
    assert clock.monotonic() == pytest.approx(7.0)  # 3 + 1 + 3


def test_dynamic_steps_extend_the_dag(tmp_path):
    doc = {
        "name": "d",
        "steps": [{"id": "plan", "tool": "planner", "args": {"count": 3}, "dynamic": True}],
    }
    task, _ = _run(tmp_path, doc)
    assert task.state.value == "done", task.error
    assert set(task.result["steps"]) == {"plan", "gen0", "gen1", "gen2"}
    assert all(s["status"] == "succeeded" for s in task.result["steps"].values())
    assert sorted(e for e in EVENTS if e[0] == "thread") == [
        ("thread", f"gen{i}", 1) for i in range(3)
    ]


@pytest.mark.parametrize(("count", "bound"), [(3, 3), (MAX_STEPS, None)])
def test_dynamic_steps_past_the_runs_step_bound_fail_their_step_naming_it(tmp_path, count, bound):
    """Static and dynamic steps count together (``max_steps``; by default the static bound)."""
    doc = {
        "name": "d",
        "steps": [
            {"id": "first", "tool": "echo", "args": {"value": 1}},
            {"id": "plan", "tool": "planner", "args": {"count": count}, "dynamic": True},
        ],
    }
    options = {} if bound is None else {"max_steps": bound}
    task, _ = _run(tmp_path, doc, **options)
    assert isinstance(task.error, PlanFailed)
    steps = task.error.fields["steps"]
    assert set(steps) == {"first", "plan"}  # none of the returned steps was added
    error = steps["plan"]["error"]
    limit = bound or MAX_STEPS
    assert (error["code"], error["setting"], error["limit"]) == (
        "limit.max_steps",
        "TIFFANY_MAX_STEPS",
        limit,
    )
    assert (
        f"the run would have {count + 2}, more than TIFFANY_MAX_STEPS ({limit})"
        in (error["message"])
    )
    assert [e for e in EVENTS if e[0] == "thread"] == []


def test_bad_arguments_fail_the_step_naming_the_field(tmp_path):
    doc = {"name": "b", "steps": [{"id": "a", "tool": "echo", "args": {"nope": 1}}]}
    task, _ = _run(tmp_path, doc)
    err = task.error.fields["steps"]["a"]["error"]
    assert err["code"] == "plan.args"
    assert "args.nope" in err["message"]
    assert EVENTS == []  # the tool never ran
