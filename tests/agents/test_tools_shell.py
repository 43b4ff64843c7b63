"""The shell tool: real subprocesses, kill on cancel, and the bubblewrap sandbox."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from tiffany.agents.tools import shell
from tiffany.agents.tools.shell import CommandNotFound, SandboxUnavailable, ShellExit, ShellTool
from tiffany.agents.tools.workspace import FileDenied, FileNotFound
from tiffany.errors import TaskKilled
from tiffany.kernel import KillTask, NewTask, Scheduler, Sleep, Step, WaitTask

SH = ShellTool()


def _state(pid: int) -> str | None:
    """Return the process state letter from /proc (None when the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


# -- plain runs (no sandbox) ----------------------------------------------------


def test_output_and_exit_code(run_tool, make_ctx):
    out = run_tool(
        SH, {"argv": ["sh", "-c", "echo out; echo err >&2"]}, make_ctx(shell_sandbox="none")
    )
    assert out == {
        "exit_code": 0,
        "stdout": "out\n",
        "stderr": "err\n",
        "stdout_truncated": False,
        "stderr_truncated": False,
    }


def test_non_zero_exit_raises_with_the_result_unless_check_is_false(run_tool, make_ctx):
    ctx = make_ctx(shell_sandbox="none")
    with pytest.raises(ShellExit) as info:
        run_tool(SH, {"argv": ["sh", "-c", "echo nope >&2; exit 3"]}, ctx)
    assert info.value.code == "tool.shell.exit"
    assert info.value.fields["exit_code"] == 3
    assert info.value.fields["stderr"] == "nope\n"
    out = run_tool(SH, {"argv": ["sh", "-c", "exit 4"], "check": False}, ctx)
    assert out["exit_code"] == 4


def test_argv_is_not_a_shell_string(run_tool, make_ctx):
    out = run_tool(SH, {"argv": ["echo", "$HOME; rm -rf /"]}, make_ctx(shell_sandbox="none"))
    assert out["stdout"] == "$HOME; rm -rf /\n"


def test_stdin_is_fed(run_tool, make_ctx):
    out = run_tool(SH, {"argv": ["wc", "-c"], "stdin": "héllo"}, make_ctx(shell_sandbox="none"))
    assert out["stdout"].strip() == str(len("héllo".encode()))


def test_env_is_the_allowlist_plus_the_step_env(run_tool, make_ctx, monkeypatch):
    monkeypatch.setenv("TIFFANY_TEST_SECRET", "s3cret")
    monkeypatch.setenv("TIFFANY_TEST_OK", "fine")
    monkeypatch.setenv("TIFFANY_TEST_OVER", "parent")
    ctx = make_ctx(
        shell_sandbox="none",
        env_allowlist=("PATH", "TIFFANY_TEST_OK", "TIFFANY_TEST_OVER", "TIFFANY_TEST_UNSET"),
    )
    args = {"argv": ["env"], "env": {"EXTRA": "1", "TIFFANY_TEST_OVER": "step"}}
    lines = set(run_tool(SH, args, ctx)["stdout"].splitlines())
    assert "TIFFANY_TEST_OK=fine" in lines
    assert "TIFFANY_TEST_OVER=step" in lines
    assert "EXTRA=1" in lines
    assert not any(
        line.startswith(("TIFFANY_TEST_SECRET=", "TIFFANY_TEST_UNSET=")) for line in lines
    )
    names = {line.split("=", 1)[0] for line in lines}
    assert names <= {"PATH", "TIFFANY_TEST_OK", "TIFFANY_TEST_OVER", "EXTRA", "PWD", "SHLVL", "_"}


def test_output_is_capped_per_stream(run_tool, make_ctx):
    ctx = make_ctx(shell_sandbox="none")
    args = {"argv": ["sh", "-c", "head -c 100000 /dev/zero; echo e >&2"], "max_output_bytes": 1000}
    out = run_tool(SH, args, ctx)
    assert len(out["stdout"]) == 1000
    assert out["stdout_truncated"] is True
    assert out["stderr"] == "e\n"
    assert out["stderr_truncated"] is False
    # the operator's setting is a ceiling
    args["max_output_bytes"] = 50_000
    out = run_tool(SH, args, make_ctx(shell_sandbox="none", max_output_bytes=200))
    assert len(out["stdout"]) == 200


def test_cwd_is_confined_to_the_workspace(run_tool, make_ctx, workspace):
    ctx = make_ctx(shell_sandbox="none")
    (workspace / "sub").mkdir()
    out = run_tool(SH, {"argv": ["pwd"], "cwd": "sub"}, ctx)
    assert out["stdout"].strip() == os.path.realpath(workspace / "sub")
    assert run_tool(SH, {"argv": ["pwd"]}, ctx)["stdout"].strip() == os.path.realpath(workspace)
    (workspace / "etc").symlink_to("/etc")
    for cwd in ("..", "sub/../..", "/tmp", "etc"):
        with pytest.raises(FileDenied):
            run_tool(SH, {"argv": ["pwd"], "cwd": cwd}, ctx)
    with pytest.raises(FileNotFound):
        run_tool(SH, {"argv": ["pwd"], "cwd": "missing"}, ctx)


def test_missing_command_and_bad_args(run_tool, make_ctx):
    with pytest.raises(CommandNotFound) as info:
        run_tool(SH, {"argv": ["tiffany-no-such-command"]}, make_ctx(shell_sandbox="none"))
    assert info.value.code == "tool.shell.not_found"
    for bad in ({"argv": []}, {"argv": [""]}, {"argv": "ls -l"}, {"argv": ["a\x00b"]}):
        with pytest.raises(ValueError, match="argv"):
            ShellTool.Args.model_validate(bad)


@pytest.mark.parametrize("flavour", ["step", "direct"])
def test_cancel_kills_the_process_group_and_reaps_the_child(make_ctx, events, workspace, flavour):
    """A killed tool task leaves no process behind (the worker's timeout path)."""
    ctx = make_ctx(shell_sandbox="none")
    args = ShellTool.Args.model_validate(
        {"argv": ["sh", "-c", "sleep 30 & echo $! > bg.pid; wait"]}
    )

    def tool_task():
        if flavour == "step":
            return (yield Step(SH.run, args, ctx))
        return (yield SH.run(args, ctx))

    outcome = {}

    def controller():
        tid = yield NewTask(tool_task(), name="tool")
        for _ in range(500):
            if (workspace / "bg.pid").exists() and (workspace / "bg.pid").read_text().strip():
                break
            yield Sleep(0.01)
        yield KillTask(tid)
        try:
            yield WaitTask(tid)
        except TaskKilled:
            outcome["killed"] = True

    with Scheduler() as sched:
        sched.spawn(controller())
        sched.run()
    assert outcome == {"killed": True}
    (pid,) = [data["pid"] for kind, data in events if kind == "tool.output" and "pid" in data]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not a zombie
    bg = int((workspace / "bg.pid").read_text())
    # the grandchild dies with the group; SIGKILL lands asynchronously, so give
    # the kernel a moment to deliver it before looking
    deadline = time.monotonic() + 5
    while _state(bg) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(bg) in (None, "Z")


# -- the sandbox ----------------------------------------------------------------


@pytest.fixture
def sandboxed(run_tool, make_ctx):
    """A context that requires bubblewrap (skips, or fails under CI, when it cannot work)."""
    ctx = make_ctx(shell_sandbox="bwrap")
    try:
        run_tool(SH, {"argv": ["true"]}, ctx)
    except SandboxUnavailable as exc:
        if os.environ.get("TIFFANY_REQUIRE_SERVICES", "").strip() == "1":
            pytest.fail(f"bubblewrap is required here: {exc}")
        pytest.skip(f"bubblewrap unavailable: {exc}")
    return ctx


def _system_python() -> str:
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3 to run inside the sandbox")
    return python


def test_sandbox_has_no_network(run_tool, make_ctx, sandboxed):
    python = _system_python()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        args = {"argv": [python, "-c", code], "check": False}
        direct = run_tool(SH, args, make_ctx(shell_sandbox="none"))
        assert direct["exit_code"] == 0, direct  # the listener is reachable from the host...
        inside = run_tool(SH, args, sandboxed)
        assert inside["exit_code"] != 0  # ...but not from inside
        assert "Error" in inside["stderr"]


def test_sandbox_sees_only_the_workspace(run_tool, sandboxed, workspace, tmp_path):
    (tmp_path / "outside.txt").write_text("host secret")
    script = (
        "cat ../outside.txt; echo hi > ../escaped.txt; echo ok > inside.txt; "
        "ls /etc; touch /usr/tiffany-pwned; ls /"
    )
    out = run_tool(SH, {"argv": ["sh", "-c", script], "check": False}, sandboxed)
    assert "host secret" not in out["stdout"]
    assert not (tmp_path / "escaped.txt").exists()
    assert (workspace / "inside.txt").read_text() == "ok\n"
    assert "os-release" not in out["stdout"]  # a minimal /etc
    assert "Read-only file system" in out["stderr"]
    assert not os.path.exists("/usr/tiffany-pwned")


def test_sandbox_limits_file_size(run_tool, sandboxed, workspace, monkeypatch):
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    monkeypatch.setattr(shell, "SANDBOX_FSIZE_BYTES", 100_000)
    args = {"argv": ["sh", "-c", "head -c 300000 /dev/zero > big.bin"], "check": False}
    out = run_tool(SH, args, sandboxed)
    assert out["exit_code"] != 0
    assert (workspace / "big.bin").stat().st_size <= 100_000


def test_auto_uses_the_sandbox_when_it_works(run_tool, make_ctx, events, sandboxed):
    out = run_tool(SH, {"argv": ["ls", "/etc"]}, make_ctx(shell_sandbox="auto"))
    assert "os-release" not in out["stdout"]
    assert [d["sandbox"] for k, d in events if k == "tool.output" and "pid" in d][-1] is True


def test_required_sandbox_fails_closed_without_bwrap(
    run_tool, make_ctx, events, workspace, tmp_path, monkeypatch
):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    args = {"argv": ["/bin/sh", "-c", "echo ran > ran.txt"]}
    with pytest.raises(SandboxUnavailable) as info:
        run_tool(SH, args, make_ctx(shell_sandbox="bwrap"))
    assert info.value.code == "tool.shell.sandbox"
    assert "not installed" in info.value.message
    assert not (workspace / "ran.txt").exists()
    # "auto" fails closed too, naming the fix...
    with pytest.raises(SandboxUnavailable, match="TIFFANY_SHELL_SANDBOX=none"):
        run_tool(SH, args, make_ctx(shell_sandbox="auto"))
    assert not (workspace / "ran.txt").exists()
    # ...but with the fallback (``tiffany run`` only) runs unsandboxed, and says so
    run_tool(SH, args, make_ctx(shell_sandbox="auto", shell_fallback=True))
    assert (workspace / "ran.txt").exists()
    assert any(
        k == "tool.output" and d["level"] == "warning" and "unsandboxed" in d["message"]
        for k, d in events
    )


def test_a_bwrap_that_cannot_sandbox_here_fails_the_probe(
    run_tool, make_ctx, events, workspace, tmp_path, monkeypatch
):
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create namespace' >&2\nexit 1\n"
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    monkeypatch.setattr(shell, "_PROBES", {})
    args = {"argv": ["sh", "-c", "echo ran > ran.txt"]}
    with pytest.raises(SandboxUnavailable, match="No permissions"):
        run_tool(SH, args, make_ctx(shell_sandbox="bwrap"))
    assert not (workspace / "ran.txt").exists()
    run_tool(SH, args, make_ctx(shell_sandbox="auto", shell_fallback=True))
    assert (workspace / "ran.txt").exists()
    assert {
        str(fake / "bwrap"): "exit 1: bwrap: No permissions to create namespace"
    } == shell._PROBES


def test_unknown_sandbox_mode_is_refused(run_tool, make_ctx):
    with pytest.raises(SandboxUnavailable, match="unknown"):
        run_tool(SH, {"argv": ["true"]}, make_ctx(shell_sandbox="docker"))


def test_bwrap_argv_binds_the_workspace_after_tmp(tmp_path):
    ws = tmp_path / "ws"
    argv = shell.bwrap_argv("/usr/bin/bwrap", ws, ws / "sub", ["echo", "x"])
    assert argv[0] == "/usr/bin/bwrap"
    assert argv[-2:] == ["echo", "x"]
    assert {"--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session"} <= set(argv)
    assert argv.index("--tmpfs") < argv.index("--bind")
    i = argv.index("--bind")
    assert argv[i + 1 : i + 3] == [str(ws), str(ws)]
    assert argv[argv.index("--chdir") + 1] == str(ws / "sub")
    assert "/etc" not in [argv[j + 1] for j, a in enumerate(argv) if a == "--ro-bind"]
