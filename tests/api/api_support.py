"""Helpers of the API tests: real engines, a real uvicorn, real sockets.

Importable by name (``from api_support import ...``); the fixtures that use
them are in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from engine_process import EngineProc

from tiffany.config import ENV_PREFIX, Settings
from tiffany.feed import Hub
from tiffany.feed.transport import FeedServer

ENGINE_START_TIMEOUT_S = 60.0
SLEEP_PLAN = {"name": "nap", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.05}}]}
LONG_PLAN = {"name": "long", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 60}}]}

#: A scripted model (``TIFFANY_LLM_SCRIPT``): an ``llm`` step asked to "Plan the
#: follow-up" proposes two steps; an ``agent`` step asked for a note writes it
#: (turn 1), reads it back (turn 2, and once with a tool it was not given),
#: then answers (turn 3).
AGENT_SCRIPT = """\
rules:
  - match: "Plan the follow-up"
    reply: "Two steps: draft, then review."
    steps:
      - {id: draft, tool: file.write, args: {path: draft.txt, content: "v1"}}
      - {id: review, tool: file.read, args: {path: draft.txt}, after: [draft]}
  - turn: 1
    match: "note"
    reply: "I will write the note first."
    tool_calls:
      - name: file.write
        arguments: {path: notes.md, content: "Tiffany journals every model and tool call."}
  - turn: 2
    reply: "Now I check what I wrote."
    tool_calls:
      - name: file.read
        arguments: {path: notes.md}
      - name: shell
        arguments: {argv: [rm, notes.md]}
  - turn: 3
    reply: "The note is written and reads back as intended."
"""
#: An agent step run by :data:`AGENT_SCRIPT`.
AGENT_PLAN = {
    "name": "agent-notes",
    "inputs": {"topic": "durable agent loops"},
    "steps": [
        {
            "id": "work",
            "tool": "agent",
            "args": {
                "goal": "Write a note about ${inputs.topic} to notes.md, read it back, answer.",
                "tools": ["file.write", "file.read"],
                "max_turns": 5,
            },
        }
    ],
}
#: A dynamic step (its two children come from :data:`AGENT_SCRIPT`), a step
#: waiting for signal ``go``, and one after both that has not started while it waits.
GRAPH_PLAN = {
    "name": "graph",
    "steps": [
        {
            "id": "think",
            "tool": "llm",
            "args": {"prompt": "Plan the follow-up", "plan": True},
            "dynamic": True,
        },
        {"id": "gate", "tool": "signal.wait", "args": {"name": "go"}},
        {
            "id": "publish",
            "tool": "file.write",
            "args": {"path": "out.txt", "content": "done"},
            "after": ["gate", "think"],
        },
    ],
}


def short_dir(prefix: str = "tfa-") -> Path:
    """Return a fresh directory with a short path (for Unix sockets)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def clean_env() -> dict[str, str]:
    """The environment without TIFFANY_* settings (a developer's must not leak in)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for a test: the data dir, JSON-free console logs, and overrides."""
    with pytest.MonkeyPatch.context() as mp:
        for field in Settings.model_fields:
            mp.delenv(f"{ENV_PREFIX}{field.upper()}", raising=False)
        return Settings(data_dir=data_dir, **overrides)


#: The engine process the API tests drive (shared with tests/engine).
EngineProcess = EngineProc


def start_engine(
    data_dir: Path, *extra: str, env_extra: dict[str, str] | None = None
) -> EngineProc:
    """Start ``tiffany engine`` on ``data_dir`` (clean environment) and wait until it is ready.

    Ready includes the projector's first report (its process is up), so a
    test's first ``min_seq`` read does not wait on a cold projector start.
    """
    env = clean_env()
    env["TIFFANY_LOG_FORMAT"] = "json"
    env.update(env_extra or {})
    proc = EngineProc(
        data_dir,
        *extra,
        env=env,
        ready_file=data_dir / "engine.json",
        log_path=data_dir / "engine.log",
    )
    proc.wait_ready(ENGINE_START_TIMEOUT_S)
    return proc


@dataclass
class HandFeed:
    """A real hub and feed server on ``<data_dir>/feed.sock``, fed by hand."""

    data_dir: Path
    hub: Hub
    server: FeedServer

    def publish(self, n: int, run_id: str | None = "r1", pad: int = 0) -> list[int]:
        """Publish ``n`` events and return their seqs."""
        first = self.hub.last_seq + 1  # no WAL: consecutive seqs
        for i in range(n):
            data = {"i": i, "pad": "x" * pad} if pad else {"i": i}
            self.hub.publish("step", run_id=run_id, task_id=i, label=f"#{i}", data=data)
        self.hub.drain()
        return list(range(first, first + n))

    def restart(self, seq0: int, ring_size: int = 100_000) -> None:
        """Stop this hub and server and start new ones (an engine restart)."""
        self.server.stop()
        self.hub = Hub(ring_size=ring_size, seq0=seq0)
        self.server = FeedServer(self.hub, self.data_dir / "feed.sock")
        self.server.start()


