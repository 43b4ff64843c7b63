"""A re-run reuses the journal's values: exactly what a fresh run of the plan computes.

A real ``tiffany engine`` runs a plan whose first step (a python function)
returns what JSON cannot hold: NUL, bytes, infinities, tuples, sets,
nesting deeper than the store keeps (``rerun_values.py``). The run fails at
its gate; its re-run reuses the first step's output and opens the gate.
The store's projection of that output is lossy, so a re-run that reused it
gave its next step other values than a fresh run gives it: the step's
description of what it got differed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_process import EngineProc
from sqlalchemy.orm import Session

from tiffany.store import make_engine, queries

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rerun_values import odd, tagged  # noqa: E402

PLAN = {
    "name": "odd-values",
    "inputs": {"open": False},
    "steps": [
        {"id": "make", "tool": "python", "args": {"function": "test.odd_value"}},
        {
            "id": "gate",
            "tool": "python",
            "args": {"function": "test.gate", "kwargs": {"open_": "${inputs.open}"}},
            "after": ["make"],
        },
        {
            "id": "use",
            "tool": "python",
            "args": {"function": "test.describe", "kwargs": {"value": "${steps.make.output}"}},
            "after": ["gate"],
        },
    ],
    "outputs": {"described": "${steps.use.output}"},
}
#: How long a run of three python steps may take to finish, in seconds (a loaded machine).
FINISH_S = 60.0


@pytest.fixture(params=["file", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[EngineProc]:
    """An engine journaling in its WAL files, or in PostgreSQL (the store there too)."""
    data_dir = Path(tempfile.mkdtemp(prefix="tfx-", dir="/tmp"))  # short: Unix sockets
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env |= {"TIFFANY_TOOL_MODULES": "rerun_values", "TIFFANY_LOG_FORMAT": "json"}
    store = f"sqlite:///{data_dir / 'data' / 'tiffany.db'}"
    if request.param == "postgres":
        store = request.getfixturevalue("pg_schema_url")
        env |= {"TIFFANY_DATABASE_URL": store, "TIFFANY_JOURNAL": "postgres"}
    proc = EngineProc(data_dir / "data", env=env)
    proc.store_url = store  # type: ignore[attr-defined]
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
        assert code == 0, proc.log()


def _finished(engine: EngineProc, run_id: str) -> dict[str, Any]:
    db = make_engine(engine.store_url)  # type: ignore[attr-defined]
    deadline = time.monotonic() + FINISH_S
    try:
        while True:
            with Session(db) as session:
                run = queries.get_run(session, run_id)
                if run is not None and run.status in ("succeeded", "failed", "cancelled"):
                    return queries.run_detail(run)
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} did not finish within {FINISH_S} s")
            time.sleep(0.05)
    finally:
        db.dispose()


def _step(run: dict[str, Any], step_id: str) -> dict[str, Any]:
    return next(s for s in run["steps"] if s["step_id"] == step_id)


def test_a_rerun_reuses_the_exact_output_a_fresh_run_computes(engine: EngineProc) -> None:
    expected = json.dumps(tagged(odd()))
    first = engine.call("submit", plan=PLAN, inputs={})["run_id"]
    run = _finished(engine, first)
    assert run["status"] == "failed"
    assert _step(run, "gate")["status"] == "failed"

    rerun = engine.call("rerun", rerun_of=first, inputs={"open": True})["run_id"]
    fresh = engine.call("submit", plan=PLAN, inputs={"open": True})["run_id"]
    again, anew = _finished(engine, rerun), _finished(engine, fresh)
    assert (again["status"], anew["status"]) == ("succeeded", "succeeded"), again["error"]
    reused = _step(again, "make")["attempts"][0]["reused"]
    assert reused["run_id"] == first
    assert "projected" not in reused  # read from the journal, not the store
    # The step after the reused one got the very value a fresh run's got: type and value.
    assert anew["outputs"]["described"] == expected
    assert again["outputs"]["described"] == expected
    # A re-run of the re-run reuses the output from the run that recorded it.
    third = engine.call("rerun", rerun_of=rerun, from_step="use")["run_id"]
    last = _finished(engine, third)
    assert last["status"] == "succeeded", last["error"]
    assert _step(last, "make")["attempts"][0]["reused"] == {"run_id": first, "seq": reused["seq"]}
    assert last["outputs"]["described"] == expected
    for run_id in (rerun, fresh, third):
        report = engine.call("verify", run_id=run_id)
        assert report["identical"] is True, report
