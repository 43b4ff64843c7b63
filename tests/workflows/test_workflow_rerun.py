"""Re-run a workflow run from its failed call: a fork of its journal (``tiffany serve``).

The workflow makes three tool calls (python tools that append a line to a
count file each time they run); the second fails while a flag file is
missing. The re-run must not call the first again (its count stays 1), must
call the second and third, succeed, and verify identically. Over HTTP, the
SDK and the CLI, with the refusals named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sdk_support import Served, clean_env, serve, short_dir

from tiffany.sdk import Client
from tiffany.sdk.errors import NotFound

WF_MODULE = """
from pathlib import Path

from tiffany import workflow
from tiffany.agents.tools.python import python_tool
from tiffany.kernel import NewTask, Sleep, Step, WaitTask
from tiffany.workflows import child, signal, tool


def _count(where, tag):
    with open(Path(where) / f"{tag}.count", "a") as f:
        f.write("1\\n")


@python_tool("rr.count")
def count(where: str, tag: str) -> str:
    _count(where, tag)
    return tag


@python_tool("rr.gate")
def gate(where: str) -> str:
    _count(where, "gate")
    if not (Path(where) / "open").exists():
        raise RuntimeError("the gate is shut")
    return (Path(where) / "open").read_text()


@workflow("rr.three")
def three(where: str):
    a = yield tool("python", function="rr.count", kwargs={"where": where, "tag": "a"})
    yield Sleep(0.01)
    b = yield tool("python", function="rr.gate", kwargs={"where": where})
    c = yield tool("python", function="rr.count", kwargs={"where": where, "tag": "c"})
    return {"a": a, "b": b, "c": c}


def shaky(where):
    _count(where, "step")
    if not (Path(where) / "open").exists():
        raise RuntimeError("shut")
    return "ok"


@workflow("rr.step")
def with_a_step(where: str):
    a = yield tool("python", function="rr.count", kwargs={"where": where, "tag": "a"})
    b = yield Step(shaky, where)
    return {"a": a, "b": b}


@workflow("rr.drift")
def drift(where: str):
    # Reads a file outside a step (against the rules): the way a code change looks to a replay.
    tag = (Path(where) / "tag").read_text()
    a = yield tool("python", function="rr.count", kwargs={"where": where, "tag": tag})
    b = yield tool("python", function="rr.gate", kwargs={"where": where})
    return {"a": a, "b": b}


@workflow("rr.leaf")
def leaf(where: str):
    return {"leaf": (yield Step(_tagged, where, "leaf"))}


def _tagged(where, tag):
    _count(where, tag)
    return tag


def branch(where, tag):
    first = yield Step(_tagged, where, tag)
    yield Sleep(0.01)
    return first


@workflow("rr.tree")
def tree(where: str):
    kids = []
    for i in range(2):
        kids.append((yield NewTask(branch(where, f"b{i}"), name=f"b{i}")))
    done = []
    for k in kids:
        done.append((yield WaitTask(k)))
    sub = yield child("rr.leaf", {"where": where})
    gated = yield tool("python", function="rr.gate", kwargs={"where": where})
    return {"done": done, "sub": sub, "gated": gated}


@workflow("rr.wait")
def waits():
    got = yield signal("go")
    return {"got": got}


@workflow("rr.parent")
def parent():
    return {"child": (yield child("rr.wait", {}))}
