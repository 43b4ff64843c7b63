"""One data dir used as a person does for a week: ``run``, ``run``, ``serve``, ``db rebuild``.

Real subprocesses throughout (``python -m tiffany``). On the old code the
second ``tiffany run`` crashed (``UNIQUE constraint failed: runs.run_no``:
every CLI run was run 1), a server on the dir then showed one run of N and
said it was ready, and ``db rebuild`` failed the same way. Also: a WAL that
already holds two runs with one number (written that way by the old code)
projects fully, incrementally and by rebuild, row for row the same.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from store_support import dump
from store_support import get_json as _get
from store_support import serve as _serve
from store_support import tiffany_cli as _tiffany
from store_support import wait_for as _wait

from tiffany.store import make_engine

PLAN = """\
name: chores
inputs:
  text: hello
steps:
  - id: nap
    tool: sleep
    args: {seconds: 0}
  - id: write
    tool: file.write
    after: [nap]
    args: {path: out.txt, content: "${inputs.text}"}
"""


def _store_rows(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    engine = make_engine(f"sqlite:///{data_dir / 'tiffany.db'}")
    try:
        return dump(engine)
    finally:
        engine.dispose()


def test_a_week_of_runs_serve_and_rebuild_on_one_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    plan = tmp_path / "chores.yaml"
    plan.write_text(PLAN)
    cli_runs = []
    for day in ("mon", "tue", "wed"):
        proc = _tiffany(data, "run", str(plan), "--json", "--input", f"text={day}")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["status"] == "succeeded"
        cli_runs.append(out["run_id"])

    proc, url = _serve(data)
    try:
        assert _wait(lambda: _get(url + "readyz")[1].get("ready"), 60, "readyz")
        body = json.dumps({"plan": PLAN, "inputs": {"text": "thu"}})
        req = urllib.request.Request(
            url + "api/runs", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 201
            served = json.loads(resp.read())["run_id"]

        def all_done() -> list[dict[str, Any]] | None:
            runs = _get(url + "api/runs")[1]["runs"]
            done = [r for r in runs if r["status"] == "succeeded"]
            return runs if len(done) == 4 else None

        runs = _wait(all_done, 60, "the four runs in the store")
        assert {r["run_id"] for r in runs} == {*cli_runs, served}
        assert sorted(r["run_no"] for r in runs) == [1, 2, 3, 4]
        assert runs[0]["run_id"] == served  # newest first
        status, ready = _get(url + "readyz")
        assert status == 200
        assert ready["ready"] is True
        assert ready["store"]["dead_letters"] == 0
        assert ready["store"]["stalled"] is False
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0

    incremental = _store_rows(data)
    rebuilt = _tiffany(data, "db", "rebuild", "--json")
    assert rebuilt.returncode == 0, rebuilt.stderr
    report = json.loads(rebuilt.stdout)
    assert report["runs"] == 4
    assert report["quarantined"] == []
    assert _store_rows(data) == incremental


def _legacy_runs(data_dir: Path) -> list[str]:
    import yaml

    from tiffany.agents import AgentEnv, plan_entry
    from tiffany.agents.registry import ToolRegistry
    from tiffany.durable import Runtime
    from tiffany.workflows import workflow_resolver

    doc = yaml.safe_load(PLAN)
    env = AgentEnv(ToolRegistry.default(enabled=["file.write", "sleep"]), data_dir / "workspaces")
    ids = []
    for day in ("mon", "tue"):
        with Runtime(data_dir, resolvers={"workflow": workflow_resolver(env)}) as rt:
            rt.journal._next_run_no = 1  # the old numbering: every session started at 1
            ids.append(rt.submit_entry(plan_entry(doc, {"text": day}), name="chores"))
            rt.run()
    return ids


def test_a_legacy_wal_with_one_run_number_twice_projects_fully(
    tmp_path: Path, store: Engine
) -> None:
    from tiffany.cli.db import rebuild_store
    from tiffany.projector import Projector
    from tiffany.projector.tail import decoded_batches, journal_id
    from tiffany.store import queries, session_factory

    data = tmp_path / "legacy"
    first, second = _legacy_runs(data)
    wal = data / "wal"
    projector = Projector(store, journal_id(wal))  # as the projector process claims it
    for batch in decoded_batches(wal, batch_records=7):  # batches that cut runs apart
        report = projector.apply(batch)
        assert report.quarantined == []
    incremental = dump(store)
    with session_factory(store)() as session:
        runs = queries.list_runs(session)
        assert [r.run_id for r in runs] == [second, first]
        assert [r.run_no for r in runs] == [1, 1]
        assert {r.status for r in runs} == {"succeeded"}
        for run in runs:
            detail = queries.get_run(session, run.run_id)
            assert detail is not None
            assert {s.status for s in detail.steps} == {"succeeded"}
            page = queries.run_records(session, run.run_id, limit=1000)
            assert page is not None
            assert page["records"][0]["data"]["run_id"] == run.run_id
            starts = [r for r in page["records"] if r["type"] == "RUN_START"]
            assert len(starts) == 1
    report = rebuild_store(store, wal, batch_records=5)
    assert report.runs == 2
    assert dump(store) == incremental
