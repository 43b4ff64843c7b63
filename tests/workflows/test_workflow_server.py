"""Workflow runs through a real ``tiffany serve --import MOD``: HTTP, the SDK, signals, cancel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sdk_support import Served, serve, short_dir

from tiffany.sdk import Client

WF_MODULE = """
from tiffany import workflow
from tiffany.kernel import NewTask, Sleep, Step, WaitTask
from tiffany.workflows import signal, tool


def add(a, b):
    return a + b


@workflow("srv.add")
def add_flow(a: int, b: int = 1):
    total = yield Step(add, a, b)
    yield tool("sleep", seconds=0)
    return {"total": total}


@workflow("srv.approve")
def approve():
    ok = yield signal("approve", schema={"type": "object", "required": ["by"]})
    return {"by": ok["by"]}


def effect(effects, tag):
    with open(f"{effects}/{tag}.count", "a") as f:
        f.write("1\\n")
    return tag


def branch(effects, tag, pause_s):
    out = []
    for i in range(4):
        out.append((yield Step(effect, effects, f"{tag}-{i}")))
        yield Sleep(pause_s)
    return out


@workflow("srv.fanout")
def fanout(effects: str, pause_s: float = 0.3):
    a = yield NewTask(branch(effects, "a", pause_s), name="a")
    b = yield NewTask(branch(effects, "b", pause_s), name="b")
    return {"a": (yield WaitTask(a)), "b": (yield WaitTask(b))}


@workflow("srv.forever")
def forever():
    try:
        yield Sleep(3600)
    finally:
        yield Step(add, 1, 1)
    return {}
