"""Runs that need someone: ``waiting``, ``waiting_for`` and the filter, over HTTP and the CLI.

* a plan whose live step waits for a signal is ``waiting`` (listed, filtered,
  counted, its ``waiting_for`` naming the signal and the step); the signal
  makes it ``running`` again and it succeeds;
* a step waiting while another sleeps, and a step sleeping on its retry's
  backoff, leave the run ``running`` (a timer is not a person);
* ``tiffany runs`` (the WAL, beside the server) and ``tiffany runs --url``
  say ``waiting`` and what for, and ``--status waiting`` keeps only those;
* a step the engine holds for a disabled tool (the server restarted
  without ``shell``) makes its run ``waiting``, its entry a ``tool`` with
  the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

import httpx
from api_support import (
    clean_env,
    finished_run,
    read_run,
    run_step,
    serve,
    short_dir,
    submit_plan,
)
from process_support import terminate, wait_for

#: How long a run may take to reach the state a test waits for (a loaded machine).
SETTLE_S = 60.0

APPROVAL = {
    "name": "approval",
    "steps": [
        {"id": "draft", "tool": "file.write", "args": {"path": "d.txt", "content": "v1"}},
        {"id": "approve", "tool": "signal.wait", "args": {"name": "approve"}, "after": ["draft"]},
    ],
    "outputs": {"by": "${steps.approve.output.by}"},
}
#: One step waits for a person while the other sleeps on a timer (an hour).
HALF_WAITING = {
    "name": "half-waiting",
    "steps": [
        {"id": "nap", "tool": "sleep", "args": {"seconds": 3600}},
        {"id": "approve", "tool": "signal.wait", "args": {"name": "approve"}},
    ],
}
#: A wait that times out at once, then sleeps an hour before its retry.
BACKING_OFF = {
    "name": "backing-off",
    "steps": [
        {
            "id": "flaky",
            "tool": "signal.wait",
            "args": {"name": "never", "timeout_s": 0.1},
            "retries": 1,
            "backoff": 3600,
        }
    ],
}


def _status(url: str, run_id: str, status: str, seq: int) -> dict[str, Any] | None:
    run = read_run(url, run_id, seq)
    return run if run["status"] == status else None


def _listed(url: str, **params: Any) -> dict[str, Any]:
    r = httpx.get(url + "/api/runs", params=params, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _cli(data_dir: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiffany", *args],
        capture_output=True,
        text=True,
        env=clean_env() | {"TIFFANY_DATA_DIR": str(data_dir)},
        timeout=120,
        check=False,
    )


def test_a_run_waiting_for_a_signal_is_waiting_listed_and_filtered(served) -> None:
    data_dir, url = served
    submitted = submit_plan(url, APPROVAL)
    run_id, seq = submitted["run_id"], submitted["seq"]
    run = wait_for(lambda: _status(url, run_id, "waiting", seq), SETTLE_S, "the run to wait")
    (entry,) = run["waiting_for"]
    task = next(t for t in run["tasks"] if t["ltid"] == entry["task"])
    assert entry == {
        "kind": "signal",
        "name": "approve",
        "step": "approve",
        "task": task["ltid"],
        "reason": None,
    }
    assert task["step_id"] == "approve"
    assert run_step(run, "approve")["waiting"] == "signal approve"

    # The list: the filter keeps it, the counts count it, each row says what for.
    waiting = _listed(url, status="waiting")
    assert [r["run_id"] for r in waiting["runs"]] == [run_id]
    assert waiting["runs"][0]["waiting_for"] == [entry]
    assert waiting["counts"]["waiting"] == 1
    assert _listed(url, status="running")["runs"] == []

    # The CLI, from the WAL beside the server and through the API: the same word.
    local = _cli(data_dir, "runs")
    assert local.returncode == 0, local.stderr
    (line,) = [x for x in local.stdout.splitlines() if x.startswith(run_id)]
    assert line.split()[1] == "waiting", local.stdout
    hint = f"waiting: {run_id} waits for signal approve (step approve)"
    assert any(x.startswith(hint) for x in local.stderr.splitlines()), local.stderr
    rows = [json.loads(x) for x in _cli(data_dir, "runs", "--json").stdout.splitlines()]
    (row,) = [r for r in rows if r["run_id"] == run_id]
    assert (row["status"], row["waiting_for"]) == ("waiting", [entry])
    filtered = _cli(data_dir, "runs", "--status", "waiting", "--json").stdout.splitlines()
    assert [json.loads(x)["run_id"] for x in filtered] == [run_id]
    assert _cli(data_dir, "runs", "--status", "running", "--json").stdout == ""
    remote = _cli(data_dir, "runs", "--url", url, "--status", "waiting")
    assert remote.returncode == 0, remote.stderr
    assert [x.split()[:2] for x in remote.stdout.splitlines()] == [[run_id, "waiting"]]
    assert any(x.startswith(hint) for x in remote.stderr.splitlines()), remote.stderr
    bad = _cli(data_dir, "runs", "--status", "stuck")
    assert bad.returncode == 2
    assert "'stuck' is not a run status (pending, running, waiting," in bad.stderr

    # The signal: no longer waiting as of its record; then it succeeds.
    r = httpx.post(f"{url}/api/runs/{run_id}/signals/approve", json={"by": "ada"}, timeout=30)
    assert r.status_code == 202, r.text
    after = read_run(url, run_id, r.json()["seq"])
    assert after["status"] in ("running", "succeeded"), after["status"]
    assert after["waiting_for"] == []
    done = finished_run(url, run_id)
    assert (done["status"], done["outputs"], done["waiting_for"]) == (
        "succeeded",
        {"by": "ada"},
        [],
    )
    assert _listed(url, status="waiting")["counts"]["waiting"] == 0


def test_a_timer_is_not_a_person_the_run_goes_on_running(served) -> None:
    """A step waiting beside one that sleeps, and a retry's backoff, leave the run ``running``."""
    _, url = served
    submitted = submit_plan(url, HALF_WAITING)
    half, seq = submitted["run_id"], submitted["seq"]
    run = wait_for(
        lambda: (r := read_run(url, half, seq))["waiting_for"] and r, SETTLE_S, "the step to wait"
    )
    assert run["status"] == "running"
    assert [(w["name"], w["step"]) for w in run["waiting_for"]] == [("approve", "approve")]
    submitted = submit_plan(url, BACKING_OFF)
    backing, seq = submitted["run_id"], submitted["seq"]

    def in_backoff() -> dict[str, Any] | None:
        run = read_run(url, backing, seq)
        asleep = any(
            t["kind"] == "worker" and t["blocked_on"] == "sleep 3600.0" for t in run["tasks"]
        )
        return run if asleep else None

    run = wait_for(in_backoff, SETTLE_S, "the step's backoff")
    assert (run["status"], run["waiting_for"]) == ("running", [])
    assert {r["run_id"] for r in _listed(url, status="running")["runs"]} == {half, backing}
    assert _listed(url, status="waiting")["runs"] == []
    for run_id in (half, backing):
        assert httpx.post(f"{url}/api/runs/{run_id}/cancel", timeout=30).status_code == 202


