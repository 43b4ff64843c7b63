"""Re-run from failure, as users do it: ``tiffany serve``, HTTP, the CLI, PostgreSQL.

Each step of the plan appends its id to ``count.txt`` in the workspace, so
the file counts which steps ran, across the earlier run and its re-runs (a
re-run starts with a copy of the earlier run's workspace).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from api_support import (
    clean_env,
    finished_run,
    read_run,
    run_step,
    short_dir,
    start_engine,
    submit_plan,
)
from process_support import terminate, wait_for

from tiffany.feed.events import SEQS_PER_RECORD
from tiffany.feed.transport import FEED_SOCKET
from tiffany.wire import control


def _append(step_id: str, after: list[str]) -> dict[str, Any]:
    args = {"path": "count.txt", "content": f"{step_id}\n", "mode": "a"}
    return {"id": step_id, "tool": "file.write", "args": args, "after": after}


PLAN = {
    "name": "gated",
    "inputs": {"gate": "missing.txt"},
    "steps": [
        _append("a", []),
        _append("b", ["a"]),
        {"id": "gate", "tool": "file.read", "args": {"path": "${inputs.gate}"}, "after": ["b"]},
        _append("c", ["gate"]),
        _append("d", ["a"]),
    ],
}


def _counts(data_dir: Path, run_id: str) -> dict[str, int]:
    lines = (data_dir / "workspaces" / run_id / "count.txt").read_text().split()
    return {s: lines.count(s) for s in sorted(set(lines))}


def _rerun(url: str, run_id: str, body: Any = None) -> httpx.Response:
    return httpx.post(f"{url}/api/runs/{run_id}/rerun", json=body, timeout=30)


def test_a_rerun_runs_only_the_failed_step_and_its_dependents_and_verifies(served) -> None:
    data_dir, url = served
    first = submit_plan(url, PLAN)["run_id"]
    run = finished_run(url, first)
    assert run["status"] == "failed"
    assert run_step(run, "gate")["status"] == "failed"
    assert _counts(data_dir, first) == {"a": 1, "b": 1, "d": 1}
    # The gate opens with another input; the default restart point: the failed step.
    r = _rerun(url, first, {"inputs": {"gate": "count.txt"}})
    assert r.status_code == 201, r.text
    second = r.json()
    run = read_run(url, second["run_id"], second["seq"])  # read our own write: no 404
    run = finished_run(url, second["run_id"])
    assert run["status"] == "succeeded", run["error"]
    for sid in ("a", "b", "d"):  # reused, with where their output came from
        reused = run_step(run, sid)["attempts"][0]["reused"]
        assert reused["run_id"] == first
        assert isinstance(reused["seq"], int)
        assert reused["seq"] > 0
    for sid in ("gate", "c"):
        assert "reused" not in run_step(run, sid)["attempts"][0]
    # The copied file holds the first run's lines; only gate's dependent c ran again.
    assert _counts(data_dir, second["run_id"]) == {"a": 1, "b": 1, "c": 1, "d": 1}
    verdict = httpx.post(f"{url}/api/runs/{second['run_id']}/verify", timeout=120).json()
    assert verdict["identical"], verdict
    # From a named step: b and everything downstream of it run again, a and d do not.
    r = _rerun(url, second["run_id"], {"from_step": "b"})
    assert r.status_code == 201, r.text
    third = r.json()["run_id"]
    run = finished_run(url, third)
    assert run["status"] == "succeeded", run["error"]
    assert _counts(data_dir, third) == {"a": 1, "b": 2, "c": 2, "d": 1}
    # Provenance follows the output back to the run that recorded it.
    assert run_step(run, "a")["attempts"][0]["reused"]["run_id"] == first
    assert run_step(run, "gate")["attempts"][0].get("reused") is None


def test_bad_reruns_are_refused_naming_what_is_wrong(served) -> None:
    _, url = served
    waiting = submit_plan(
        url, {"name": "w", "steps": [{"id": "w", "tool": "signal.wait", "args": {"name": "go"}}]}
    )["run_id"]
    r = _rerun(url, waiting)
    assert r.status_code == 409, r.text  # still running
    done = submit_plan(url, {"name": "ok", "steps": [_append("a", [])]})["run_id"]
    finished_run(url, done)
    r = _rerun(url, done)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["from_step"]  # no failed step, none named
    r = _rerun(url, done, {"from_step": "nope"})
    assert (r.status_code, r.json()["detail"][0]["loc"]) == (422, ["from_step"])
    r = _rerun(url, done, {"from": "a"})
    assert (r.status_code, r.json()["detail"][0]["loc"]) == (422, ["body", "from"])
    assert _rerun(url, "no-such-run").status_code == 404
    r = _rerun(url, done, {"from_step": "a"})
    assert r.status_code == 201, r.text
    assert finished_run(url, r.json()["run_id"])["status"] == "succeeded"


def test_the_cli_reruns_beside_the_running_server(served) -> None:
    data_dir, url = served
    first = submit_plan(url, PLAN)["run_id"]
    finished_run(url, first)
    cli = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "rerun", first]
    bad = subprocess.run([*cli, "--from", "zz"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "has no step 'zz'" in bad.stderr
    ok = subprocess.run([*cli, "--input", "gate=count.txt"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    second = ok.stdout.strip()
    assert finished_run(url, second)["status"] == "succeeded"
    assert _counts(data_dir, second) == {"a": 1, "b": 1, "c": 1, "d": 1}


def _follow_until_finished(data_dir: Path, run_id: str, seq: int, signal_name: str) -> None:
    """Follow the engine's feed (as ``tiffany tail`` does), signal the run, return at its end.

    From the run's start (``seq``), as ``tail --run`` follows: from now on
    (``since: null``), a run the signal ended before the feed took the
    subscription never showed its end, and the test waited for its timeout.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as feed:
        feed.settimeout(60)
        feed.connect(str(data_dir / FEED_SOCKET))
        since = seq * SEQS_PER_RECORD - 1  # one engine: its seqs start at 1
        feed.sendall(json.dumps({"since": since, "run_id": run_id}).encode() + b"\n")
        control.call(data_dir, "signal", run_id=run_id, name=signal_name, payload=None)
        for line in feed.makefile("rb"):
            if json.loads(line).get("kind") == "run.finished":
                return
    raise AssertionError(f"the feed ended before {run_id} finished")


