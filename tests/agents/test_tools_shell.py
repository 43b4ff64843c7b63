"""The shell tool: real subprocesses, kill on cancel, live output, and the bubblewrap sandbox."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from tiffany.agents.tools import live_output, shell
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


def test_a_workspace_not_made_yet_is_made_for_the_command(run_tool, make_ctx, tmp_path):
    ws = tmp_path / "workspaces" / "run-1"  # no step of the run wrote there yet
    ctx = dataclasses.replace(make_ctx(shell_sandbox="none"), workspace=ws)
    out = run_tool(SH, {"argv": ["sh", "-c", "pwd; echo x > made.txt"]}, ctx)
    assert out["stdout"].strip() == os.path.realpath(ws)
    assert (ws / "made.txt").read_text() == "x\n"


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


# -- live output ------------------------------------------------------------------

#: One line, half a second of nothing, another line.
TWO_LINES = ["sh", "-c", "echo one; sleep 0.5; echo two"]


def _timed(ctx):
    """``ctx`` whose events are recorded with the monotonic time they were emitted at."""
    got: list[tuple[float, str, dict]] = []
    emit = lambda kind, data: got.append((time.monotonic(), kind, dict(data)))  # noqa: E731
    return dataclasses.replace(ctx, emit=emit), got


def _lines(got, stream="stdout"):
    """The (time, data) of the text events of ``stream``."""
    return [(t, d) for t, k, d in got if k == "tool.output" and d.get("stream") == stream]


def _first_line_comes_before_the_end(run_tool, ctx):
    ctx, got = _timed(ctx)
    out = run_tool(SH, {"argv": TWO_LINES}, ctx)
    ended = time.monotonic()
    # the result is what it always was: no trace of the live view
    assert out == {
        "exit_code": 0,
        "stdout": "one\ntwo\n",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
    }
    (t1, one), (t2, two) = _lines(got)
    assert one == {"tool": "shell", "stream": "stdout", "text": "one", "partial": False}
    assert two["text"] == "two"
    # "one" was published while the command slept, not when it ended
    assert t2 - t1 >= 0.4
    assert ended - t1 >= 0.4


def test_each_line_is_published_while_the_command_runs(run_tool, make_ctx):
    _first_line_comes_before_the_end(run_tool, make_ctx(shell_sandbox="none"))


def test_stderr_is_tagged_and_a_line_without_its_newline_is_flushed(run_tool, make_ctx):
    ctx, got = _timed(make_ctx(shell_sandbox="none"))
    script = "printf 'half'; sleep 0.6; echo ' done'; echo oops >&2; printf 'no newline'"
    started = time.monotonic()
    out = run_tool(SH, {"argv": ["sh", "-c", script]}, ctx)
    assert out["stdout"] == "half done\nno newline"
    assert out["stderr"] == "oops\n"
    (t_half, half), (t_done, done), (_, last) = _lines(got)
    assert half == {"tool": "shell", "stream": "stdout", "text": "half", "partial": True}
    # flushed LIVE_FLUSH_S after it came, long before its newline
    assert t_half - started >= live_output.LIVE_FLUSH_S
    assert t_done - t_half >= 0.3
    assert done == {"tool": "shell", "stream": "stdout", "text": " done", "partial": False}
    # the end of the stream ends its last line
    assert last == {"tool": "shell", "stream": "stdout", "text": "no newline", "partial": False}
    ((_, err),) = _lines(got, "stderr")
    assert err == {"tool": "shell", "stream": "stderr", "text": "oops", "partial": False}


def test_a_long_line_goes_out_in_pieces_that_keep_its_characters(run_tool, make_ctx):
    ctx, got = _timed(make_ctx(shell_sandbox="none"))
    line = "é" * 3000 + "x"  # 6,001 bytes: a cut in the middle of a character must not happen
    out = run_tool(SH, {"argv": ["printf", "%s\n", line]}, ctx)
    assert out["stdout"] == line + "\n"
    pieces = [d for _, d in _lines(got)]
    assert len(pieces) >= 6
    assert all(len(p["text"].encode()) <= live_output.LIVE_TEXT_BYTES for p in pieces)
    assert [p["partial"] for p in pieces] == [True] * (len(pieces) - 1) + [False]
    assert "".join(p["text"] for p in pieces) == line


def test_a_chatty_command_is_capped_and_says_what_it_held_back(run_tool, make_ctx):
    ctx, got = _timed(make_ctx(shell_sandbox="none"))
    out = run_tool(SH, {"argv": ["seq", "1", "20000"]}, ctx)
    assert out["stdout"] == "".join(f"{i}\n" for i in range(1, 20001))  # all of it
    shown = [d["text"] for _, d in _lines(got)]
    notices = [d for _, k, d in got if k == "tool.output" and "dropped_lines" in d]
    elapsed = got[-1][0] - got[0][0]
    cap = live_output.LIVE_EVENTS_BURST + live_output.LIVE_EVENTS_PER_S * elapsed + 1
    assert len(shown) <= cap
    assert shown[:3] == ["1", "2", "3"]  # the first lines get through
    assert notices, "no notice of the lines held back"
    assert all(n["level"] == "warning" and "not shown live" in n["message"] for n in notices)
    # every line is either shown or counted in a notice
    assert len(shown) + sum(n["dropped_lines"] for n in notices) == 20000


def test_the_cap_refills_with_time():
    now = [0.0]
    sent: list[dict] = []
    live = live_output.LiveOutput(
        lambda kind, data: sent.append(dict(data)), clock=lambda: now[0], rate=10, burst=5
    )
    live.feed("stdout", b"".join(b"%d\n" % i for i in range(8)))
    assert [d.get("text") for d in sent] == ["0", "1", "2", "3", "4"]
    now[0] += 0.25  # two and a half lines' worth
    live.feed("stdout", b"8\n9\n10\n")
    assert sent[5]["dropped_lines"] == 3  # 5, 6, 7: said before the next line shown
    assert [d.get("text") for d in sent[6:]] == ["8", "9"]
    live.flush(final=True)
    assert sent[-1]["dropped_lines"] == 1  # 10
    assert (live.published, live.dropped_total) == (7, 4)


def test_live_output_shows_no_more_than_the_result_keeps(run_tool, make_ctx):
    ctx, got = _timed(make_ctx(shell_sandbox="none"))
    args = {"argv": ["sh", "-c", "yes abc | head -n 1000"], "max_output_bytes": 42}
    out = run_tool(SH, args, ctx)
    assert out["stdout"] == "abc\n" * 10 + "ab"
    assert out["stdout_truncated"] is True
    assert [d["text"] for _, d in _lines(got)] == ["abc"] * 10 + ["ab"]


def test_a_broken_emit_does_not_fail_the_command(run_tool, make_ctx):
    def emit(kind, data):
        if "stream" in data:
            raise RuntimeError("feed is down")

    ctx = dataclasses.replace(make_ctx(shell_sandbox="none"), emit=emit)
    out = run_tool(SH, {"argv": TWO_LINES}, ctx)
    assert out["stdout"] == "one\ntwo\n"


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


def test_output_streams_from_the_sandbox_too(run_tool, sandboxed):
    _first_line_comes_before_the_end(run_tool, sandboxed)


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
