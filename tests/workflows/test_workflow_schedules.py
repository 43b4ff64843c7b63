"""A schedule of a ``@workflow`` (``POST /api/schedules {"workflow": NAME}``) through a real serve.

The schedule's row names the workflow; each tick submits it by name as
``POST /api/runs`` would, with the tick's Idempotency-Key and the tick in
the run's entry, so a workflow's schedule is a plan's, not a twin of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from process_support import wait_for
from sdk_support import Served, serve, short_dir

from tiffany.sdk import Client

WF_MODULE = """
from tiffany import workflow
from tiffany.kernel import Step


def add(a, b):
    return a + b


@workflow("sch.add")
def add_flow(a: int, b: int = 1):
    total = yield Step(add, a, b)
    return {"total": total}
"""


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    cwd = short_dir("tfs-")
    (cwd / "wfmod.py").write_text(WF_MODULE)
    srv = serve(cwd, "--import", "wfmod")
    yield srv
    srv.stop()


def _scheduled_runs(url: str, sid: str) -> list[dict[str, Any]]:
    """The details of the runs schedule ``sid`` started (each run's entry names its tick)."""
    runs = httpx.get(f"{url}/api/runs", params={"limit": 500}, timeout=30).json()["runs"]
    found = []
    for r in runs:
        detail = httpx.get(f"{url}/api/runs/{r['run_id']}", timeout=30).json()
        if (detail.get("entry") or {}).get("schedule", {}).get("id") == sid:
            found.append(detail)
    return found


def test_a_schedule_of_a_workflow_ticks_runs_of_it(served: Served) -> None:
    url = served.url
    body = {"workflow": "sch.add", "inputs": {"a": 2, "b": 3}, "cron": "* * * * * *"}
    r = httpx.post(f"{url}/api/schedules", json=body, timeout=30)
    assert r.status_code == 201, r.text
    added = r.json()
    sid = added["schedule_id"]
    assert (added["workflow"], added["plan"], added["name"]) == ("sch.add", None, "sch.add")
    assert added["inputs"] == {"a": 2, "b": 3}

    def finished() -> list[dict[str, Any]]:
        return [d for d in _scheduled_runs(url, sid) if d["status"] == "succeeded"]

    wait_for(lambda: len(finished()) >= 2, 60, "two ticks of the workflow's schedule to finish")
    assert httpx.delete(f"{url}/api/schedules/{sid}", timeout=30).status_code == 204
    runs = _scheduled_runs(url, sid)
    ticks = [d["entry"]["schedule"]["tick"] for d in runs]
    assert len(ticks) == len(set(ticks)), ticks  # one run a tick
    for detail in finished():
        assert detail["entry"]["kind"] == "workflow"
        assert detail["entry"]["workflow"] == "sch.add"
        assert detail["outputs"] == {"total": 5}
    listed = httpx.get(f"{url}/api/schedules", timeout=30).json()["schedules"]
    assert sid not in {s["schedule_id"] for s in listed}


def test_a_bad_workflow_schedule_is_refused_naming_the_field(served: Served) -> None:
    url = served.url
    base: dict[str, Any] = {"cron": "* * * * *"}
    plan = {"name": "p", "steps": [{"id": "s", "tool": "sleep", "args": {"seconds": 0}}]}
    for body, loc, says in (
        ({**base, "workflow": "sch.nope"}, ["workflow"], "sch.add"),  # the registered names
        ({**base, "workflow": "sch.add", "inputs": {}}, ["inputs", "a"], "missing"),
        ({**base, "workflow": "sch.add", "inputs": {"a": 1, "c": 2}}, ["inputs", "c"], "'c'"),
        ({**base, "workflow": "sch.add", "plan": plan}, ["body", "workflow"], "one of them"),
        (base, ["body", "workflow"], "one of them"),
    ):
        r = httpx.post(f"{url}/api/schedules", json=body, timeout=30)
        assert r.status_code == 422, r.text
        first = r.json()["detail"][0]
        assert first["loc"] == loc, r.text
        assert says in first["msg"], r.text
    listed = httpx.get(f"{url}/api/schedules", timeout=30).json()["schedules"]
    assert listed == []


def test_the_cli_and_the_sdk_add_a_workflows_schedule_checked_by_the_engine(
    served: Served,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    base = [sys.executable, "-m", "tiffany", "schedule", "add", "--cron", "0 9 * * 1-5"]
    on_dir = ["--data-dir", str(served.data_dir)]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )

    unknown = cli("--workflow", "sch.nope", *on_dir)
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "sch.add" in unknown.stderr  # the registered names, from the engine that imported them
    missing = cli("--workflow", "sch.add", *on_dir)
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "inputs.a" in missing.stderr or "'a'" in missing.stderr, missing.stderr
    both = cli("--workflow", "sch.add", str(served.cwd / "wfmod.py"), *on_dir)
    assert both.returncode == 2, both.stdout + both.stderr
    assert "--workflow" in both.stderr
    added = cli("--workflow", "sch.add", "--input", "a=4", *on_dir)
    assert added.returncode == 0, added.stdout + added.stderr
    remote = cli("--workflow", "sch.add", "--input", "a=5", "--url", served.url)
    assert remote.returncode == 0, remote.stdout + remote.stderr
    with Client(served.url) as client:
        through_sdk = client.add_schedule(None, "0 9 * * 1-5", workflow="sch.add", inputs={"a": 6})
        rows = {s.schedule_id: s for s in client.schedules()}
        ids = (added.stdout.strip(), remote.stdout.strip(), through_sdk.schedule_id)
        assert [(rows[i].workflow, rows[i].plan, rows[i].inputs["a"]) for i in ids] == [
            ("sch.add", None, 4),
            ("sch.add", None, 5),
            ("sch.add", None, 6),
        ]
        for i in ids:
            client.delete_schedule(i)