@dataclass
class LiveApi:
    """The app under uvicorn in a thread."""

    app: Any
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_base(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def state(self) -> Any:
        return self.app.state.tiffany

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def serve_in_thread(settings: Settings, ws: str | None = None) -> LiveApi:
    """Start the app for ``settings`` under uvicorn on a free port.

    ``ws``: a uvicorn websocket implementation instead of the API's own
    (``"websockets-sansio"``: plain ASGI sends, no direct writes).
    """
    from tiffany.api import create_app
    from tiffany.api.server import uvicorn_config

    settings = settings.model_copy(update={"host": "127.0.0.1", "port": 0})
    app = create_app(settings)
    config = uvicorn_config(settings, app)
    if ws is not None:
        config.ws = ws
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return LiveApi(app, server, thread, port)


def read_your_writes(client: Any, n: int) -> list[int]:
    """Submit ``n`` runs, each read back at once with its ``min_seq``; return the GET statuses.

    Each read must find its run (no sleep, no retry); the runs list with the
    last seq holds the last run.
    """
    statuses = []
    last = 0
    for _ in range(n):
        r = client.post("/api/runs", json={"plan": SLEEP_PLAN})
        assert r.status_code == 201, r.text
        answer = r.json()
        assert answer["seq"] > last  # the WAL seq: one clock, always forward
        last = answer["seq"]
        got = client.get(f"/api/runs/{answer['run_id']}", params={"min_seq": answer["seq"]})
        statuses.append(got.status_code)
        assert got.json().get("run_id") == answer["run_id"], got.text
    listed = client.get("/api/runs", params={"min_seq": last, "limit": 1}).json()
    assert listed["runs"][0]["last_seq"] >= last
    return statuses


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, every: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(every)


def ws_recv_json(ws: Any, timeout: float = 10.0) -> dict[str, Any]:
    """Receive one JSON frame from a sync websockets client."""
    return json.loads(ws.recv(timeout=timeout))


@contextlib.contextmanager
def ws_connect(url: str, **kwargs: Any) -> Iterator[Any]:
    from websockets.sync.client import connect

    kwargs.setdefault("proxy", None)
    kwargs.setdefault("compression", None)
    with connect(url, **kwargs) as ws:
        yield ws


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(
    data_dir: Path, *extra: str, env_extra: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``tiffany serve`` on ``data_dir`` as users do; return it and its base URL, ready.

    ``env_extra``: settings of its own (``TIFFANY_*``), over a clean environment.
    """
    from process_support import serve_argv, wait_for

    data_dir.mkdir(parents=True, exist_ok=True)
    env = clean_env() | {"TIFFANY_LOG_FORMAT": "json"} | (env_extra or {})
    proc = subprocess.Popen(
        serve_argv(data_dir, 0, *extra),
        stdout=(data_dir / "serve.log").open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    ready = data_dir / "serve.json"
    wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "serve.json")
    assert proc.poll() is None, (data_dir / "serve.log").read_text()[-3000:]
    url = str(json.loads(ready.read_text())["url"]).rstrip("/")
    wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, 60, "readyz")
    return proc, url


def submit_plan(url: str, plan: dict[str, Any]) -> dict[str, Any]:
    """``POST /api/runs``; the 201's body."""
    r = httpx.post(url + "/api/runs", json={"plan": plan}, timeout=30)
    assert r.status_code == 201, r.text
    return dict(r.json())


#: How long a read waits out 503 ``store.behind`` (the store catching up after a
#: restart, on a loaded machine): the documented answer is "retry", so a test
#: retries, as a client does, within a generous bound.
STORE_BEHIND_WAIT_S = 120.0


def read_run(url: str, run_id: str, min_seq: int | None = None) -> dict[str, Any]:
    """``GET /api/runs/{run_id}`` (as of ``min_seq``), retrying while the store is behind."""
    params = {} if min_seq is None else {"min_seq": min_seq}
    deadline = time.monotonic() + STORE_BEHIND_WAIT_S
    while True:
        r = httpx.get(f"{url}/api/runs/{run_id}", params=params, timeout=30)
        if r.status_code != 503 or time.monotonic() > deadline:
            break
        assert r.json().get("code") == "store.behind", r.text
    assert r.status_code == 200, r.text
    return dict(r.json())


def run_step(run: dict[str, Any], step_id: str) -> dict[str, Any]:
    """One step of a run's detail."""
    return next(s for s in run["steps"] if s["step_id"] == step_id)


def finished_run(url: str, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """The run's detail once it has finished (succeeded, failed or cancelled).

    A 404 is waited out as a run still running is: the run was acknowledged,
    and a read without ``min_seq`` may come before the store has it (under
    load, as with pytest-xdist, it does). Any other answer fails at once.
    """
    from process_support import wait_for

    done = ("succeeded", "failed", "cancelled")

    def finished() -> dict[str, Any] | None:
        r = httpx.get(f"{url}/api/runs/{run_id}", timeout=30)
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        run = dict(r.json())
        return run if run["status"] in done else None

    return wait_for(finished, timeout, f"run {run_id} to finish")
