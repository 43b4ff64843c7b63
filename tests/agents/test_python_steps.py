"""Plans of python steps on the journaled engine: no tool task, replay, kill -9 recovery."""

from __future__ import annotations

import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import python_steps  # noqa: E402, F401 - registers the functions
from plan_crash_child import run_child  # noqa: E402

from tiffany.config import Settings  # noqa: E402
from tiffany.durable import RecordType, scan, verify  # noqa: E402
from tiffany.durable.history import decoded_records  # noqa: E402
from tiffany.engine import build, replay_resolvers  # noqa: E402


def _chain(log: Path, n: int, timeout_s: float | None = None) -> dict:
    steps = []
    for i in range(n):
        args = {
            "path": str(log),
            "line": f"s{i}",
            "carry": f"${{steps.s{i - 1}.output}}" if i else 0,
        }
        step = {
            "id": f"s{i}",
            "tool": "python",
            "args": {"function": "test.append_line", "kwargs": args},
        }
        if i:
            step["after"] = [f"s{i - 1}"]
        if timeout_s is not None:
            step["timeout_s"] = timeout_s
        steps.append(step)
    return {"name": "py-chain", "steps": steps, "outputs": {"last": f"${{steps.s{n - 1}.output}}"}}


def _run(data_dir: Path, plan: dict) -> tuple[str, list[str]]:
    engine = build(Settings(data_dir=data_dir), enabled_tools=["python"])
    with engine.runtime as rt:
        run_id = engine.submit_plan(plan)
        rt.run()
        state = rt.status(run_id)
        assert state.status == "succeeded", state.error
        assert state.result["outputs"]["last"] == len(plan["steps"])
    info = scan(data_dir / "wal").get(run_id)
    names = [
        f.name
        for _s, rtype, f in decoded_records(data_dir / "wal", info)
        if rtype == RecordType.SPAWN
    ]
    return run_id, names


def _verify(data_dir: Path, run_id: str) -> None:
    report = verify(data_dir, run_id, resolvers=replay_resolvers(Settings(data_dir=data_dir)))
    assert report.ok, report.to_dict()


def test_a_python_step_without_timeout_runs_in_its_worker(tmp_path):
    log = tmp_path / "effects.log"
    run_id, spawned = _run(tmp_path / "data", _chain(log, 3))
    assert spawned == ["py-chain", "worker:s0", "worker:s1", "worker:s2"]  # no tool task
    assert log.read_text().split() == ["s0", "s1", "s2"]
    _verify(tmp_path / "data", run_id)
    assert log.read_text().split() == ["s0", "s1", "s2"]  # the replay called nothing


def test_a_python_step_with_a_timeout_keeps_its_tool_task(tmp_path):
    log = tmp_path / "effects.log"
    run_id, spawned = _run(tmp_path / "data", _chain(log, 2, timeout_s=60))
    assert spawned == ["py-chain", "worker:s0", "tool:python:s0", "worker:s1", "tool:python:s1"]
    _verify(tmp_path / "data", run_id)


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [7, 12, 18, 25, 31])
def test_a_python_plan_killed_mid_run_never_reruns_a_completed_step(tmp_path, kill_at):
    log = tmp_path / "effects.log"
    plan = _chain(log, 8)
    child = run_child(tmp_path / "data", plan, kill_at)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    before = log.read_text().split() if log.exists() else []
    engine = build(Settings(data_dir=tmp_path / "data"), enabled_tools=["python"])
    with engine.runtime as rt:
        assert rt.recover() == ["plan-run"]
        rt.run()
        state = rt.status("plan-run")
        assert state.status == "succeeded", state.error
        assert state.result["outputs"]["last"] == 8
    after = Counter(log.read_text().split())
    assert sorted(after) == sorted(f"s{i}" for i in range(8))
    # a step completed before the crash ran once; at most the one in flight ran twice
    assert sum(after.values()) - 8 <= 1, after
    for line in before[:-1]:
        assert after[line] == 1, (line, after)
    _verify(tmp_path / "data", "plan-run")


def test_arguments_without_references_skip_resolving():
    from tiffany.agents.worker import _has_refs

    assert not _has_refs({"function": "f", "kwargs": {"x": 1, "y": ["a", 2.5, None]}})
    assert _has_refs({"kwargs": {"x": "${steps.a.output}"}})
    assert _has_refs(["plain", {"deep": ["${inputs.x}"]}])
    assert not _has_refs("no reference here, not even $ {this}")


