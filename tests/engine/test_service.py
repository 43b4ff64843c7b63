"""The engine process: control channel, group-committed submissions, live projection,
PAL feed, cancel, verify, restart and recovery. A real ``tiffany engine`` process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_process import EngineProc
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session

from tiffany.errors import InvalidCommand, KeyReused, Refusal, RunFinished, RunNotFound
from tiffany.store import make_engine, queries
from tiffany.wal import iter_records
from tiffany.wire.control import AsyncControlClient
from tiffany.wire.records import decode

SLEEPY = {
    "name": "sleepy",
    "steps": [
        {"id": "nap", "tool": "sleep", "args": {"seconds": 0.2}},
        {
            "id": "write",
            "tool": "file.write",
            "after": ["nap"],
            "args": {"path": "out.txt", "content": "hello"},
        },
    ],
    "outputs": {"path": "${steps.write.output.path}"},
}
LONG = {
    "name": "long",
    "steps": [
        {"id": "first", "tool": "file.write", "args": {"path": "first.txt", "content": "1"}},
        {"id": "wait", "tool": "sleep", "after": ["first"], "args": {"seconds": 3}},
        {
            "id": "last",
            "tool": "file.write",
            "after": ["wait"],
            "args": {"path": "last.txt", "content": "2"},
        },
    ],
}


def engine_metrics(engine: EngineProc) -> dict[str, float]:
    """The engine's ``metrics`` op (Prometheus text), parsed: sample name -> value."""
    text = engine.call("metrics")["text"]
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineProc]:
    proc = EngineProc(tmp_path / "data")
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, proc.log()


def store_run(
    data_dir: Path, run_id: str, timeout: float = 15, until: str | None = None
) -> dict[str, Any]:
    """Poll the engine's SQLite store until the run is there (and has status ``until``)."""
    db = make_engine(f"sqlite:///{data_dir / 'tiffany.db'}")
    deadline = time.monotonic() + timeout
    try:
        while True:
            with Session(db) as session:
                run = queries.get_run(session, run_id)
                if run is not None and (until is None or run.status == until):
                    return queries.run_detail(run)
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} not in the store with status {until}")
            time.sleep(0.05)
    finally:
        db.dispose()


def run_start_seqs(data_dir: Path) -> dict[str, int]:
    out = {}
    for rec in iter_records(data_dir / "wal"):
        if rec.rtype == 1:
            out[decode(rec.rtype, rec.payload).run_id] = rec.seq
    return out


def test_submit_answers_once_durable_and_the_store_follows(engine: EngineProc) -> None:
    answer = engine.call("submit", plan=SLEEPY, inputs={})
    run_id = answer["run_id"]
    assert answer["created"] is True
    # Acknowledged means on disk: the RUN_START record is in the WAL already.
    assert run_id in run_start_seqs(engine.data_dir)
    detail = store_run(engine.data_dir, run_id, until="succeeded")
    assert detail["outputs"] == {"path": "out.txt"}
    assert [s["status"] for s in detail["steps"]] == ["succeeded", "succeeded"]
    kinds = {t["kind"] for t in detail["tasks"]}
    assert {"planner", "worker"} <= kinds
    metrics = engine_metrics(engine)
    assert metrics["tiffany_wal_fsync_seconds_count"] == metrics["tiffany_wal_commits_total"] > 0
    assert metrics["tiffany_wal_records_total"] >= metrics["tiffany_wal_commits_total"]
    assert metrics["tiffany_dispatches_total"] > 0
    assert (
        metrics["tiffany_projector_lag_records"] == 0 or metrics["tiffany_projector_last_seq"] > 0
    )


def test_wait_projected_for_all_the_engine_has_written(engine: EngineProc) -> None:
    """``written: true``: the store holds every record the engine wrote when asked.

    How a reader of another engine's run waits (a re-run, ``tail --run``),
    in one request: it knows no seq of that engine.
    """
    answer = engine.call("submit", plan=SLEEPY, inputs={})
    got = engine.call("wait_projected", written=True, wait_s=10)
    assert got["reached"] is True
    assert got["written_seq"] >= answer["seq"]
    assert got["last_seq"] >= got["written_seq"]
    assert store_run(engine.data_dir, answer["run_id"], timeout=0.1)["run_id"] == answer["run_id"]