"""


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    cwd = short_dir("tfw-")
    (cwd / "wfmod.py").write_text(WF_MODULE)
    srv = serve(cwd, "--import", "wfmod")
    yield srv
    srv.stop()


def test_a_workflow_is_submitted_over_http_and_its_dict_is_the_runs_outputs(served) -> None:
    answer = httpx.post(
        served.url + "/api/runs", json={"workflow": "srv.add", "inputs": {"a": 2, "b": 3}}
    )
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert set(body) >= {"run_id", "seq"}
    with Client(served.url) as client:
        detail = client.wait(body["run_id"], timeout=60)
        assert detail.status == "succeeded"
        assert detail.outputs == {"total": 5}


def test_an_unknown_workflow_and_bad_inputs_are_422s_naming_the_field(served) -> None:
    bad = httpx.post(served.url + "/api/runs", json={"workflow": "srv.ad", "inputs": {}})
    assert bad.status_code == 422, bad.text
    text = bad.text
    for said in ("workflow", "srv.add", "--import"):
        assert said in text
    missing = httpx.post(served.url + "/api/runs", json={"workflow": "srv.add", "inputs": {}})
    assert missing.status_code == 422
    assert "inputs.a" in missing.text
    unknown = httpx.post(
        served.url + "/api/runs", json={"workflow": "srv.add", "inputs": {"a": 1, "c": 2}}
    )
    assert unknown.status_code == 422
    assert "inputs.c" in unknown.text
    assert unknown.json()["code"] == "workflow.inputs"
    typed = httpx.post(
        served.url + "/api/runs", json={"workflow": "srv.add", "inputs": {"a": "two"}}
    )
    assert typed.status_code == 422, typed.text
    assert typed.json()["detail"][0]["loc"] == ["inputs", "a"]
    assert "valid integer" in typed.json()["message"]
    extra = httpx.post(served.url + "/api/runs", json={"workflow": "srv.add", "plans": 1})
    assert extra.status_code == 422
    assert "plans" in extra.text


def test_the_sdk_submits_a_workflow_once_per_idempotency_key(served) -> None:
    with Client(served.url) as client:
        first = client.submit(workflow="srv.add", inputs={"a": 40}, idempotency_key="wf-k1")
        again = client.submit(workflow="srv.add", inputs={"a": 40}, idempotency_key="wf-k1")
        assert again.run_id == first.run_id
        assert first.wait(timeout=60).outputs == {"total": 41}


def test_a_signal_is_held_to_the_waits_schema_and_taken_by_the_workflow(served) -> None:
    with Client(served.url) as client:
        handle = client.submit(workflow="srv.approve")
        run_id = handle.run_id

        def waiting() -> bool:
            return client.get(run_id).status == "waiting"

        from process_support import wait_for

        wait_for(waiting, 60, "the run to wait for its signal")
        told = client.waits(run_id)  # the wait's schema, from the engine
        assert [(w.name, w.payload_schema) for w in told.signals] == [
            ("approve", {"type": "object", "required": ["by"]})
        ]
        bad = httpx.post(f"{served.url}/api/runs/{run_id}/signals/approve", json={"who": 1})
        assert bad.status_code == 422, bad.text
        assert "by" in bad.text
        handle.signal("approve", {"by": "ann"})
        assert handle.wait(timeout=60).outputs == {"by": "ann"}
        from tiffany.sdk.errors import Conflict

        with pytest.raises(Conflict):
            client.waits(run_id)  # finished: it waits for nothing


def test_cancel_ends_a_workflow_run_cancelled(served) -> None:
    with Client(served.url) as client:
        handle = client.submit(workflow="srv.forever")
        handle.cancel()
        assert handle.wait(timeout=60).status == "cancelled"


def test_submit_workflow_from_the_cli(served) -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    argv = [sys.executable, "-m", "tiffany", "submit", "--workflow", "srv.add"]
    argv += ["--input", "a=5", "--data-dir", str(served.data_dir)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.strip()
    with Client(served.url) as client:
        assert client.wait(run_id, timeout=60).outputs == {"total": 6}
    unknown = subprocess.run(
        [*argv[:5], "srv.nope", "--data-dir", str(served.data_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "srv.add" in unknown.stderr


def _cli(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    argv = [sys.executable, "-m", "tiffany", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_runs_status_and_tail_speak_of_a_workflow_run_as_of_a_plan(served) -> None:
    """``runs`` (local, --json, --url) gives its kind, ``status RUN`` its workflow,
    inputs, tasks (each live one's current call) and what it waits for, ``tail --run``
    its kind beside its name."""
    from process_support import wait_for

    data = ("--data-dir", str(served.data_dir))
    with Client(served.url) as client:
        handle = client.submit(workflow="srv.approve")
        run_id = handle.run_id
        wait_for(lambda: client.get(run_id).status == "waiting", 60, "the run to wait")

        for way in (data, ("--url", served.url)):
            listed = _cli(served, "runs", *way)
            assert listed.returncode == 0, listed.stderr
            (line,) = [x for x in listed.stdout.splitlines() if x.startswith(run_id)]
            assert line.split()[1] == "waiting", line
            assert line.split()[-2:] == ["workflow", "srv.approve"], line
        rows = [json.loads(x) for x in _cli(served, "runs", "--json", *data).stdout.splitlines()]
        (row,) = [r for r in rows if r["run_id"] == run_id]
        assert (row["kind"], row["name"], row["status"]) == ("workflow", "srv.approve", "waiting")

        for way in (data, ("--url", served.url)):
            shown = _cli(served, "status", run_id, *way)
            assert shown.returncode == 0, shown.stderr
            status = json.loads(shown.stdout)
            assert status["kind"] == "workflow"
            assert (status["workflow"], status["inputs"]) == ("srv.approve", {})
            assert status["status"] == "waiting"
            (root,) = status["tasks"]
            assert (root["name"], root["call"]) == ("srv.approve", "receive approve")
            assert [(w["kind"], w["name"]) for w in status["waiting_for"]] == [
                ("signal", "approve")
            ]

        handle.signal("approve", {"by": "ann"})
        assert handle.wait(timeout=60).status == "succeeded"
        tail = _cli(served, "tail", "--run", run_id, *data)
        assert tail.returncode == 0, tail.stderr
        started = [x for x in tail.stdout.splitlines() if "run started" in x]
        assert started, tail.stdout
        assert started[0].endswith("srv.approve (workflow)"), started
        done = json.loads(_cli(served, "status", run_id, *data).stdout)
        assert (done["status"], done["outputs"]) == ("succeeded", {"by": "ann"})
        assert "waiting_for" not in done


def test_an_engine_killed_mid_run_resumes_the_workflow_at_its_restart(tmp_path: Path) -> None:
    import os
    import signal as signals

    from process_support import serve_json, wait_for

    cwd = short_dir("tfk-")
    (cwd / "wfmod.py").write_text(WF_MODULE)
    effects = tmp_path / "effects"
    effects.mkdir()
    srv = serve(cwd, "--import", "wfmod")
    try:

        def lines(tag: str) -> int:
            path = effects / f"{tag}.count"
            return len(path.read_text().splitlines()) if path.exists() else 0

        with Client(srv.url) as client:
            handle = client.submit(workflow="srv.fanout", inputs={"effects": str(effects)})
            wait_for(lambda: lines("a-2") and lines("b-2"), 120, "the third effects", interval=0.01)
            engine = serve_json(srv.data_dir)["engine_pid"]
            os.kill(engine, signals.SIGKILL)
            wait_for(
                lambda: (serve_json(srv.data_dir) or {}).get("engine_pid") not in (None, engine),
                120,
                "serve to restart its engine",
            )
            detail = handle.wait(timeout=120)
            assert detail.status == "succeeded"
            assert detail.outputs == {t: [f"{t}-{i}" for i in range(4)] for t in ("a", "b")}
            for t in ("a", "b"):
                assert lines(f"{t}-0") == 1
                assert lines(f"{t}-1") == 1
                assert sum(lines(f"{t}-{i}") for i in (2, 3)) in (2, 3)  # one in flight at most
            verified = httpx.post(f"{srv.url}/api/runs/{handle.run_id}/verify", timeout=120)
            assert verified.status_code == 200, verified.text
            assert verified.json()["ok"] is True, verified.text
    finally:
        srv.stop()


def test_the_async_client_submits_a_workflow(served) -> None:
    import asyncio

    from tiffany.sdk import AsyncClient

    async def go() -> dict:
        async with AsyncClient(served.url) as client:
            handle = await client.submit(workflow="srv.add", inputs={"a": 1, "b": 1})
            detail = await handle.wait(timeout=60)
            return detail.outputs

    assert asyncio.run(go()) == {"total": 2}
    from tiffany.sdk import protocol

    with pytest.raises(TypeError, match="not both"):
        protocol.submit_body({"steps": []}, None, "srv.add")
