"""Plan runs journaled by main before a plan run was the built-in workflow ``plan``.

``tests/data/golden/plans_v3`` was recorded by ``tests/data/make_plan_golden.py``
with main at 08385b2: entries of kind ``plan`` (inputs, a budget, the
engine's ``limits``, a concurrency key, a re-run's ``reuse``) and one of kind
``workflow``. Each must replay with ``--verify`` under this code, dispatch
for dispatch, as ``tiffany replay RUN --verify`` checks it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiffany.durable import scan, verify
from tiffany.wal import iter_records
from tiffany.wire.entries import PlanEntry, WorkflowEntry, read_entry
from tiffany.wire.records import RunStart, decode

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "golden" / "plans_v3"
PLAN_RUNS = ["golden-plan", "golden-limited", "golden-rerun"]


@pytest.fixture
def data_dir(tmp_path):
    dst = tmp_path / "plans_v3"
    shutil.copytree(GOLDEN, dst)
    return dst


def test_the_recorded_entries_are_read_as_their_kinds(data_dir):
    index = scan(data_dir / "wal")
    starts = (decode(r.rtype, r.payload) for r in iter_records(data_dir / "wal"))
    entries = {s.run_id: s.entry for s in starts if isinstance(s, RunStart)}
    for run_id in PLAN_RUNS:
        entry = read_entry(entries[run_id])
        assert isinstance(entry, PlanEntry)
        assert entry.workflow_name == "plan"
        assert index.get(run_id).status == "succeeded"
    rerun = read_entry(entries["golden-rerun"])
    assert isinstance(rerun, PlanEntry)
    assert rerun.rerun_of == {"run_id": "golden-plan", "restart": ["r"]}
    assert sorted(rerun.reuse or {}) == ["nap", "w"]
    assert read_entry(entries["golden-limited"]).concurrency_key == "golden"
    assert read_entry(entries["golden-plan"]).budget_spec == {"tokens": 5000}
    flow = read_entry(entries["golden-flow"])
    assert isinstance(flow, WorkflowEntry)
    assert flow.workflow_name == "golden.flow"


@pytest.mark.parametrize("run_id", [*PLAN_RUNS, "golden-flow"])
def test_a_run_main_journaled_verifies_under_this_code(data_dir, run_id):
    from tiffany.config import Settings
    from tiffany.engine import replay_resolvers

    sys.path.insert(0, str(DATA))
    try:
        import golden_flows  # noqa: F401 - registers golden.flow
    finally:
        sys.path.remove(str(DATA))
    settings = Settings(data_dir=data_dir, _env_file=None)
    report = verify(data_dir, run_id, resolvers=replay_resolvers(settings))
    assert report.ok, report.to_dict()
    assert report.dispatches > 0


@pytest.mark.parametrize("run_id", ["golden-plan", "golden-rerun", "golden-flow"])
def test_tiffany_replay_verify_passes_on_main_s_journal(data_dir, run_id):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(DATA), *sys.path]))
    argv = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "replay", run_id]
    argv += ["--verify", "--json", "--import", "golden_flows"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
