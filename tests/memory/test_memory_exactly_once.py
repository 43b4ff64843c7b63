"""Memory writes happen exactly once across kill -9 and recovery, and none is lost.

* **the window**: a process running a plan (or a workflow) of puts is
  SIGKILLed in the thread of its k-th put, just after the store committed
  it and before the step's result reached the loop (so the journal does
  not hold it). ``tiffany replay RUN`` (a real process) resumes the run:
  that step runs again, its put is a no-op that answers the first
  application's result, and every op has exactly one version in the
  item's history; the run replays identically;
* **an agent** killed inside its ``remember`` resumes (its model's turns
  from the journal), runs the call again, and the fact is written once;
* **a real engine**: ``tiffany engine`` runs a plan of puts with naps
  between them and is SIGKILLed once a few items are in the store;
  started again, it recovers the run, which ends with every item written
  once (one version each, one op each), on the embedded store and on
  PostgreSQL (journal and store there).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_process import EngineProc
from memory_runs import ROOT, open_store, tiffany
from sqlalchemy.orm import Session

from tiffany.memory import HashingEmbedder, MemoryStore
from tiffany.store import make_engine, queries

HERE = Path(__file__).resolve().parent
CHILD = HERE / "memory_crash_child.py"
RUN_ID = "mem-run"  # the child's
PUTS = 6
#: How long a run of a few puts and naps may take to finish, in seconds (a loaded machine).
FINISH_S = 90.0


def _chain(ns: str, n: int, nap_s: float) -> dict[str, Any]:
    """``n`` puts in turn (``p0``...), a nap after each."""
    steps: list[dict[str, Any]] = []
    for i in range(n):
        steps.append(
            {
                "id": f"p{i}",
                "tool": "memory.put",
                "args": {"namespace": ns, "key": f"k{i}", "value": {"i": i}},
                **({"after": [f"nap{i - 1}"]} if i else {}),
            }
        )
        steps.append(
            {"id": f"nap{i}", "tool": "sleep", "args": {"seconds": nap_s}, "after": [f"p{i}"]}
        )
    outputs = {f"p{i}": f"${{steps.p{i}.output}}" for i in range(n)}
    return {"name": "puts", "steps": steps, "outputs": outputs}


def _child(
    data_dir: Path, target: dict[str, Any], kill_after: int, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), str(data_dir), json.dumps(target), str(kill_after)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")} | env,
        check=False,
    )


def _put_starts(data_dir: Path) -> int:
    """STEP_START records of ``memory.put`` steps in the data dir's WAL (a re-run adds one)."""
    from tiffany.projector.tail import decoded_batches
    from tiffany.wire.records import StepStart

    return sum(
        1
        for batch in decoded_batches(data_dir / "wal")
        for _, _, _, record in batch
        if isinstance(record, StepStart) and record.name == "memory.put"
    )


def _once_each(store: MemoryStore, ns: str, n: int, run_id: str, step: str) -> None:
    """Each of the ``n`` keys holds one version, written by its own op; none missing."""
    for i in range(n):
        history = store.history(ns, f"k{i}")
        assert len(history) == 1, (i, history)
        assert history[0]["op"] == f"{run_id}/{step.format(i=i)}/0"
        assert store.get(ns, f"k{i}")["value"] == {"i": i}


