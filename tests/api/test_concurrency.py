"""Concurrency limits, as users meet them: ``tiffany serve``, 10 runs on one key, a kill -9.

Each run sleeps in one step; the steps' start and end times (journal time,
from the store) show how many ran at once: never more than the limit, and
the queue drains in order, across an engine killed -9 mid-way.
"""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
from api_support import finished_run, read_run, submit_plan
from process_support import wait_for

from tiffany.agents import PlanError, parse_plan

PLAN = {
    "name": "limited",
    "inputs": {"user": "alice"},
    "concurrency": {"key": "user-${inputs.user}", "limit": 2},
    # 1.5 s a step: ten runs at two at once take 7.5 s, so the kill
    # after the third run's end finds runs queued and running (at 0.3 s a
    # loaded machine's ten submissions outlasted every run).
    "steps": [{"id": "work", "tool": "sleep", "args": {"seconds": 1.5}}],
}


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = most = 0
    for _, d in edges:  # an end sorts before a start at the same instant
        now += d
        most = max(most, now)
    return most


def test_ten_runs_on_one_key_never_run_more_than_the_limit_across_a_kill_9(served) -> None:
    data_dir, url = served
    answers = [submit_plan(url, PLAN) for _ in range(10)]
    runs = [a["run_id"] for a in answers]
    queued = read_run(url, runs[-1], min_seq=answers[-1]["seq"])  # read your write: no race
    if queued["status"] != "pending":  # queued: the reason is the entry's limit
        # A loaded machine took longer to submit and read than eight runs
        # took to end: the tenth may have its slot by now, never before.
        ended = httpx.get(f"{url}/api/runs", params={"status": "succeeded"}).json()
        assert ended["counts"].get("succeeded", 0) >= 8, (queued["status"], ended["counts"])
    assert queued["entry"]["concurrency"] == {"key": "user-alice", "limit": 2}
    status = httpx.get(f"{url}/api/runs", params={"status": "succeeded"}).json()
    wait_for(
        lambda: (
            httpx.get(f"{url}/api/runs", params={"status": "succeeded"})
            .json()["counts"]
            .get("succeeded", 0)
            >= 3
        ),
        30,
        "three runs to finish",
    )
    before = json.loads((data_dir / "serve.json").read_text())["engine_pid"]
    ended = httpx.get(f"{url}/api/runs", params={"status": "succeeded"}).json()["counts"]
    assert ended.get("succeeded", 0) < 10, "every run ended before the kill: none crossed it"
    os.kill(before, signal.SIGKILL)
    wait_for(
        lambda: json.loads((data_dir / "serve.json").read_text())["engine_pid"] != before,
        30,
        "serve to restart the engine",
    )
    done = [finished_run(url, r, timeout=120) for r in runs]
    assert [d["status"] for d in done] == ["succeeded"] * 10, status
    intervals = []
    for d in done:
        (step,) = d["steps"]
        intervals.append((step["started_at"], step["ended_at"]))
    assert _most_at_once(intervals) == 2  # the limit, reached, never passed
    # First come, first served: the runs started their work in submission order.
    starts = [s for s, _ in intervals]
    assert starts == sorted(starts)
    # Verify is the engine's: wait for the restarted one to answer, not only to exist.
    wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 200, 60, "the restarted engine")
    for run_id in runs[:3] + runs[-2:]:
        verdict = httpx.post(f"{url}/api/runs/{run_id}/verify", timeout=120).json()
        assert verdict.get("identical"), verdict


def test_a_limit_must_name_declared_inputs() -> None:
    bad = {**PLAN, "concurrency": {"key": "${inputs.nobody}", "limit": 2}}
    with pytest.raises(PlanError) as info:
        parse_plan(bad, ["sleep"])
    assert info.value.errors[0]["loc"] == "concurrency.key"
    zero = {**PLAN, "concurrency": {"key": "k", "limit": 0}}
    with pytest.raises(PlanError) as info:
        parse_plan(zero, ["sleep"])
    assert info.value.errors[0]["loc"] == "concurrency.limit"
