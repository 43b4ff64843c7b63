"""Engine and API restart independently (real engine processes, real uvicorn).

* an engine restart: the API keeps answering (503 for commands while the
  engine is down, ``/readyz`` says why), its websockets get the new engine's
  events with seqs above the old ones (``gone`` between them when the API
  missed the end of the old engine's); a run submitted before the restart
  finishes;
* an API restart: a client resuming with ``since`` gets what it missed from
  the engine's ring, without a gap.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import (
    EngineProcess,
    make_settings,
    short_dir,
    start_engine,
    wait_until,
    ws_connect,
)

from tiffany.feed.transport import FEED_SOCKET, follow

pytestmark = pytest.mark.usefixtures("_needs_engine")

PLAN = {
    "name": "two-naps",
    "steps": [
        {"id": "a", "tool": "sleep", "args": {"seconds": 0.3}},
        {"id": "b", "tool": "sleep", "args": {"seconds": 0.3}, "after": ["a"]},
    ],
}


@pytest.fixture
def _needs_engine() -> None:
    pytest.importorskip("tiffany.engine.service", reason="the engine service is not there yet")


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = short_dir("tfr-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _status(base: str, run_id: str) -> str:
    r = httpx.get(f"{base}/api/runs/{run_id}", timeout=10)
    return str(r.json().get("status")) if r.status_code == 200 else ""


def _read_until(ws: Any, predicate: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if frame.get("type") == "ping":
            continue
        frames.append(frame)
        if predicate(frame):
            return frames


def test_an_engine_restart_under_a_running_api(data_dir, live_api_factory) -> None:
    engine: EngineProcess = start_engine(data_dir)
    try:
        live = live_api_factory(make_settings(data_dir, ws_ping_interval_s=0.5))
        base = live.base
        wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200)
        with ws_connect(f"{live.ws_base}/ws/activity") as ws:
            wait_until(lambda: len(live.state.relay.subscribers) == 1)
            first = httpx.post(f"{base}/api/runs", json={"plan": PLAN}).json()["run_id"]
            seen = _read_until(
                ws, lambda f: f.get("run_id") == first and f.get("kind") == "spawned"
            )

            assert engine.stop() == 0  # mid-run: the run stays unfinished in the WAL
            down = httpx.post(f"{base}/api/runs", json={"plan": PLAN})
            assert down.status_code == 503
            assert down.headers["retry-after"]
            ready = httpx.get(f"{base}/readyz")
            assert ready.status_code == 503
            assert ready.json()["reason"] == "engine unreachable"
            assert httpx.get(f"{base}/api/runs/{first}").status_code == 200  # the store answers

            engine = start_engine(data_dir)
            wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, timeout=30)
            second = httpx.post(f"{base}/api/runs", json={"plan": PLAN}).json()["run_id"]
            after = _read_until(
                ws, lambda f: f.get("run_id") == second and f.get("kind") == "run.finished"
            )
            # One stream across both engines: strictly increasing seqs (a ``gone``
            # between them only if the API missed the first engine's last events).
            seqs = [f["seq"] for f in seen + after if "seq" in f]
            assert seqs == sorted(set(seqs))
            wal_seqs = [f["wal_seq"] for f in seen + after if "wal_seq" in f]
            assert wal_seqs == sorted(wal_seqs)
            assert wal_seqs[0] > 0  # every run event comes after its RUN_START record
            assert any(f.get("run_id") == second and f.get("kind") == "run.started" for f in after)
        wait_until(lambda: _status(base, first) == "succeeded", timeout=30)  # resumed, finished
        assert _status(base, second) == "succeeded"
    finally:
        engine.stop()


def test_an_api_restart_resumes_the_feed_from_the_engine(data_dir, live_api_factory) -> None:
    engine = start_engine(data_dir)
    try:
        settings = make_settings(data_dir, ws_ping_interval_s=0.5)
        first_api = live_api_factory(settings)
        with ws_connect(f"{first_api.ws_base}/ws/activity") as ws:
            wait_until(lambda: len(first_api.state.relay.subscribers) == 1)
            run_id = httpx.post(f"{first_api.base}/api/runs", json={"plan": PLAN}).json()["run_id"]
            seen = _read_until(ws, lambda f: f.get("kind") == "spawned")
        last = seen[-1]["seq"]
        first_api.stop()  # the API goes away mid-run; the run goes on

        wait_until(lambda: _status_via_store(data_dir, run_id) == "succeeded", timeout=30)
        second_api = live_api_factory(settings)
        with ws_connect(f"{second_api.ws_base}/ws/activity?since={last}") as ws:
            rest = _read_until(
                ws, lambda f: f.get("run_id") == run_id and f.get("kind") == "run.finished"
            )
        # no gap: exactly what the engine's own feed holds after ``last``
        seqs = [f["seq"] for f in rest]
        held = asyncio.run(_engine_events(data_dir, since=last, upto=seqs[-1]))
        assert seqs == [f["seq"] for f in held]
        assert second_api.state.relay.catchups == 1
    finally:
        engine.stop()


async def _engine_events(data_dir: Path, since: int, upto: int) -> list[dict[str, Any]]:
    """The engine's feed after ``since``, up to the event ``upto`` (straight from its socket)."""
    got: list[dict[str, Any]] = []

    async def take() -> None:
        async for frame in follow(data_dir / FEED_SOCKET, since=since, reconnect=False):
            assert frame.get("type") != "gone", frame
            got.append(frame)
            if frame["seq"] >= upto:
                return

    await asyncio.wait_for(take(), 10)
    return got


