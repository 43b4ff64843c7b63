"""Sub-plans (``plan.run``), as users run them: ``tiffany serve``, cancel, kill -9.

A parent's step starts a child run (``<parent>.<step>.<attempt>``, its entry
naming the parent), waits for it and outputs its outputs; both runs replay
identically on their own; cancelling the parent cancels the child; an engine
killed -9 while the child runs resumes both and the parent gets the end.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import httpx
from api_support import finished_run, read_run, run_step, submit_plan
from process_support import wait_for


def _parent(child_steps: list[dict[str, Any]]) -> dict[str, Any]:
    kid = {
        "name": "kid",
        "inputs": {"who": "nobody"},
        "steps": child_steps,
        "outputs": {"who": "${inputs.who}"},
    }
    return {
        "name": "parent",
        "steps": [
            {"id": "sub", "tool": "plan.run", "args": {"plan": kid, "inputs": {"who": "kid"}}},
            {
                "id": "after",
                "tool": "file.write",
                "args": {"path": "who.txt", "content": "${steps.sub.output.who}"},
                "after": ["sub"],
            },
        ],
    }


def _verify(url: str, run_id: str) -> None:
    verdict = httpx.post(f"{url}/api/runs/{run_id}/verify", timeout=120).json()
    assert verdict.get("identical"), verdict


def test_a_sub_plan_runs_as_a_linked_child_and_its_outputs_feed_the_parent(served) -> None:
    data_dir, url = served
    nap = {"id": "nap", "tool": "sleep", "args": {"seconds": 0.05}}
    parent = submit_plan(url, _parent([nap]))["run_id"]
    run = finished_run(url, parent)
    assert run["status"] == "succeeded", run["error"]
    assert run_step(run, "sub")["output"] == {"who": "kid"}
    assert (data_dir / "workspaces" / parent / "who.txt").read_text() == "kid"
    child = read_run(url, f"{parent}.sub.1")
    assert child["status"] == "succeeded"
    assert child["entry"]["parent"] == {"run_id": parent, "step": "sub"}
    _verify(url, parent)
    _verify(url, child["run_id"])


def test_a_failed_child_fails_the_step(served) -> None:
    _, url = served
    bad = {"id": "read", "tool": "file.read", "args": {"path": "missing.txt"}}
    parent = submit_plan(url, _parent([bad]))["run_id"]
    run = finished_run(url, parent)
    assert run["status"] == "failed"
    assert run_step(run, "sub")["error"]["code"] == "plan.child_failed"
    assert read_run(url, f"{parent}.sub.1")["status"] == "failed"
    _verify(url, parent)


def test_cancelling_the_parent_cancels_the_child(served) -> None:
    _, url = served
    parent = submit_plan(url, _parent([{"id": "nap", "tool": "sleep", "args": {"seconds": 60}}]))
    child = f"{parent['run_id']}.sub.1"
    wait_for(lambda: httpx.get(f"{url}/api/runs/{child}").status_code == 200, 30, "the child")
    r = httpx.post(f"{url}/api/runs/{parent['run_id']}/cancel")
    assert r.status_code == 202, r.text
    assert finished_run(url, parent["run_id"])["status"] == "cancelled"
    assert finished_run(url, child)["status"] == "cancelled"
    _verify(url, parent["run_id"])
    _verify(url, child)


def test_a_kill_9_while_the_child_runs_loses_nothing(served) -> None:
    data_dir, url = served
    nap = {"id": "nap", "tool": "sleep", "args": {"seconds": 1.5}}
    parent = submit_plan(url, _parent([nap]))["run_id"]
    child = f"{parent}.sub.1"
    wait_for(
        lambda: httpx.get(f"{url}/api/runs/{child}").json().get("status") == "running",
        30,
        "the child to run",
    )
    before = json.loads((data_dir / "serve.json").read_text())["engine_pid"]
    os.kill(before, signal.SIGKILL)
    run = finished_run(url, parent, timeout=90)
    assert run["status"] == "succeeded", run["error"]
    assert run_step(run, "sub")["output"] == {"who": "kid"}
    runs = httpx.get(f"{url}/api/runs", params={"limit": 50}).json()["runs"]
    assert sorted(r["run_id"] for r in runs) == sorted([parent, child])  # no second child
    _verify(url, parent)
    _verify(url, child)
