"""``tiffany serve`` as users run it: both processes, the demo plan, a crashed child, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from process_support import serve_argv
from process_support import wait_for as _wait


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _serve(data_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_LLM_")}
    env["TIFFANY_LOG_FORMAT"] = "json"
    proc = subprocess.Popen(
        serve_argv(data_dir, 0, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    ready = data_dir / "serve.json"
    _wait(lambda: ready.exists() or proc.poll() is not None, 60, "serve.json")
    assert proc.poll() is None, "serve exited while starting"
    url = json.loads(ready.read_text())["url"]
    return proc, url


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


def test_serve_runs_the_demo_survives_a_dead_engine_and_stops_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, url = _serve(data, "--demo")
    try:
        # Up means ready: the first client finds the projector reporting (no 503).
        try:
            ready = _get(url + "readyz")
        except urllib.error.HTTPError as exc:  # the reason, for whoever reads the failure
            raise AssertionError(f"readyz {exc.code} right after start: {exc.read()!r}") from exc
        assert ready["ready"] is True
        runs = _wait(lambda: _get(url + "api/runs?status=succeeded")["runs"], 30, "the demo run")
        assert runs[0]["name"] == "demo-research"
        detail = _get(url + f"api/runs/{runs[0]['run_id']}")
        assert {s["step_id"] for s in detail["steps"]} >= {"summarize", "report"}

        # The engine dies: serve starts it again, and the API finds it again.
        engine_pid = json.loads((data / "serve.json").read_text())["engine_pid"]
        os.kill(engine_pid, signal.SIGKILL)

        def new_engine() -> bool:
            out = subprocess.run(
                ["pgrep", "-P", str(proc.pid), "-f", "engine"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split()
            return bool(out) and int(out[0]) != engine_pid

        _wait(new_engine, 30, "serve to start a new engine")
        assert _wait(lambda: _get(url + "readyz")["ready"], 60, "the engine restarted")
        body = json.dumps(
            {"name": "after", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}
        )
        req = urllib.request.Request(
            url + "api/runs", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 201
    finally:
        code, out = _stop(proc)
    assert code == 0, out
    assert "stopped cleanly" in out
    assert "submitted the demo plan" in out
    # No model configured: the demo asked for the offline scripted one, and said so.
    assert "the demo's llm steps use the offline scripted provider" in out
    assert not (data / "serve.json").exists()
    assert not (data / "control.sock").exists()

    # Everything is still there at the next start, and `--demo` (`make run` again)
    # submits no second demo run: it names the first.
    proc, url = _serve(data, "--demo")
    try:
        names = _wait(
            lambda: (
                {r["name"] for r in _get(url + "api/runs")["runs"]} >= {"demo-research", "after"}
            ),
            30,
            "both runs",
        )
        assert names
        demos = [r for r in _get(url + "api/runs")["runs"] if r["name"] == "demo-research"]
    finally:
        code, out = _stop(proc)
    assert code == 0, out
    assert [r["run_id"] for r in demos] == [runs[0]["run_id"]]
    assert f"the demo plan ran here already: run {runs[0]['run_id']}" in out


def test_serve_on_a_taken_port_says_so_before_starting_anything(tmp_path: Path) -> None:
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    data_dir = tmp_path / "data"
    try:
        proc = subprocess.run(
            serve_argv(data_dir, port),
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")},
            check=False,
        )
    finally:
        holder.close()
    assert proc.returncode == 2, proc.stderr  # usage (docs/cli.md, "Exit codes")
    assert proc.stderr.strip() == (
        f"tiffany: the API's address 127.0.0.1:{port} is in use (another server is "
        "listening there); pick another with --port"
    )
    assert not (data_dir / "wal").exists()  # no engine was started
