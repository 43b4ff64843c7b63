"""Memory reads replay exactly; a re-run reads memory as it is now and says when.

* a run writes and reads; memory changes afterwards (the item overwritten,
  another deleted, a new one that a search would rank first): the run's
  replay from the journal alone (no store at all) computes the very
  outputs the run had, and ``tiffany replay RUN --verify`` says it replays
  identically;
* on a real engine, a re-run (``rerun --from read``: a new run) reuses the
  write (it is not applied again) and reads memory now: the new value,
  with a later ``as_of``; both runs verify.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_process import EngineProc
from memory_runs import open_store, replayed, run_plan, tiffany
from sqlalchemy.orm import Session

from tiffany.memory import HashingEmbedder, MemoryStore
from tiffany.store import make_engine, queries

FINISH_S = 60.0

PLAN = {
    "name": "prefs",
    "steps": [
        {
            "id": "write",
            "tool": "memory.put",
            "args": {"namespace": "prefs.ann", "key": "color", "value": "blue"},
        },
        {
            "id": "extra",
            "tool": "memory.put",
            "args": {"namespace": "prefs.ann", "key": "tea", "value": "green tea, no sugar"},
        },
        {
            "id": "read",
            "tool": "memory.get",
            "args": {"namespace": "prefs.ann", "key": "color"},
            "after": ["write", "extra"],
        },
        {
            "id": "find",
            "tool": "memory.search",
            "args": {"namespace": "prefs.ann", "query": "favourite color"},
            "after": ["write", "extra"],
        },
    ],
    "outputs": {
        "color": "${steps.read.output.item.value}",
        "read": "${steps.read.output}",
        "find": "${steps.find.output}",
    },
}


def test_reads_replay_what_the_run_saw_however_memory_changed(tmp_path: Path) -> None:
    run_id, state = run_plan(tmp_path, PLAN)
    assert state.status == "succeeded", state.error
    seen = state.result
    assert seen["outputs"]["color"] == "blue"
    store = open_store(tmp_path)
    try:  # memory changes after the run
        store.put("prefs.ann", "color", "red", op="test:overwrite")
        store.delete("prefs.ann", "tea", op="test:delete")
        store.put("prefs.ann", "favourite", "favourite color: red", op="test:new")
        assert store.get("prefs.ann", "color")["value"] == "red"
    finally:
        store.close()
    status, result = replayed(tmp_path, run_id)  # no store: the journal answers every read
    assert status == "succeeded"
    assert result == seen
    verify = tiffany(tmp_path, "replay", run_id, "--verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "replays identically" in verify.stdout + verify.stderr


def _finished(url: str, run_id: str) -> dict[str, Any]:
    db = make_engine(url)
    deadline = time.monotonic() + FINISH_S
    try:
        while True:
            with Session(db) as session:
                run = queries.get_run(session, run_id)
                if run is not None and run.status in ("succeeded", "failed", "cancelled"):
                    return queries.run_detail(run)
            assert time.monotonic() < deadline, f"run {run_id} did not finish"
            time.sleep(0.05)
    finally:
        db.dispose()


def test_a_rerun_reads_memory_as_it_is_now_and_reuses_the_write() -> None:
    home = Path(tempfile.mkdtemp(prefix="tfr-", dir="/tmp"))  # short: Unix sockets
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    url = f"sqlite:///{home / 'data' / 'tiffany.db'}"
    engine = EngineProc(home / "data", env=env | {"TIFFANY_LOG_FORMAT": "json"})
    store: MemoryStore | None = None
    try:
        engine.wait_ready()
        first = engine.call("submit", plan=PLAN, inputs={})["run_id"]
        run = _finished(url, first)
        assert run["status"] == "succeeded", run["error"]
        before = run["outputs"]["read"]
        assert before["item"]["value"] == "blue"
        store = MemoryStore.open(url, embedder=HashingEmbedder())
        store.put("prefs.ann", "color", "red", op="test:overwrite")
        again = engine.call("rerun", rerun_of=first, from_step="read")["run_id"]
        rerun = _finished(url, again)
        assert rerun["status"] == "succeeded", rerun["error"]
        now = rerun["outputs"]["read"]
        assert now["item"]["value"] == "red"  # memory as it is now
        assert now["as_of"] > before["as_of"]  # and it says when
        write = next(s for s in rerun["steps"] if s["step_id"] == "write")
        assert write["attempts"][0]["reused"]["run_id"] == first
        ops = [h["op"] for h in store.history("prefs.ann", "color")]
        assert ops == [f"{first}/write/0", "test:overwrite"]  # the write was not applied again
        for run_id in (first, again):
            report = engine.call("verify", run_id=run_id)
            assert report["identical"] is True, report
    finally:
        if store is not None:
            store.close()
        code = engine.stop()
        shutil.rmtree(home, ignore_errors=True)
        assert code == 0, engine.log()[-3000:]
