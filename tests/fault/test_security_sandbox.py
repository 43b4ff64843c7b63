"""The shell sandbox on a server: real bubblewrap, real engine process (finding 4).

A shell step of a real ``tiffany engine`` cannot read the engine's
environment (its token, the LLM key) from ``/proc``, cannot write outside
its workspace, has no network, sees its own ``/proc``; a fork bomb and a
memory hog are stopped although we run as root. A server whose ``auto``
sandbox cannot work refuses shell steps (naming the fix); with ``none`` it
runs them and says so in ``status``.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tiffany.agents.tools import shell
from tiffany.agents.tools.base import ToolContext
from tiffany.agents.tools.shell import SandboxUnavailable, ShellTool
from tiffany.config import Settings
from tiffany.engine import tool_settings
from tiffany.kernel import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_process import EngineProc

SH = ShellTool()
API_TOKEN = "api-token-0b8e2d4f6a"
LLM_KEY = "llm-key-5e7a9c1b3d"


def _run(ctx: ToolContext, args: dict[str, Any]) -> Any:
    """Run the shell tool once on a real scheduler; return its result or raise its error."""
    parsed = ShellTool.Args.model_validate(args)

    def body() -> Any:
        try:
            return True, (yield SH.run(parsed, ctx))
        except Exception as exc:
            return False, exc

    with Scheduler() as sched:
        tid = sched.spawn(body(), name="tool:shell")
        sched.run()
        ok, value = sched.result(tid)
    if not ok:
        raise value
    return value


def _server_ctx(workspace: Path, **settings: Any) -> ToolContext:
    """A context with the tool settings a server's engine builds (``server=True``)."""
    tools = tool_settings(Settings(data_dir=workspace.parent / "data", **settings), server=True)
    return ToolContext(run_id="r", step_id="s", attempt=1, workspace=workspace, settings=tools)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def _wait_file(path: Path, timeout: float, engine: EngineProc) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} never appeared:\n{engine.log()[-3000:]}")
        time.sleep(0.05)
    return path.read_text()


PROBE_PLAN = {
    "name": "probe",
    "steps": [
        {
            "id": "probe",
            "tool": "shell",
            "args": {
                "argv": [
                    "sh",
                    "-c",
                    "cat /proc/[0-9]*/environ > env.txt 2>/dev/null; env >> env.txt; "
                    "ls /proc | grep -c '^[0-9]' > procs.txt; "
                    "echo x > " + "{outside} 2>/dev/null; echo done > done.txt",
                ],
                "check": False,
            },
        }
    ],
}


def test_a_served_shell_step_cannot_see_the_engines_secrets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    outside = tmp_path / "escaped.txt"
    env = {
        **os.environ,
        "TIFFANY_LOG_FORMAT": "json",
        "TIFFANY_ENABLED_TOOLS": "shell",
        "TIFFANY_SHELL_SANDBOX": "auto",
        "TIFFANY_API_TOKEN": API_TOKEN,  # the worst case: an engine started with both
        "TIFFANY_LLM_API_KEY": LLM_KEY,
    }
    plan = dict(PROBE_PLAN)
    step = dict(plan["steps"][0])  # type: ignore[index]
    args = dict(step["args"])
    args["argv"] = [*args["argv"][:2], args["argv"][2].replace("{outside}", str(outside))]
    step["args"] = args
    plan["steps"] = [step]
    engine = EngineProc(data, env=env)
    try:
        status = engine.wait_ready()
        assert status["shell_sandbox"] == "auto"
        run_id = engine.call("submit", plan=plan, inputs={}, key=None)["run_id"]
        ws = data / "workspaces" / run_id
        _wait_file(ws / "done.txt", 60, engine)
        seen = (ws / "env.txt").read_text()
        assert API_TOKEN not in seen
        assert LLM_KEY not in seen
        assert "TIFFANY_" not in seen  # the allowlisted environment only
        assert int((ws / "procs.txt").read_text()) < 10  # its own pid namespace
        assert not outside.exists()
    finally:
        engine.stop()


def test_an_unsandboxed_server_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "TIFFANY_LOG_FORMAT": "json", "TIFFANY_SHELL_SANDBOX": "none"}
    engine = EngineProc(tmp_path / "data", env=env)
    try:
        assert engine.wait_ready()["shell_sandbox"] == "none (UNSANDBOXED)"
    finally:
        engine.stop()
    assert "engine.shell_unsandboxed" in engine.log()


def test_a_server_without_bubblewrap_refuses_shell_steps(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    args = {"argv": ["/bin/sh", "-c", "echo ran > ran.txt"]}
    with pytest.raises(SandboxUnavailable) as info:
        _run(_server_ctx(workspace, shell_sandbox="auto"), args)
    assert info.value.code == "tool.shell.sandbox"
    assert "bubblewrap" in info.value.message
    assert "TIFFANY_SHELL_SANDBOX=none" in info.value.message
    assert not (workspace / "ran.txt").exists()
    # "none", on purpose: it runs
    _run(_server_ctx(workspace, shell_sandbox="none"), args)
    assert (workspace / "ran.txt").read_text() == "ran\n"


@pytest.fixture
def sandboxed(workspace: Path) -> ToolContext:
    if shutil.which("bwrap") is None and os.environ.get("TIFFANY_REQUIRE_SERVICES") != "1":
        pytest.skip("bubblewrap is not installed")
    return _server_ctx(workspace, shell_sandbox="auto")


def test_no_network_and_a_read_only_system(sandboxed: ToolContext, tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        script = (
            f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo connected; "
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\" "
            "2>/dev/null && echo connected; "
            f"echo x > {tmp_path}/out.txt; touch /usr/pwned; echo y > /etc/pwned; id -u"
        )
        out = _run(sandboxed, {"argv": ["sh", "-c", script], "check": False})
    assert "connected" not in out["stdout"]
    assert not (tmp_path / "out.txt").exists()
    assert not os.path.exists("/usr/pwned")
    assert not os.path.exists("/etc/pwned")


def test_own_proc(sandboxed: ToolContext) -> None:
    out = _run(sandboxed, {"argv": ["sh", "-c", "echo $$; ls /proc | grep -c '^[0-9]'"]})
    mine, count = out["stdout"].split()
    assert int(mine) < 10
    assert int(count) < 10
    assert str(os.getpid()) not in out["stdout"]


def test_a_fork_bomb_is_stopped(sandboxed: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell, "SANDBOX_NPROC", 20)
    # 60 background sleepers: more than the step may have
    script = "i=0; while [ $i -lt 60 ]; do sleep 30 & i=$((i+1)); done; echo all-started"
    out = _run(sandboxed, {"argv": ["sh", "-c", script], "check": False})
    assert "all-started" not in out["stdout"]
    assert "fork" in out["stderr"].lower()


def test_a_memory_hog_is_stopped(sandboxed: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3 to run inside the sandbox")
    monkeypatch.setattr(shell, "SANDBOX_AS_BYTES", 256 << 20)
    code = "x = bytearray(1 << 30); print('allocated')"
    out = _run(sandboxed, {"argv": [python, "-c", code], "check": False})
    assert "allocated" not in out["stdout"]
    assert "MemoryError" in out["stderr"]