@pytest.mark.parametrize("kill_after", [1, 3, PUTS])
def test_a_put_applied_when_the_process_died_is_not_applied_again(
    tmp_path: Path, kill_after: int
) -> None:
    died = _child(tmp_path, {"plan": _chain("crash.plan", PUTS, 0.01)}, kill_after)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    store = open_store(tmp_path)
    try:
        op = f"{RUN_ID}/p{kill_after - 1}/0"
        first = store.applied(op)
        assert first is not None  # the store committed it; the journal never got the result
        resumed = tiffany(tmp_path, "replay", RUN_ID, "--json", "--no-live")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        result = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert result["status"] == "succeeded", result
        _once_each(store, "crash.plan", PUTS, RUN_ID, "p{i}")
        assert _put_starts(tmp_path) == PUTS + 1  # the step in flight started once more
        # The step ran again and was answered the first application's result.
        again = result["outputs"][f"p{kill_after - 1}"]
        assert (again["store_seq"], again["created"], again["version"]) == (
            first["store_seq"],
            True,
            1,
        )
    finally:
        store.close()
    verify = tiffany(tmp_path, "replay", RUN_ID, "--verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_workflow_killed_inside_a_put_resumes_and_writes_each_once(tmp_path: Path) -> None:
    target = {"workflow": "memory-tests.puts", "inputs": {"n": PUTS, "nap_s": 0.01}}
    died = _child(tmp_path, target, 4)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    env = {"PYTHONPATH": str(HERE)}
    resumed = tiffany(
        tmp_path, "replay", RUN_ID, "--json", "--no-live", "--import", "memory_flows", **env
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded", result
    assert result["outputs"]["versions"] == [1] * PUTS
    store = open_store(tmp_path)
    try:  # the workflow's calls are tool_1, tool_2... (one per put)
        for i in range(PUTS):
            history = store.history("crash.flow", f"k{i}")
            assert [h["op"] for h in history] == [f"{RUN_ID}/tool_{i + 1}/0"]
    finally:
        store.close()
    verify = tiffany(tmp_path, "replay", RUN_ID, "--verify", "--import", "memory_flows", **env)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_an_agent_killed_inside_its_remember_resumes_and_remembers_once(tmp_path: Path) -> None:
    script = str(ROOT / "examples" / "memory" / "script.yaml")
    plan = {
        "name": "agent",
        "steps": [
            {
                "id": "chat",
                "tool": "agent",
                "args": {"goal": "I prefer the dark theme.", "memory": {"namespace": "users.bo"}},
            }
        ],
        "outputs": {"answer": "${steps.chat.output.answer}"},
    }
    died = _child(tmp_path, {"plan": plan}, 1, TIFFANY_LLM_SCRIPT=script)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    resumed = tiffany(tmp_path, "replay", RUN_ID, "--json", "--no-live", TIFFANY_LLM_SCRIPT=script)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded", result
    assert result["outputs"]["answer"] == "Noted: you prefer the dark theme."
    store = open_store(tmp_path)
    try:  # the model's call ran twice (before and after the kill); its write applied once
        history = store.history("users.bo", "theme")
        assert [h["op"] for h in history] == [f"{RUN_ID}/chat/1"]
    finally:
        store.close()
    assert _put_starts(tmp_path) == 2
    verify = tiffany(tmp_path, "replay", RUN_ID, "--verify", TIFFANY_LLM_SCRIPT="/nonexistent.yaml")
    assert verify.returncode == 0, verify.stdout + verify.stderr


# -- a real engine, kill -9 ----------------------------------------------------------------


@pytest.fixture(params=["file", "postgres"])
def engine_home(request: pytest.FixtureRequest) -> Iterator[tuple[Path, dict[str, str], str]]:
    """A data dir, the engine's environment, and its store's URL (SQLite, or PostgreSQL)."""
    home = Path(tempfile.mkdtemp(prefix="tfm-", dir="/tmp"))  # short: Unix sockets
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env["TIFFANY_LOG_FORMAT"] = "json"
    store = f"sqlite:///{home / 'data' / 'tiffany.db'}"
    if request.param == "postgres":
        store = request.getfixturevalue("pg_schema_url")
        env |= {"TIFFANY_DATABASE_URL": store, "TIFFANY_JOURNAL": "postgres"}
    try:
        yield home / "data", env, store
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _finished(store_url: str, run_id: str) -> dict[str, Any]:
    db = make_engine(store_url)
    deadline = time.monotonic() + FINISH_S
    try:
        while True:
            with Session(db) as session:
                run = queries.get_run(session, run_id)
                if run is not None and run.status in ("succeeded", "failed", "cancelled"):
                    return queries.run_detail(run)
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} did not finish within {FINISH_S} s")
            time.sleep(0.05)
    finally:
        db.dispose()


def test_kill9_of_a_real_engine_mid_plan_then_recovery_writes_each_once(
    engine_home: tuple[Path, dict[str, str], str],
) -> None:
    data_dir, env, url = engine_home
    n = 10
    engine = EngineProc(data_dir, env=env)
    store = MemoryStore.open(url, embedder=HashingEmbedder())
    try:
        engine.wait_ready()
        run_id = engine.call("submit", plan=_chain("crash.engine", n, 0.15), inputs={})["run_id"]
        deadline = time.monotonic() + FINISH_S
        while len(store.items("crash.engine")["items"]) < 3:  # mid-way: a few written
            assert time.monotonic() < deadline, engine.log()[-3000:]
            time.sleep(0.01)
        engine.proc.send_signal(signal.SIGKILL)
        engine.proc.wait(30)
        written = len(store.items("crash.engine")["items"])
        assert written < n, "the run ended before the kill: nothing was tested"
        engine = EngineProc(data_dir, env=env)  # recovers the run
        engine.wait_ready()
        run = _finished(url, run_id)
        assert run["status"] == "succeeded", run["error"]
        _once_each(store, "crash.engine", n, run_id, "p{i}")
        report = engine.call("verify", run_id=run_id)
        assert report["identical"] is True, report
    finally:
        store.close()
        assert engine.stop() == 0, engine.log()[-3000:]