def test_invalid_plans_name_the_field(engine: EngineProc) -> None:
    bad = {
        "name": "bad",
        "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 1}, "after": ["b"]}],
    }
    with pytest.raises(Refusal) as err:
        engine.call("submit", plan=bad, inputs={})
    assert isinstance(err.value, InvalidCommand)
    assert err.value.detail[0]["loc"] == "steps[0].after[0]"
    with pytest.raises(Refusal) as err:
        engine.call("submit", plan=SLEEPY, inputs={"nope": 1})
    assert isinstance(err.value, InvalidCommand)
    assert err.value.detail[0]["loc"] == "inputs.nope"
    with pytest.raises(Refusal) as err:
        engine.call("submit", plan=[1, 2], inputs={})
    assert isinstance(err.value, InvalidCommand)
    # Nothing was journaled for refused plans.
    assert run_start_seqs(engine.data_dir) == {}


def test_idempotency_key_returns_the_same_run(engine: EngineProc) -> None:
    first = engine.call("submit", plan=SLEEPY, inputs={}, key="abc")
    again = engine.call("submit", plan=SLEEPY, inputs={}, key="abc")
    assert again == {**first, "created": False}
    with pytest.raises(Refusal) as err:
        engine.call("submit", plan=LONG, inputs={}, key="abc")
    assert isinstance(err.value, KeyReused)
    assert len(run_start_seqs(engine.data_dir)) == 1


def test_cancel_running_finished_and_unknown(engine: EngineProc) -> None:
    run_id = engine.call("submit", plan=LONG, inputs={})["run_id"]
    store_run(engine.data_dir, run_id)
    assert engine.call("cancel", run_id=run_id)["status"] == "cancelling"
    detail = store_run(engine.data_dir, run_id, until="cancelled")
    assert {s["step_id"]: s["status"] for s in detail["steps"]}["last"] in ("skipped", "cancelled")
    with pytest.raises(Refusal) as err:
        engine.call("cancel", run_id=run_id)
    assert isinstance(err.value, RunFinished)
    with pytest.raises(Refusal) as err:
        engine.call("cancel", run_id="run-nope")
    assert isinstance(err.value, RunNotFound)


def test_verify_replays_a_finished_run(engine: EngineProc) -> None:
    run_id = engine.call("submit", plan=SLEEPY, inputs={})["run_id"]
    store_run(engine.data_dir, run_id, until="succeeded")
    report = engine.call("verify", run_id=run_id)
    assert report["identical"] is True, report
    assert report["divergence"] is None
    with pytest.raises(Refusal) as err:
        engine.call("verify", run_id="run-nope")
    assert isinstance(err.value, RunNotFound)


def test_pipelined_async_submissions_share_group_commits(engine: EngineProc) -> None:
    async def main() -> list[dict[str, Any]]:
        client = AsyncControlClient(engine.data_dir)
        try:
            return await asyncio.gather(
                *(client.request("submit", plan=SLEEPY, inputs={}) for _ in range(40))
            )
        finally:
            await client.close()

    before = engine_metrics(engine)["tiffany_wal_commits_total"]
    answers = asyncio.run(main())
    assert len({a["run_id"] for a in answers}) == 40
    seqs = run_start_seqs(engine.data_dir)
    assert all(a["run_id"] in seqs for a in answers)
    commits = engine_metrics(engine)["tiffany_wal_commits_total"] - before
    assert commits > 0


