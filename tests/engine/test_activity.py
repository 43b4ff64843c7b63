"""Activity events and the live view take a task's role and step from its SPAWN label."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tiffany.cli.live import LiveView
from tiffany.config import Settings
from tiffany.engine import build
from tiffany.feed import Hub
from tiffany.feed.activity import ActivityLog
from tiffany.kernel import NewTask, Sleep, WaitTask

PLAN = {
    "name": "labelled",
    "steps": [
        {"id": "write", "tool": "file.write", "args": {"path": "a.txt", "content": "x"}},
        {"id": "nap", "tool": "sleep", "args": {"seconds": 0}, "after": ["write"]},
    ],
}


class Recorder:
    """A hub and its one subscriber: what the instrument published, as the feed says it."""

    def __init__(self) -> None:
        self.hub = Hub()
        self._sub = self.hub.subscribe()
        self._events: list[tuple[str, dict[str, Any]]] = []

    @property
    def events(self) -> list[tuple[str, dict[str, Any]]]:
        self.hub.drain()
        self._events += [(e["kind"], e) for e in map(json.loads, self._sub.get(timeout=0))]
        return self._events


def _impostor() -> Any:
    yield Sleep(0)
    return 1


def named_like_a_worker() -> Any:
    """A plain task whose name looks like a worker's: it is a task all the same."""
    tid = yield NewTask(_impostor(), name="worker:fake")
    return tid


def test_events_and_rows_carry_the_label_not_a_parsed_name(tmp_path: Path) -> None:
    hub = Recorder()
    live = LiveView(0)
    settings = Settings(data_dir=tmp_path, enabled_tools=["file.write", "sleep"], _env_file=None)
    engine = build(settings, instruments=[ActivityLog(hub.hub), live])
    try:
        plan_run = engine.submit_plan(PLAN)
        other = engine.runtime.submit(f"{__name__}:named_like_a_worker")
        engine.runtime.run()
    finally:
        engine.runtime.close()
    spawned = {
        (f["run_id"], f["task"]): (f["task_kind"], f["step_id"])
        for kind, f in hub.events
        if kind == "spawned"
    }
    assert spawned == {
        (plan_run, "labelled"): ("planner", None),
        (plan_run, "worker:write"): ("worker", "write"),
        (plan_run, "tool:file.write:write"): ("tool", "write"),
        (plan_run, "worker:nap"): ("worker", "nap"),
        (other, f"{__name__}:named_like_a_worker"): ("task", None),
        (other, "worker:fake"): ("task", None),
    }
    tools = [f["step_id"] for kind, f in hub.events if kind == "tool.finished"]
    assert tools == ["write"]
    finished = {f["run_id"] for kind, f in hub.events if kind == "run.finished"}
    assert finished == {plan_run, other}  # a callable run's root ends its run too
    assert (live.workers_started, live.workers_done) == (2, 2)
    assert {r.step_id for r in live.rows.values() if r.role == "worker"} == {"write", "nap"}


def test_a_workers_exit_says_whether_its_step_succeeded(tmp_path: Path) -> None:
    """A worker whose step failed ends ``done`` (it reports the failure to the planner).

    Its ``exit`` event carries the step's outcome, so the feed's readers (the
    dashboard's tail) do not show "step finished" in green beside a failed step.
    """
    hub = Recorder()
    settings = Settings(data_dir=tmp_path, enabled_tools=["file.read", "sleep"], _env_file=None)
    engine = build(settings, instruments=[ActivityLog(hub.hub)])
    plan = {
        "name": "half",
        "steps": [
            {"id": "nap", "tool": "sleep", "args": {"seconds": 0}},
            {"id": "bad", "tool": "file.read", "args": {"path": "missing.txt"}},
        ],
    }
    try:
        engine.submit_plan(plan)
        engine.runtime.run()
    finally:
        engine.runtime.close()
    exits = {
        e["step_id"]: (e["label"], e["data"])
        for kind, e in hub.events
        if kind == "exit" and e["task_kind"] == "worker"
    }
    assert exits["nap"] == ("done", {"ok": True, "attempts": 1})
    label, bad = exits["bad"]
    assert (label, bad["ok"], bad["attempts"]) == ("done", False, 1)
    # And why (``tail`` prints it): a step with no tool task of its own has no other event.
    assert bad["error"]["code"] == "tool.file.not_found", bad
    assert "missing.txt" in bad["error"]["message"]


class _Hostile(Exception):
    """An error whose ``str`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str")


def hostile() -> Any:
    """A run whose task is named with a lone surrogate and that fails with a hostile error."""
    tid = yield NewTask(_impostor(), name="child-x\ud800y")
    yield WaitTask(tid)
    raise _Hostile()


def test_text_from_data_does_not_disable_the_activity_log(tmp_path: Path) -> None:
    """A task named with a lone surrogate raised in ``TaskFields`` (on the loop), a
    ``str()`` that raised in ``task_crashed``: either disabled the log for every run."""
    hub = Recorder()
    settings = Settings(data_dir=tmp_path, enabled_tools=["sleep"], _env_file=None)
    activity = ActivityLog(hub.hub)
    engine = build(settings, instruments=[activity])
    try:
        bad = engine.runtime.submit(f"{__name__}:hostile")
        engine.runtime.run()
        good = engine.submit_plan(
            {"name": "later", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0}}]}
        )
        engine.runtime.run()
    finally:
        engine.runtime.close()
    events = hub.events
    assert {f["run_id"] for kind, f in events if kind == "run.finished"} == {bad, good}
    assert ("spawned", "child-x\\ud800y") in {(kind, f["task"]) for kind, f in events}
    [crash] = [f for kind, f in events if kind == "crash" and f["run_id"] == bad]
    assert crash["data"]["message"] == "<_Hostile object: str() raised RuntimeError>"
