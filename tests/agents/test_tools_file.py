"""file.read / file.write: round trips, and every way out of the workspace refused."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading

import pytest

from tiffany.agents.tools.file import FileReadTool, FileWriteTool
from tiffany.agents.tools.workspace import FileDenied, FileNotFound

READ, WRITE = FileReadTool(), FileWriteTool()


def test_write_then_read_round_trip_creates_parent_dirs(run_tool, make_ctx, workspace):
    ctx = make_ctx()
    text = "héllo\nworld\n"
    out = run_tool(WRITE, {"path": "a/b/c.txt", "content": text}, ctx)
    assert out == {"path": "a/b/c.txt", "bytes": len(text.encode())}
    assert (workspace / "a" / "b" / "c.txt").read_text(encoding="utf-8") == text
    got = run_tool(READ, {"path": "a/b/c.txt"}, ctx)
    assert got == {"content": text, "bytes": len(text.encode()), "truncated": False}


def test_write_replaces_and_append_appends(run_tool, make_ctx, workspace):
    ctx = make_ctx()
    run_tool(WRITE, {"path": "log.txt", "content": "a long first line\n"}, ctx)
    run_tool(WRITE, {"path": "log.txt", "content": "one\n"}, ctx)
    run_tool(WRITE, {"path": "log.txt", "content": "two\n", "mode": "a"}, ctx)
    assert (workspace / "log.txt").read_text() == "one\ntwo\n"


def test_read_is_capped(run_tool, make_ctx, workspace):
    (workspace / "big.txt").write_bytes(b"x" * 100)
    out = run_tool(READ, {"path": "big.txt", "max_bytes": 10}, make_ctx())
    assert out == {"content": "x" * 10, "bytes": 10, "truncated": True}
    # the operator's cap is a ceiling the plan cannot raise
    out = run_tool(READ, {"path": "big.txt", "max_bytes": 1000}, make_ctx(max_output_bytes=50))
    assert out["bytes"] == 50
    assert out["truncated"]


def test_missing_file_is_not_found(run_tool, make_ctx):
    with pytest.raises(FileNotFound) as info:
        run_tool(READ, {"path": "nope/x.txt"}, make_ctx())
    assert info.value.code == "tool.file.not_found"


def test_a_workspace_not_made_yet_reads_as_empty_and_the_first_write_makes_it(
    run_tool, make_ctx, tmp_path
):
    # The worker hands a step the workspace's path alone (agents/worker.py):
    # a run whose steps never wrote has no directory.
    ws = tmp_path / "workspaces" / "run-1"
    ctx = dataclasses.replace(make_ctx(), workspace=ws)
    with pytest.raises(FileNotFound) as info:
        run_tool(READ, {"path": "notes.md"}, ctx)
    assert info.value.code == "tool.file.not_found"
    assert not ws.exists()  # a read makes nothing
    run_tool(WRITE, {"path": "d/notes.md", "content": "hi"}, ctx)
    assert (ws / "d" / "notes.md").read_text() == "hi"
    assert ws.stat().st_mode & 0o777 == 0o755 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    "path",
    ["../outside.txt", "a/../../outside.txt", "..", "/etc/passwd", "~/outside.txt", "x\x00y", "."],
)
def test_traversal_is_denied_for_read_and_write(run_tool, make_ctx, workspace, path):
    ctx = make_ctx()
    outside = workspace.parent / "outside.txt"
    outside.write_text("secret")
    with pytest.raises(FileDenied) as info:
        run_tool(READ, {"path": path}, ctx)
    assert info.value.code == "tool.file.denied"
    with pytest.raises(FileDenied):
        run_tool(WRITE, {"path": path, "content": "pwned"}, ctx)
    assert outside.read_text() == "secret"


def test_percent_encoded_dots_are_a_plain_name_inside(run_tool, make_ctx, workspace):
    run_tool(WRITE, {"path": "..%2fx", "content": "ok"}, make_ctx())
    assert (workspace / "..%2fx").read_text() == "ok"
    assert not (workspace.parent / "x").exists()


def test_symlinked_directory_to_etc_is_denied(run_tool, make_ctx, workspace):
    (workspace / "etc").symlink_to("/etc")
    ctx = make_ctx()
    with pytest.raises(FileDenied):
        run_tool(READ, {"path": "etc/passwd"}, ctx)
    with pytest.raises(FileDenied):
        run_tool(WRITE, {"path": "etc/tiffany-pwned", "content": "x"}, ctx)
    assert not os.path.exists("/etc/tiffany-pwned")


def test_symlinked_file_is_denied_even_when_pointing_inside(run_tool, make_ctx, workspace):
    (workspace / "pw").symlink_to("/etc/passwd")
    (workspace / "real.txt").write_text("inside")
    (workspace / "alias.txt").symlink_to(workspace / "real.txt")
    ctx = make_ctx()
    for path in ("pw", "alias.txt"):
        with pytest.raises(FileDenied):
            run_tool(READ, {"path": path}, ctx)
    with pytest.raises(FileDenied):
        run_tool(WRITE, {"path": "alias.txt", "content": "x"}, ctx)
    assert (workspace / "real.txt").read_text() == "inside"


def test_dangling_symlink_is_not_followed_on_create(run_tool, make_ctx, workspace):
    target = workspace.parent / "created-through-link"
    (workspace / "new").symlink_to(target)
    with pytest.raises(FileDenied):
        run_tool(WRITE, {"path": "new", "content": "x"}, make_ctx())
    with pytest.raises(FileDenied):
        run_tool(WRITE, {"path": "new/f.txt", "content": "x"}, make_ctx())
    assert not target.exists()


def test_hard_links_fifos_and_directories_are_denied(run_tool, make_ctx, workspace):
    (workspace / "a.txt").write_text("a")
    os.link(workspace / "a.txt", workspace / "b.txt")
    os.mkfifo(workspace / "fifo")
    (workspace / "dir").mkdir()
    ctx = make_ctx()
    for path in ("b.txt", "fifo", "dir"):
        with pytest.raises(FileDenied):
            run_tool(READ, {"path": path}, ctx)
    with pytest.raises(FileDenied):
        run_tool(WRITE, {"path": "b.txt", "content": "overwritten"}, ctx)
    assert (workspace / "a.txt").read_text() == "a"  # not truncated by the refused write


def test_symlink_swapped_during_calls_never_lets_a_write_out(make_ctx, workspace):
    """Reliability row 24: a racing thread flips ``d`` between a directory and a symlink."""
    outside = workspace.parent / "outside"
    outside.mkdir()
    d = workspace / "d"
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for step in (
                lambda: (d / "f.txt").unlink(),
                lambda: os.rmdir(d),
                lambda: d.symlink_to(outside),
                lambda: d.unlink(),
            ):
                with contextlib.suppress(OSError):
                    step()

    ctx = make_ctx()
    args = FileWriteTool.Args.model_validate({"path": "d/f.txt", "content": "x"})
    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes = set()
    try:
        for _ in range(2000):
            try:
                WRITE.run(args, ctx)
                outcomes.add("written")
            except (FileDenied, FileNotFound) as exc:
                outcomes.add(exc.code)
            except OSError:  # the directory vanished under the open descriptor
                outcomes.add("oserror")
    finally:
        stop.set()
        flipper.join()
    assert list(outside.iterdir()) == []
    assert "tool.file.denied" in outcomes  # the race was really exercised


def test_args_reject_unknown_fields_and_bad_mode():
    with pytest.raises(ValueError, match="extra"):
        FileWriteTool.Args.model_validate({"path": "a", "content": "", "bogus": 1})
    with pytest.raises(ValueError, match="mode"):
        FileWriteTool.Args.model_validate({"path": "a", "content": "", "mode": "x"})
