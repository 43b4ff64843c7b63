"""Sub-plans (``plan.run``), as users run them: ``tiffany serve``, cancel, kill -9.

A parent's step starts a child run (``<parent>.<step>.<attempt>``, its entry
naming the parent), waits for it and outputs its outputs; both runs replay
identically on their own; cancelling the parent cancels the child; an engine
killed -9 while the child runs resumes both and the parent gets the end.
"""

from __future__ import annotations

import json
import os
import shutil
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
    assert child["entry"]["parent"] == {
        "run_id": parent,
        "step": "sub",
        "root": parent,  # its tree's root, its depth and place in the tree's count (bounds)
        "depth": 1,
        "descendant": 1,
    }
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


# -- a plan that runs itself: bounded, cancelled, stopped ------------------------------


def _replicator(nap_s: float = 0.0) -> dict[str, Any]:
    """A plan that writes itself to a file and runs that file twice (each child does the same)."""
    again = {"plan": "self.json", "inputs": {"src": "${inputs.src}"}}
    return {
        "name": "replicator",
        "inputs": {"src": ""},
        "steps": [
            {
                "id": "write",
                "tool": "file.write",
                "args": {"path": "self.json", "content": "${inputs.src}"},
            },
            {"id": "nap", "tool": "sleep", "args": {"seconds": nap_s}, "after": ["write"]},
            {"id": "a", "tool": "plan.run", "args": again, "after": ["nap"]},
            {"id": "b", "tool": "plan.run", "args": again, "after": ["nap"]},
        ],
    }


def _replicate(url: str, nap_s: float = 0.0) -> dict[str, Any]:
    doc = _replicator(nap_s)
    body = {"plan": doc, "inputs": {"src": json.dumps(doc)}}
    r = httpx.post(f"{url}/api/runs", json=body, timeout=30)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _run_ids(url: str) -> list[str]:
    runs = httpx.get(f"{url}/api/runs", params={"limit": 500}, timeout=30).json()["runs"]
    return [r["run_id"] for r in runs]


def _first_seq(url: str, run_id: str) -> int:
    page = httpx.get(f"{url}/api/runs/{run_id}/events", params={"limit": 1}, timeout=30).json()
    return int(page["records"][0]["seq"])


def test_a_plan_that_runs_itself_stops_at_the_bounds_naming_them() -> None:
    """Depth 2 and 5 descendants: the root, its 2 children, 3 grandchildren; then refusals."""
    from api_support import serve, short_dir
    from process_support import terminate

    data_dir = short_dir("tfs-")
    bounds = {"TIFFANY_MAX_CHILD_DEPTH": "2", "TIFFANY_MAX_DESCENDANTS": "5"}
    proc, url = serve(data_dir, env_extra=bounds)
    try:
        root = _replicate(url)["run_id"]
        assert finished_run(url, root, timeout=120)["status"] == "failed"
        runs = _run_ids(url)
        assert len(runs) == 6, runs  # 1 + 2 + 3: the fourth grandchild was refused
        assert all(r == root or r.startswith(f"{root}.") for r in runs)
        errors = []
        for run_id in runs:
            run = finished_run(url, run_id)
            errors += [s["error"] for s in run["steps"] if s["status"] == "failed"]
        refusals = {e["code"]: e for e in errors if e["code"].startswith("limit.")}
        assert set(refusals) == {"limit.max_child_depth", "limit.max_descendants"}, errors
        assert refusals["limit.max_child_depth"]["setting"] == "TIFFANY_MAX_CHILD_DEPTH"
        assert "TIFFANY_MAX_DESCENDANTS (5)" in refusals["limit.max_descendants"]["message"]
        _verify(url, root)
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_cancelling_the_root_of_a_growing_tree_stops_its_growth_first(served) -> None:
    _, url = served
    root = _replicate(url, nap_s=0.3)["run_id"]
    wait_for(lambda: len(_run_ids(url)) >= 7, 120, "the tree to grow three levels")
    r = httpx.post(f"{url}/api/runs/{root}/cancel", timeout=30)
    assert r.status_code == 202, r.text
    assert finished_run(url, root)["status"] == "cancelled"
    records = httpx.get(f"{url}/api/runs/{root}/events", params={"limit": 1000}).json()["records"]
    wakes = [r for r in records if r["type"] == "WAKE"]
    (cancel,) = [r["seq"] for r in wakes if r["data"]["cause"] == "cancel"]
    runs = _run_ids(url)
    for run_id in runs:  # the whole tree ends, and no run of it started after the cancel
        assert finished_run(url, run_id)["status"] == "cancelled", run_id
        assert _first_seq(url, run_id) < cancel, run_id
    assert sorted(_run_ids(url)) == sorted(runs)


def test_sigterm_stops_a_growing_tree_cleanly_and_the_restart_keeps_its_bounds() -> None:
    """SIGTERM while the tree grows: serve exits 0 (no SIGKILL); the restart counts on."""
    from api_support import serve, short_dir
    from process_support import terminate

    data_dir = short_dir("tfs-")
    bounds = {"TIFFANY_MAX_DESCENDANTS": "20"}
    proc, url = serve(data_dir, env_extra=bounds)
    try:
        root = _replicate(url, nap_s=0.2)["run_id"]
        wait_for(lambda: len(_run_ids(url)) >= 5, 120, "the tree to grow")
        assert terminate(proc) == 0, (data_dir / "serve.log").read_text()[-3000:]
        assert "killing it" not in (data_dir / "serve.log").read_text()
        proc, url = serve(data_dir, env_extra=bounds)
        assert finished_run(url, root, timeout=180)["status"] == "failed"
        runs = _run_ids(url)
        assert len(runs) == 21, runs  # the root and its 20 descendants, across the restart
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)
