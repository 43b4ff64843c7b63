"""Workflow runs through a real ``tiffany serve --import MOD``: HTTP, the SDK, signals, cancel."""

from __future__ import annotations

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
from tiffany.kernel import Sleep, Step
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
        bad = httpx.post(f"{served.url}/api/runs/{run_id}/signals/approve", json={"who": 1})
        assert bad.status_code == 422, bad.text
        assert "by" in bad.text
        handle.signal("approve", {"by": "ann"})
        assert handle.wait(timeout=60).outputs == {"by": "ann"}


def test_cancel_ends_a_workflow_run_cancelled(served) -> None:
    with Client(served.url) as client:
        handle = client.submit(workflow="srv.forever")
        handle.cancel()
        assert handle.wait(timeout=60).status == "cancelled"