def test_feed_streams_the_runs_activity(engine: EngineProc) -> None:
    from tiffany.feed.transport import follow

    async def main() -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []

        async def collect() -> None:
            async for frame in follow(engine.data_dir / "feed.sock"):  # from now on
                frames.append(frame)
                if frame.get("kind") == "run.finished":
                    return

        task = asyncio.create_task(collect())
        await asyncio.sleep(0.3)  # subscribed
        await asyncio.to_thread(engine.call, "submit", plan=SLEEPY, inputs={})
        await asyncio.wait_for(task, 20)
        # A resume from the middle gets exactly the rest.
        middle = frames[len(frames) // 2]["seq"]
        rest: list[dict[str, Any]] = []
        async for frame in follow(engine.data_dir / "feed.sock", since=middle, reconnect=False):
            rest.append(frame)
            if frame.get("kind") == "run.finished":
                break
        assert [f["seq"] for f in rest] == [f["seq"] for f in frames if f["seq"] > middle]
        return frames

    frames = asyncio.run(main())
    events = [f for f in frames if "seq" in f]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs))
    kinds = {e["kind"] for e in events}
    assert {"run.started", "spawned", "step", "blocked", "woke", "exit", "run.finished"} <= kinds
    assert {e["task_kind"] for e in events} >= {"planner", "worker"}
    # A run's end in the run's own words (the store's and the dashboard's), not the kernel's.
    assert [e["label"] for e in events if e["kind"] == "run.finished"] == ["succeeded"]
    # The engine's own tasks (inbox, signal pipe) are not on the feed.
    assert all(e["run_id"] for e in events), [e for e in events if not e["run_id"]][:3]


def test_restart_resumes_an_unfinished_run_without_redoing_steps(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = EngineProc(data)
    proc.wait_ready()
    first = proc.call("submit", plan=LONG, inputs={}, key="long-1")
    run_id = first["run_id"]
    detail = store_run(data, run_id)
    deadline = time.monotonic() + 10
    while {s["step_id"]: s["status"] for s in detail["steps"]}.get("first") != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.05)
        detail = store_run(data, run_id)
    assert proc.stop(signal.SIGTERM) == 0  # graceful: the run stays unfinished in the WAL
    assert proc.logged("engine.stopped")
    workspace_first = next((data / "workspaces").rglob("first.txt"))
    first_mtime = workspace_first.stat().st_mtime_ns

    again = EngineProc(data)
    try:
        status = again.wait_ready()
        assert status["ready"] is True
        assert again.logged("engine.started")[-1]["resumed"] == 1
        # The idempotency key survived the restart, with the seq of the run's start.
        assert again.call("submit", plan=LONG, inputs={}, key="long-1") == {
            "run_id": run_id,
            "created": False,
            "seq": first["seq"],
        }
        detail = store_run(data, run_id, until="succeeded", timeout=30)
        assert [s["status"] for s in detail["steps"]] == ["succeeded"] * 3
        # The completed step was not run again.
        assert workspace_first.stat().st_mtime_ns == first_mtime
        assert any((data / "workspaces").rglob("last.txt"))
    finally:
        assert again.stop() == 0


def test_a_recovered_run_does_not_publish_its_past_again(tmp_path: Path) -> None:
    """Recovery replays a run's finished steps; their events went out in its first life.

    Published again (new seqs), every finished step started and finished a
    second time on the feed after each restart.
    """
    from tiffany.feed import FEED_SEQ_FILE
    from tiffany.feed.transport import follow

    data = tmp_path / "data"
    proc = EngineProc(data)
    proc.wait_ready()
    run_id = proc.call("submit", plan=LONG, inputs={})["run_id"]
    deadline = time.monotonic() + 10
    while store_run(data, run_id)["steps"][0]["status"] != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proc.stop(signal.SIGTERM) == 0  # the run stays unfinished, "first" done
    # The last seq the first life handed out: a client that saw it resumes
    # with it and gets every event of the next life (pal/hub.py), replayed or not.
    seen = int((data / FEED_SEQ_FILE).read_text())

    again = EngineProc(data)
    try:
        again.wait_ready()  # the run was replayed up to its journal's end, then went live

        async def events() -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = []
            async for frame in follow(data / "feed.sock", since=seen, run_id=run_id):
                got.append(frame)
                if frame.get("kind") == "run.finished":
                    return got
            return got

        got = asyncio.run(asyncio.wait_for(events(), 30))
    finally:
        assert again.stop() == 0
    assert got[-1]["label"] == "succeeded"
    steps = {e.get("step_id") for e in got}
    assert "first" not in steps, [e for e in got if e.get("step_id") == "first"][:3]
    assert ("spawned", "last") in {(e["kind"], e.get("step_id")) for e in got}
    assert "run.started" not in {e["kind"] for e in got}  # its start went out in its first life