def test_a_python_step_s_times_come_with_its_result(tmp_path):
    """No Now(): an attempt's started_at and ended_at are journaled with the step's result."""
    log = tmp_path / "effects.log"
    run_id, _ = _run(tmp_path / "data", _chain(log, 2))
    info = scan(tmp_path / "data" / "wal").get(run_id)
    records = list(decoded_records(tmp_path / "data" / "wal", info))
    assert not [f for _s, rtype, f in records if rtype == RecordType.OUTCOME]
    wakes = [f.value for _s, rtype, f in records if rtype == RecordType.WAKE and f.cause == "step"]
    assert [w[0] for w in wakes] == [[True, 1], [True, 2]]  # [[ok, value], started, ended]
    exits = [f for _s, rtype, f in records if rtype == RecordType.TASK_EXIT and f.ltid != 1]
    attempts = [e.value["attempts"][0] for e in exits]
    assert [(a["started_at"], a["ended_at"]) for a in attempts] == [(w[1], w[2]) for w in wakes]
    assert all(a["started_at"] <= a["ended_at"] for a in attempts)


def test_a_failing_python_step_is_retried_and_its_attempts_replay(tmp_path):
    counter = tmp_path / "calls"
    plan = {
        "name": "flaky",
        "steps": [
            {
                "id": "f",
                "tool": "python",
                "args": {
                    "function": "test.flaky",
                    "kwargs": {"path": str(counter), "fail_times": 2},
                },
                "retries": 2,
                "backoff": 0.001,
            }
        ],
        "outputs": {"last": "${steps.f.output}"},
    }
    engine = build(Settings(data_dir=tmp_path / "data"), enabled_tools=["python"])
    with engine.runtime as rt:
        run_id = engine.submit_plan(plan)
        rt.run()
        state = rt.status(run_id)
    assert state.status == "succeeded", state.error
    assert state.result["outputs"]["last"] == 3
    attempts = state.result["steps"]["f"]["attempts"]
    assert [a["ok"] for a in attempts] == [False, False, True]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    failed = attempts[0]
    assert list(failed) == ["attempt", "started_at", "ok", "error", "ended_at"]
    assert failed["error"]["code"] == "tool.python.error"
    assert failed["error"]["type"] == "ValueError"
    assert "call 1 fails" in failed["error"]["message"]
    assert all(a["started_at"] <= a["ended_at"] for a in attempts)
    info = scan(tmp_path / "data" / "wal").get(run_id)
    kinds = [
        f.kind
        for _s, rtype, f in decoded_records(tmp_path / "data" / "wal", info)
        if rtype == RecordType.OUTCOME
    ]
    assert "now" not in kinds  # the attempts' times came with the steps' results
    _verify(tmp_path / "data", run_id)
    assert counter.read_text() == "3"  # the replay called nothing


@pytest.mark.parametrize(
    ("function", "timeout_s"),
    [
        ("test.parse", None),  # the worker's own step (in the pool)
        ("test.parse", 30.0),  # a tool task (a timeout to enforce)
        ("test.parse_later", None),  # a generator function: a kernel task
    ],
)
def test_a_failed_python_step_carries_its_users_traceback_and_replays_it(
    tmp_path, function, timeout_s
):
    """The error named the exception's type and message; where it failed was lost."""
    step = {"id": "p", "tool": "python", "args": {"function": function, "kwargs": {"text": "x"}}}
    if timeout_s is not None:
        step["timeout_s"] = timeout_s
    engine = build(Settings(data_dir=tmp_path / "data"), enabled_tools=["python"])
    with engine.runtime as rt:
        run_id = engine.submit_plan({"name": "tb", "steps": [step]})
        rt.run()
        state = rt.status(run_id)
    assert state.status == "failed"
    error = state.error.fields["steps"]["p"]["error"]
    assert error["code"] == "tool.python.error"
    frames = error["traceback"]
    here = str(HERE / "python_steps.py")
    # the user's frames, outermost first, then int()'s (none: it is C); none of tiffany's
    assert [(f["file"], f["function"]) for f in frames] == [
        (here, function.removeprefix("test.")),
        (here, "_parse_count"),
    ]
    assert frames[-1]["code"] == "return int(text)  # the line a failed step's traceback ends on"
    assert frames[-1]["line"] > 0
    assert all("/tiffany/" not in f["file"] for f in frames)
    _verify(tmp_path / "data", run_id)  # the frames are journaled: a replay gives the same
