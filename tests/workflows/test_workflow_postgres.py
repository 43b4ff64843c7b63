"""Workflow runs on the PostgreSQL journal: two ``tiffany serve --import MOD``, one active.

Real processes on loopback and the local PostgreSQL (``pg_schema_url``):
a workflow submitted to the active server finishes with its outputs; one
submitted through the standby's API (a row in the database, claimed by the
active engine) is mid-way when the active server's process group is killed
with SIGKILL; the standby takes the stream over after the lease, replays
the run, finishes it (the effects journaled before the kill are not made
again), it verifies identically, and a failed workflow run is re-run there
from its failed call (a fork of its journal in the database); a wait's
schema is asked of the engine through the database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from process_support import wait_for

WF_MODULE = """
from pathlib import Path

from tiffany import workflow
from tiffany.agents.tools.python import python_tool
from tiffany.kernel import Sleep, Step
from tiffany.workflows import signal, tool


def effect(where, tag):
    with open(Path(where) / f"{tag}.count", "a") as f:
        f.write("1\\n")
    return tag


@workflow("pg.steps")
def steps(where: str, n: int = 3, pause_s: float = 0.0):
    done = []
    for i in range(n):
        done.append((yield Step(effect, where, f"s{i}")))
        yield Sleep(pause_s)
    return {"done": done}


@workflow("pg.approve")
def approve():
    ok = yield signal("approve", schema={"type": "object", "required": ["by"]})
    return {"by": ok["by"]}


@python_tool("pg.gate")
def gate(where: str) -> str:
    effect(where, "gate")
    if not (Path(where) / "open").exists():
        raise RuntimeError("the gate is shut")
    return "open"


@workflow("pg.gated")
def gated(where: str):
    a = yield Step(effect, where, "a")
    b = yield tool("python", function="pg.gate", kwargs={"where": where})
    return {"a": a, "b": b}
"""


def _serve(cwd: Path, data_dir: Path, url: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env |= {
        "TIFFANY_LOG_FORMAT": "json",
        "TIFFANY_DATABASE_URL": url,
        "TIFFANY_JOURNAL": "postgres",
        "TIFFANY_JOURNAL_LEASE_S": "2",
    }
    data_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data_dir), "--port", "0"]
    return subprocess.Popen(
        [*argv, "--import", "pgwf"],
        cwd=cwd,
        stdout=(data_dir.parent / f"{data_dir.name}.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: killed whole below
    )


def _url(data_dir: Path, timeout: float) -> str:
    ready = data_dir / "serve.json"
    wait_for(ready.exists, timeout, f"{ready}")
    url = str(json.loads(ready.read_text())["url"]).rstrip("/")
    wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, 60, "readyz")
    return url


def _submit(url: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(url + "/api/runs", json={"workflow": name, "inputs": inputs}, timeout=30)
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _finished(url: str, answer: dict[str, Any], timeout: float) -> dict[str, Any]:
    run_id, seq = answer["run_id"], answer["seq"]
    found: dict[str, Any] = {}

    def done() -> bool:
        r = httpx.get(f"{url}/api/runs/{run_id}", params={"min_seq": seq}, timeout=30)
        if r.status_code != 200:
            return False
        found.update(r.json())
        return found["status"] in ("succeeded", "failed", "cancelled")

    wait_for(done, timeout, f"run {run_id} to finish")
    return found


def _count(where: Path, tag: str) -> int:
    path = where / f"{tag}.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_workflow_on_the_postgres_journal_survives_a_kill_and_reruns(
    tmp_path: Path, pg_schema_url: str
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "pgwf.py").write_text(WF_MODULE)
    where = tmp_path / "effects"
    where.mkdir()
    active = _serve(cwd, tmp_path / "active", pg_schema_url)
    standby = None
    try:
        active_url = _url(tmp_path / "active", 90)
        quick = _finished(active_url, _submit(active_url, "pg.steps", {"where": str(where)}), 60)
        assert quick["status"] == "succeeded", quick["error"]
        assert quick["outputs"] == {"done": ["s0", "s1", "s2"]}

        standby = _serve(cwd, tmp_path / "standby", pg_schema_url)
        standby_url = _url(tmp_path / "standby", 90)  # its API serves through the database
        slow = tmp_path / "slow"
        slow.mkdir()
        inputs = {"where": str(slow), "n": 6, "pause_s": 0.4}
        answer = _submit(standby_url, "pg.steps", inputs)  # run by the active engine
        wait_for(lambda: _count(slow, "s1") == 1, 60, "the second effect", interval=0.01)
        os.killpg(active.pid, signal.SIGKILL)
        active.wait(timeout=10)
        run = _finished(standby_url, answer, 120)
        assert run["status"] == "succeeded", run["error"]
        assert run["outputs"] == {"done": [f"s{i}" for i in range(6)]}
        assert _count(slow, "s0") == 1  # journaled before the kill: never made again
        assert _count(slow, "s1") == 1
        assert all(1 <= _count(slow, f"s{i}") <= 2 for i in range(2, 6))  # one in flight at most
        verified = httpx.post(f"{standby_url}/api/runs/{answer['run_id']}/verify", timeout=120)
        assert verified.status_code == 200, verified.text
        assert verified.json()["ok"] is True, verified.text

        gated = tmp_path / "gated"
        gated.mkdir()
        failed = _finished(standby_url, _submit(standby_url, "pg.gated", {"where": str(gated)}), 60)
        assert failed["status"] == "failed"
        (gated / "open").write_text("")
        again = httpx.post(f"{standby_url}/api/runs/{failed['run_id']}/rerun", json={}, timeout=60)
        assert again.status_code == 201, again.text
        rerun = _finished(standby_url, again.json(), 60)
        assert rerun["status"] == "succeeded", rerun["error"]
        assert rerun["outputs"] == {"a": "a", "b": "open"}
        assert (_count(gated, "a"), _count(gated, "gate")) == (1, 2)

        # A wait's schema, asked of the engine through the database (GET .../waits).
        waiting = _submit(standby_url, "pg.approve", {})
        run_id = waiting["run_id"]

        def waits() -> list[Any]:
            r = httpx.get(f"{standby_url}/api/runs/{run_id}/waits", timeout=30)
            return list(r.json()["signals"]) if r.status_code == 200 else []

        wait_for(lambda: bool(waits()), 60, "the run to wait for its signal")
        assert waits() == [{"name": "approve", "schema": {"type": "object", "required": ["by"]}}]
        sent = httpx.post(f"{standby_url}/api/runs/{run_id}/signals/approve", json={"by": "pg"})
        assert sent.status_code == 202, sent.text
        approved = _finished(standby_url, waiting, 60)
        assert approved["outputs"] == {"by": "pg"}
        gone = httpx.get(f"{standby_url}/api/runs/{run_id}/waits", timeout=30)
        assert gone.status_code == 409, gone.text  # finished: it waits for nothing
    finally:
        if active.poll() is None:
            os.killpg(active.pid, signal.SIGKILL)
        if standby is not None and standby.poll() is None:
            standby.send_signal(signal.SIGTERM)
            assert standby.wait(timeout=60) == 0