SHELL_REASON = "tool shell is disabled on this engine (--enable-tool shell)"
#: The shell step comes after a signal: the server is restarted without shell before it.
HELD = {
    "name": "held",
    "steps": [
        {"id": "go", "tool": "signal.wait", "args": {"name": "go"}},
        {"id": "sh", "tool": "shell", "args": {"argv": ["true"]}, "after": ["go"]},
    ],
}


def test_a_step_held_for_a_disabled_tool_makes_its_run_wait_for_an_operator() -> None:
    data_dir = short_dir("tfw-")
    env = {"TIFFANY_SHELL_SANDBOX": "none"}
    proc, url = serve(data_dir, "--enable-tool", "shell", env_extra=env)
    try:
        submitted = submit_plan(url, HELD)
        run_id, seq = submitted["run_id"], submitted["seq"]
        wait_for(lambda: _status(url, run_id, "waiting", seq), SETTLE_S, "the run to wait for go")
        assert terminate(proc) == 0
        proc, url = serve(data_dir, env_extra=env)  # shell is not enabled any more
        r = httpx.post(f"{url}/api/runs/{run_id}/signals/go", json=None, timeout=30)
        assert r.status_code == 202, r.text

        def held() -> dict[str, Any] | None:
            run = read_run(url, run_id, r.json()["seq"])
            return run if run["status"] == "waiting" and run_step(run, "sh")["waiting"] else None

        run = wait_for(held, SETTLE_S, "the shell step to be held")
        (entry,) = run["waiting_for"]
        assert {k: v for k, v in entry.items() if k != "task"} == {
            "kind": "tool",
            "name": "shell",
            "step": "sh",
            "reason": SHELL_REASON,
        }
        assert run_step(run, "sh")["waiting"] == SHELL_REASON
        assert [r["run_id"] for r in _listed(url, status="waiting")["runs"]] == [run_id]
        listed = _cli(data_dir, "runs")
        (line,) = [x for x in listed.stdout.splitlines() if x.startswith(run_id)]
        assert line.split()[1] == "waiting", listed.stdout
        assert f"held: {run_id} waits: {SHELL_REASON}" in listed.stderr.splitlines()
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)