def test_a_run_is_rerun_as_soon_as_the_feed_says_it_finished(served) -> None:
    # `tiffany tail --run R` sees run.finished, `tiffany rerun R` follows at once:
    # the engine read the store, which had not projected the run's end yet,
    # and refused the run as unknown (404) or not finished (409).
    data_dir, url = served
    wait = {"id": "wait", "tool": "signal.wait", "args": {"name": "go"}}
    gated = [{**s, "after": [*s["after"], "wait"]} for s in PLAN["steps"]]
    plan = {**PLAN, "steps": [wait, *gated]}
    for _ in range(3):
        submitted = submit_plan(url, plan)
        first = submitted["run_id"]
        _follow_until_finished(data_dir, first, submitted["seq"], "go")
        again = control.call(data_dir, "rerun", rerun_of=first, inputs={"gate": "count.txt"})
        run = finished_run(url, again["run_id"])
        assert run["status"] == "succeeded", run["error"]  # the wait reused, not waited again
        assert run["entry"]["rerun_of"] == {"run_id": first, "restart": ["gate"]}


def test_a_rerun_through_the_database_on_the_postgresql_journal(pg_schema_url: str) -> None:
    engine_dir, api_dir = short_dir("tfr-e-"), short_dir("tfr-a-")
    env = {"TIFFANY_DATABASE_URL": pg_schema_url, "TIFFANY_JOURNAL": "postgres"}
    engine = start_engine(engine_dir, env_extra=env)
    ready = api_dir / "api.json"
    api = subprocess.Popen(
        [sys.executable, "-m", "tiffany", "api", "--ready-file", str(ready)],
        stdout=(api_dir / "api.log").open("ab"),
        stderr=subprocess.STDOUT,
        env=clean_env()
        | env
        | {"TIFFANY_DATA_DIR": str(api_dir), "TIFFANY_PORT": "0", "TIFFANY_LOG_FORMAT": "json"},
    )
    try:
        wait_for(ready.exists, 60, "the API")
        url = str(json.loads(ready.read_text())["url"]).rstrip("/")
        wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, 60, "readyz")
        first = submit_plan(url, PLAN)["run_id"]
        assert finished_run(url, first)["status"] == "failed"
        key = {"Idempotency-Key": "rerun-once"}
        answers = [
            httpx.post(
                f"{url}/api/runs/{first}/rerun",
                json={"inputs": {"gate": "count.txt"}},
                headers=key,
                timeout=30,
            )
            for _ in range(2)
        ]
        assert [a.status_code for a in answers] == [201, 200]
        second = answers[0].json()["run_id"]
        assert answers[1].json()["run_id"] == second
        assert finished_run(url, second)["status"] == "succeeded"
        assert _counts(engine_dir, second) == {"a": 1, "b": 1, "c": 1, "d": 1}
    finally:
        terminate(api)
        engine.stop()