def test_kill_9_then_restart_recovers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = EngineProc(data)
    proc.wait_ready()
    run_id = proc.call("submit", plan=LONG, inputs={})["run_id"]
    time.sleep(0.5)
    proc.stop(signal.SIGKILL)
    again = EngineProc(data)
    try:
        again.wait_ready()
        detail = store_run(data, run_id, until="succeeded", timeout=30)
        assert [s["status"] for s in detail["steps"]] == ["succeeded"] * 3
    finally:
        assert again.stop() == 0


def _projector_pid(engine: EngineProc) -> int:
    import subprocess

    out = subprocess.run(
        ["pgrep", "-P", str(engine.proc.pid), "-f", "projector"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert out, "no projector process under the engine"
    return int(out[0])


def test_a_killed_projector_process_is_restarted_and_catches_up(engine: EngineProc) -> None:
    import os

    first = engine.call("submit", plan=SLEEPY, inputs={})["run_id"]
    store_run(engine.data_dir, first, until="succeeded")
    old = _projector_pid(engine)
    os.kill(old, signal.SIGKILL)
    second = engine.call("submit", plan=SLEEPY, inputs={})["run_id"]
    detail = store_run(engine.data_dir, second, until="succeeded", timeout=30)
    assert detail["outputs"] == {"path": "out.txt"}
    assert _projector_pid(engine) != old
    assert engine_metrics(engine)["tiffany_projector_lag_records"] == 0


def test_the_projector_runs_below_its_engine_as_a_batch_process(engine: EngineProc) -> None:
    # Settings.projector_nice (10 by default): when both cores are busy, the
    # submission path gets the CPU first (bench/README.md, api.py).
    import os

    run_id = engine.call("submit", plan=SLEEPY, inputs={})["run_id"]
    store_run(engine.data_dir, run_id, until="succeeded")  # the projector is past start-up
    pid = _projector_pid(engine)
    engine_nice = os.getpriority(os.PRIO_PROCESS, engine.proc.pid)
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, engine_nice + 10)
    assert os.sched_getscheduler(pid) == os.SCHED_BATCH
    assert os.sched_getscheduler(engine.proc.pid) == os.SCHED_OTHER


def test_a_run_that_diverges_on_recovery_fails_alone(tmp_path: Path) -> None:
    """Its code changed under its journal: that run is marked failed, the others go on."""
    from tiffany.durable import Runtime, scan
    from tiffany.engine.service import EXIT_RUN_DIVERGED

    here = str(Path(__file__).resolve().parent)
    data = tmp_path / "data"
    sys.path.insert(0, here)
    try:
        rt = Runtime(data)
        changing = rt.submit("diverge_workload:changing")
        steady = rt.submit("diverge_workload:steady", 0.3)

        def stopper():
            yield
            rt.sched.stop()

        rt.sched.spawn(stopper())
        rt.run()  # both runs parked on their sleeps, unfinished in the WAL
        rt.close()
    finally:
        sys.path.remove(here)

    env = {
        **os.environ,
        "TIFFANY_LOG_FORMAT": "json",
        "PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "DIVERGE": "1",
    }
    first = EngineProc(data, env=env)
    assert first.proc.wait(30) == EXIT_RUN_DIVERGED, first.log()
    assert first.logged("replay.nondeterminism")
    index = scan(data / "wal")
    assert index.get(changing).status == "failed"
    assert index.get(steady).status == "running"

    again = EngineProc(data, env=env)
    try:
        again.wait_ready()
        assert again.logged("engine.started")[-1]["resumed"] == 1
        deadline = time.monotonic() + 20
        while scan(data / "wal").get(steady).status != "succeeded":
            assert time.monotonic() < deadline, again.log()
            time.sleep(0.1)
    finally:
        assert again.stop() == 0


def test_a_long_lived_engine_keeps_nothing_of_finished_runs(engine: EngineProc) -> None:
    """Finished runs leave the journal's and the scheduler's memory (WAL and store keep them)."""
    ids = [engine.call("submit", plan=SLEEPY, inputs={})["run_id"] for _ in range(5)]
    for run_id in ids:
        store_run(engine.data_dir, run_id, until="succeeded")
    # Statuses stay answerable: a finished run still gets 409 on cancel.
    with pytest.raises(Refusal) as err:
        engine.call("cancel", run_id=ids[0])
    assert isinstance(err.value, RunFinished)
    deadline = time.monotonic() + 10
    while engine.call("status")["runs_held"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # Only the engine's own tasks are left (the inbox and the signal pipe).
    assert engine.call("status")["tasks_held"] == 2


HOG_TOOLS = """\
import time

from tiffany import python_tool


@python_tool("hog", inline=True)
def hog(seconds: float) -> dict:
    time.sleep(seconds)  # inline: holds the scheduler thread (what a bad tool does)
    return {"slept": seconds}
"""


def test_submissions_waiting_for_the_loop_hold_no_control_thread(tmp_path: Path) -> None:
    """More submissions wait than there are control workers (16), and the engine still answers.

    A tool holds the loop for 3 s; 40 submissions queue behind it, and a
    ``status`` asked meanwhile is answered at once, before them. (Each
    submission used to hold a control worker until its commit: the 17th
    request waited for the loop, ``status`` included.)
    """
    (tmp_path / "hogtools.py").write_text(HOG_TOOLS)
    env = {**os.environ, "TIFFANY_LOG_FORMAT": "json", "PYTHONPATH": str(tmp_path)}
    proc = EngineProc(tmp_path / "data", "--import", "hogtools", env=env)
    hog_plan = {
        "name": "hog",
        "steps": [
            {"id": "hog", "tool": "python", "args": {"function": "hog", "kwargs": {"seconds": 3}}}
        ],
    }

    async def main() -> tuple[float, int, list[dict[str, Any]]]:
        queued = AsyncControlClient(proc.data_dir)
        asker = AsyncControlClient(proc.data_dir)
        try:
            await queued.request("submit", plan=hog_plan, inputs={})
            await asyncio.sleep(0.5)  # the hog step starts in the loop's next pass
            submissions = [
                asyncio.ensure_future(queued.request("submit", plan=SLEEPY, inputs={}))
                for _ in range(40)
            ]
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            status = await asker.request("status")
            took = time.monotonic() - t0
            waiting = sum(not s.done() for s in submissions)
            assert status["ready"]
            return took, waiting, await asyncio.gather(*submissions)
        finally:
            await queued.close()
            await asker.close()

    try:
        proc.wait_ready()
        took, waiting, answers = asyncio.run(main())
    finally:
        code = proc.stop()
    assert code == 0, proc.log()
    assert took < 1.5, f"status took {took:.2f} s behind the waiting submissions"
    assert waiting > 16, f"only {waiting} submissions were still waiting for the loop"
    assert len({a["run_id"] for a in answers}) == 40


def test_an_engine_without_a_model_says_so_at_start_and_in_its_status(tmp_path: Path) -> None:
    """Its llm and agent steps fail (tool.llm.not_configured): the operator hears it first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_LLM_")}
    env["TIFFANY_LOG_FORMAT"] = "json"
    bare = EngineProc(tmp_path / "bare", env=env)
    try:
        llm = bare.wait_ready()["llm"]
    finally:
        assert bare.stop() == 0, bare.log()
    assert llm["provider"] is None
    assert "TIFFANY_LLM_BASE_URL" in llm["note"]
    assert "engine.llm_not_configured" in bare.log()
    scripted = EngineProc(tmp_path / "scripted", env={**env, "TIFFANY_LLM_MODEL": "scripted"})
    try:
        assert scripted.wait_ready()["llm"] == {"provider": "scripted", "model": "scripted"}
    finally:
        assert scripted.stop() == 0, scripted.log()
    assert "engine.llm_not_configured" not in scripted.log()