def _status_via_store(data_dir: Path, run_id: str) -> str:
    from tiffany.store import make_engine, queries, session_factory

    store = make_engine(make_settings(data_dir).database_url)
    try:
        with session_factory(store)() as session:
            run = queries.get_run(session, run_id)
            return run.status if run is not None else ""
    finally:
        store.dispose()


#: A user's tool module for the crash test: a step that records its start, then
#: holds until the test lets it go (a file), so a kill -9 lands while it runs.
STALL_TOOLS = """\
import os
import time

from tiffany import python_tool


@python_tool("stall")
def stall(marks: str, go: str, name: str) -> dict:
    with open(marks, "a") as f:
        f.write(name + "\\n")
    while not os.path.exists(go):
        time.sleep(0.02)
    return {"name": name}
"""


def test_steps_re_run_after_a_crash_are_marked_in_the_run_detail(data_dir, monkeypatch) -> None:
    """kill -9 with two steps in flight (one run in its worker, one in a tool task)."""
    from api_support import finished_run, serve, submit_plan
    from process_support import terminate, wait_for

    (data_dir / "mods").mkdir()
    (data_dir / "mods" / "stalltools.py").write_text(STALL_TOOLS)
    monkeypatch.setenv("PYTHONPATH", str(data_dir / "mods"))
    marks, go = data_dir / "marks.txt", data_dir / "go"

    def stall(name: str, **extra: Any) -> dict[str, Any]:
        kwargs = {"marks": str(marks), "go": str(go), "name": name}
        args = {"function": "stall", "kwargs": kwargs}
        return {"id": name, "tool": "python", "args": args, **extra}

    plan = {
        "name": "crash",
        "steps": [
            {"id": "first", "tool": "sleep", "args": {"seconds": 0}},
            stall("inworker", after=["first"]),
            stall("intask", after=["first"], timeout_s=600),
        ],
    }
    proc, url = serve(data_dir / "d", "--import", "stalltools")
    try:
        run_id = submit_plan(url, plan)["run_id"]
        wait_for(
            lambda: marks.exists() and sorted(marks.read_text().split()) == ["intask", "inworker"],
            60,
            "both steps to start",
        )
        serve_json = data_dir / "d" / "serve.json"
        before = json.loads(serve_json.read_text())["engine_pid"]
        os.kill(before, signal.SIGKILL)
        wait_for(
            lambda: json.loads(serve_json.read_text())["engine_pid"] != before,
            60,
            "serve to restart the engine",
        )
        go.touch()
        done = finished_run(url, run_id, timeout=120)
    finally:
        terminate(proc)
    assert done["status"] == "succeeded", done
    steps = {s["step_id"]: s for s in done["steps"]}
    assert sorted(marks.read_text().split()) == ["intask", "intask", "inworker", "inworker"]
    for name in ("inworker", "intask"):
        [attempt] = steps[name]["attempts"]
        assert attempt["ok"] is True
        assert attempt["rerun_after_crash"] is True, steps[name]
    assert "rerun_after_crash" not in steps["first"]["attempts"][0]
