"""The example plans, a plan crashed with kill -9 and recovered, and cancellation."""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from plan_crash_child import run_child

from tiffany.agents import load_plan
from tiffany.agents.registry import ToolRegistry
from tiffany.config import Settings
from tiffany.durable import verify
from tiffany.engine import build, replay_resolvers
from tiffany.kernel import Sleep

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HERE = Path(__file__).resolve().parent


def _engine(data_dir: Path, **kw):
    # the docs server is on 127.0.0.1, which the http tool's egress policy refuses unless
    # allowed; the llm steps ask for the offline scripted model, as README's commands do
    settings = Settings(data_dir=data_dir, http_allow=["127.0.0.1"], llm_model="scripted")
    return build(settings, enabled_tools=ToolRegistry.default().all_names(), **kw)


@pytest.fixture
def docs_server():
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(EXAMPLES / "research" / "docs"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("name", ["research", "build", "dynamic"])
def test_each_example_runs_offline_and_replays_identically(tmp_path, name, docs_server):
    doc = load_plan(EXAMPLES / name / "plan.yaml")
    inputs = {"base_url": docs_server} if name == "research" else {}
    engine = _engine(tmp_path)
    with engine.runtime as rt:
        run_id = engine.submit_plan(doc, inputs)
        rt.run()
        state = rt.status(run_id)
    assert state.status == "succeeded", state.error
    assert all(s["status"] == "succeeded" for s in state.result["steps"].values())
    if name == "build":
        assert state.result["outputs"]["tests"] == "wordcount: ok\n"
        attempts = state.result["steps"]["flaky_integration"]["attempts"]
        assert [a["ok"] for a in attempts] == [False, True]
    if name == "dynamic":
        assert {"plan_write", "plan_check"} <= set(state.result["steps"])
    if name == "research":
        assert "cooperative" in state.result["outputs"]["summary"]
    report = verify(tmp_path, run_id, resolvers=replay_resolvers(Settings(data_dir=tmp_path)))
    assert report.ok, report.to_dict()


def test_replay_verify_cli_on_an_example(tmp_path):
    engine = _engine(tmp_path)
    with engine.runtime as rt:
        run_id = engine.submit_plan(load_plan(EXAMPLES / "dynamic" / "plan.yaml"))
        rt.run()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiffany",
            "--data-dir",
            str(tmp_path),
            "replay",
            run_id,
            "--verify",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "replays identically" in proc.stdout


def _crash_plan(log: Path) -> dict:
    steps = []
    for i in range(6):
        steps.append(
            {
                "id": f"s{i}",
                "tool": "shell",
                "args": {"argv": ["sh", "-c", f"echo s{i} >> {log}"]},
                **({"after": [f"s{i - 1}"]} if i else {}),
            }
        )
        steps.append(
            {"id": f"nap{i}", "tool": "sleep", "args": {"seconds": 0.01}, "after": [f"s{i}"]}
        )
    return {"name": "crashy", "steps": steps}


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [40, 90, 140, 200])
def test_a_plan_killed_mid_run_recovers_without_rerunning_completed_steps(tmp_path, kill_at):
    log = tmp_path / "effects.log"
    plan = _crash_plan(log)
    env = dict(os.environ, TIFFANY_SHELL_SANDBOX="none")
    child = run_child(tmp_path / "data", plan, kill_at, env=env)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    before = Counter(log.read_text().split()) if log.exists() else Counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiffany",
            "--data-dir",
            str(tmp_path / "data"),
            "replay",
            "plan-run",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["status"] == "succeeded"
    after = Counter(log.read_text().split())
    assert sorted(after) == [f"s{i}" for i in range(6)]
    # a step completed before the crash ran once; at most the one in flight ran twice
    assert sum(after.values()) - 6 <= 1, after
    for line, n in before.items():
        assert after[line] <= n + 1
    assert verify(
        tmp_path / "data",
        "plan-run",
        resolvers=replay_resolvers(Settings(data_dir=tmp_path / "data")),
    ).ok


def test_cancelling_a_running_plan_kills_its_subprocesses(tmp_path):
    plan = {
        "name": "long",
        "steps": [
            {
                "id": "forever",
                "tool": "shell",
                "args": {"argv": ["sh", "-c", "echo $$ > pid; exec sleep 60"]},
            }
        ],
    }
    found: dict[str, int] = {}

    def canceller():  # a task outside the run, as the engine's control channel would be
        pidfile = tmp_path / "data" / "workspaces" / run_id / "pid"
        while not (pidfile.exists() and pidfile.read_text().strip()):
            yield Sleep(0.02)
        found["pid"] = int(pidfile.read_text())
        engine.runtime.journal.request_cancel(run_id, "test")

    # no sandbox: the shell's $$ is then the host's pid of the process to watch
    engine = build(
        Settings(data_dir=tmp_path / "data", shell_sandbox="none"),
        enabled_tools=ToolRegistry.default().all_names(),
    )
    started = time.monotonic()
    with engine.runtime as rt:
        run_id = engine.submit_plan(plan)
        rt.sched.spawn(canceller())
        rt.run()
        state = rt.status(run_id)
    assert state.status == "cancelled"
    assert time.monotonic() - started < 10
    status = Path(f"/proc/{found['pid']}/status")

    def gone() -> bool:
        try:
            return "State:\tZ" in status.read_text()
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone(), f"sleep {found['pid']} survived its run's cancellation"