"""


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    cwd = short_dir("tfr-")
    (cwd / "rrmod.py").write_text(WF_MODULE)
    srv = serve(cwd, "--import", "rrmod")
    yield srv
    srv.stop()


def _counts(where: Path) -> dict[str, int]:
    return {p.stem: len(p.read_text().splitlines()) for p in sorted(where.glob("*.count"))}


def _failed_once(client: Client, where: Path) -> str:
    where.mkdir()
    first = client.submit(workflow="rr.three", inputs={"where": str(where)})
    detail = first.wait(timeout=60)
    assert detail.status == "failed", detail
    assert "tool_2" in json.dumps(detail.error)
    assert _counts(where) == {"a": 1, "gate": 1}
    return first.run_id


def test_a_rerun_forks_the_journal_before_the_failed_call_and_verifies(
    served: Served, tmp_path: Path
) -> None:
    where = tmp_path / "http"
    with Client(served.url) as client:
        first = _failed_once(client, where)
        (where / "open").write_text("opened")
        answer = httpx.post(f"{served.url}/api/runs/{first}/rerun", json={}, timeout=60)
        assert answer.status_code == 201, answer.text
        second = answer.json()["run_id"]
        client.get(second, min_seq=answer.json()["seq"])  # read our own write: no 404
        detail = client.wait(second, timeout=60)
        assert detail.status == "succeeded", detail.error
        assert detail.outputs == {"a": "a", "b": "opened", "c": "c"}
        # The first call's result came from the copy of the journal: not called again.
        assert _counts(where) == {"a": 1, "c": 1, "gate": 2}
        entry = client.get(second).entry
        assert entry["rerun_of"]["run_id"] == first
        assert entry["rerun_of"]["restart"] == ["tool_2"]
        verified = httpx.post(f"{served.url}/api/runs/{second}/verify", timeout=120)
        assert verified.status_code == 200, verified.text
        assert verified.json()["ok"] is True, verified.text
        # A re-run of the re-run from its first call: every call runs again.
        again = client.rerun(second, from_step="tool_1").wait(timeout=60)
        assert again.status == "succeeded", again.error
        assert _counts(where) == {"a": 2, "c": 2, "gate": 3}


def test_the_cli_replays_the_forked_run_identically(served: Served, tmp_path: Path) -> None:
    where = tmp_path / "cli"
    with Client(served.url) as client:
        first = _failed_once(client, where)
    (where / "open").write_text("cli")
    argv = [sys.executable, "-m", "tiffany", "rerun", first, "--data-dir", str(served.data_dir)]
    done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    second = done.stdout.strip().split()[-1]
    with Client(served.url) as client:
        detail = client.wait(second, timeout=60)
    assert detail.status == "succeeded", detail.error
    assert _counts(where) == {"a": 1, "c": 1, "gate": 2}
    replay = [sys.executable, "-m", "tiffany", "replay", second, "--verify", "--json"]
    replay += ["--import", "rrmod", "--data-dir", str(served.data_dir)]
    verified = subprocess.run(
        replay, env=clean_env(), cwd=served.cwd, capture_output=True, text=True, timeout=120
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["ok"] is True


def test_a_failed_plain_step_is_the_default_restart_point(served: Served, tmp_path: Path) -> None:
    where = tmp_path / "step"
    where.mkdir()
    with Client(served.url) as client:
        first = client.submit(workflow="rr.step", inputs={"where": str(where)})
        assert first.wait(timeout=60).status == "failed"
        (where / "open").write_text("")
        second = client.rerun(first.run_id).wait(timeout=60)
        assert second.status == "succeeded", second.error
        assert second.outputs == {"a": "a", "b": "ok"}
    assert _counts(where) == {"a": 1, "step": 2}


def test_a_rerun_that_cannot_fork_is_refused_naming_why(served: Served, tmp_path: Path) -> None:
    where = tmp_path / "bad"
    with Client(served.url) as client:
        first = _failed_once(client, where)
        r = httpx.post(f"{served.url}/api/runs/{first}/rerun", json={"from_step": "tool_9"})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["from_step"]
        assert "tool_1, tool_2" in r.text
        other = {"inputs": {"where": "/elsewhere"}}
        r = httpx.post(f"{served.url}/api/runs/{first}/rerun", json=other)
        assert r.status_code == 422, r.text
        assert "where" in r.text
        waiting = client.submit(workflow="rr.wait")
        r = httpx.post(f"{served.url}/api/runs/{waiting.run_id}/rerun", json={})
        assert r.status_code == 409, r.text  # still running: nothing to fork yet
        waiting.signal("go", 1)
        done = waiting.wait(timeout=60)
        assert done.status == "succeeded"
        r = httpx.post(f"{served.url}/api/runs/{waiting.run_id}/rerun", json={})
        assert r.status_code == 422, r.text  # it failed nowhere: name the call
        assert r.json()["detail"][0]["loc"] == ["from_step"]


def test_a_rerun_whose_code_no_longer_replays_the_copy_is_refused(
    served: Served, tmp_path: Path
) -> None:
    where = tmp_path / "drift"
    where.mkdir()
    (where / "tag").write_text("a")
    with Client(served.url) as client:
        first = client.submit(workflow="rr.drift", inputs={"where": str(where)})
        assert first.wait(timeout=60).status == "failed"
        (where / "tag").write_text("z")  # the first call's arguments change: a divergence
        (where / "open").write_text("")
        r = httpx.post(f"{served.url}/api/runs/{first.run_id}/rerun", json={}, timeout=120)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["from_step"]
        assert "does not replay" in r.text
        assert "rrmod.py" in r.text  # the divergence names the line of the code
        # From the first call, nothing is replayed: the re-run goes.
        again = client.rerun(first.run_id, from_step="tool_1").wait(timeout=60)
        assert again.status == "succeeded", again.error
        assert again.outputs == {"a": "z", "b": ""}
    assert _counts(where) == {"a": 1, "gate": 2, "z": 1}


def test_a_rerun_replays_concurrent_tasks_and_a_child_run_before_the_fork(
    served: Served, tmp_path: Path
) -> None:
    where = tmp_path / "tree"
    where.mkdir()
    with Client(served.url) as client:
        first = client.submit(workflow="rr.tree", inputs={"where": str(where)})
        assert first.wait(timeout=60).status == "failed"
        assert _counts(where) == {"b0": 1, "b1": 1, "gate": 1, "leaf": 1}
        (where / "open").write_text("yes")
        second = client.rerun(first.run_id)
        detail = second.wait(timeout=60)
        assert detail.status == "succeeded", detail.error
        assert detail.outputs == {"done": ["b0", "b1"], "sub": {"leaf": "leaf"}, "gated": "yes"}
        # The children's steps and the child run are the earlier run's: not made again.
        assert _counts(where) == {"b0": 1, "b1": 1, "gate": 2, "leaf": 1}
        assert client.get(second.run_id).entry["rerun_of"]["restart"] == ["tool_2"]
        verified = httpx.post(f"{served.url}/api/runs/{second.run_id}/verify", timeout=120)
        assert verified.json()["ok"] is True, verified.text


def test_the_waits_of_a_run_name_clients_signals_only(served: Served) -> None:
    """A parent waiting for its child run waits for no signal of a client's; the child does."""
    with Client(served.url) as client:
        parent = client.submit(workflow="rr.parent")
        kid = f"{parent.run_id}.child_1.1"

        def child_waits() -> bool:
            try:
                return [w.name for w in client.waits(kid).signals] == ["go"]
            except NotFound:  # not started yet
                return False

        from process_support import wait_for

        wait_for(child_waits, 60, "the child run to wait for go")
        assert client.waits(parent.run_id).signals == []  # not its child's end: the engine's own
        client.signal(kid, "go", 7)
        assert parent.wait(timeout=60).outputs == {"child": {"got": 7}}
