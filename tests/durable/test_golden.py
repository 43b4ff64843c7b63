"""Golden journals: histories recorded once, replayed by every build (Temporal's pattern).

Each is kept in the current journal schema and in the previous one (``_v1``:
every dispatch had its own DISPATCH record, before a ``NewTask``, ``Now()``,
``Random()`` or ``Step`` was carried by the record it causes): old histories
must keep replaying.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import durable_workloads as wl
import pytest

from tiffany.durable import RecordType, scan, verify
from tiffany.durable.history import load_many
from tiffany.durable.runtime import verify_loaded
from tiffany.wal import iter_records

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
SCHEMAS = ["", "_v1"]


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(GOLDEN / name, dst)
    return dst


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_golden_fan_in_journal_replays_identically(tmp_path, schema):
    data = _copy(f"fan_in{schema}", tmp_path)
    info = scan(data / "wal").get("golden-fan_in")
    assert info.status == "succeeded"
    report = verify(data, "golden-fan_in")
    assert report.ok, report.to_dict()
    assert report.dispatches > 20
    assert wl.CALLS == []  # steps were not called again


def test_the_two_schemas_hold_the_same_dispatches_in_fewer_records(tmp_path):
    new, old = ([r.rtype for r in iter_records(GOLDEN / f"fan_in{s}" / "wal")] for s in SCHEMAS)
    assert len(new) < len(old)
    assert new.count(RecordType.DISPATCH) < old.count(RecordType.DISPATCH)
    assert (
        verify(_copy("fan_in", tmp_path), "golden-fan_in").dispatches
        == verify(_copy("fan_in_v1", tmp_path), "golden-fan_in").dispatches
    )


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_nondeterministic_golden_journal_raises(tmp_path, schema):
    data = _copy(f"nondeterministic{schema}", tmp_path)
    report = verify(data, "golden-nondeterministic")
    assert not report.ok
    div = report.divergence
    assert div is not None
    assert div["code"] == "replay.nondeterminism"
    assert div["run_id"] == "golden-nondeterministic"
    assert div["expected"][2] == "yield"
    assert div["actual"][2] == "sleep"
    assert div["seq"] > 0


#: Recorded by tests/data/make_signals_golden.py (main at 235120f): the engine's
#: own signals (a sub-plan's end, ``child:<id>``; a limited run's slot,
#: ``concurrency.slot``) as journaled signals.
SIGNAL_RUNS = ["golden-parent", "golden-parent.sub.1", "golden-holder", "golden-queued"]


@pytest.mark.parametrize("run_id", SIGNAL_RUNS)
def test_journals_with_the_engines_old_signals_replay_identically(tmp_path, run_id):
    from tiffany.config import Settings
    from tiffany.engine import replay_resolvers

    data = _copy("signals_v2", tmp_path)
    assert scan(data / "wal").get(run_id).status == "succeeded"
    settings = Settings(data_dir=data, _env_file=None)
    report = verify(data, run_id, resolvers=replay_resolvers(settings))
    assert report.ok, report.to_dict()


@pytest.mark.parametrize(
    ("name", "run_id"),
    [("fan_in", "golden-fan_in"), ("nondeterministic", "golden-nondeterministic")],
)
def test_runs_read_in_one_pass_verify_as_runs_read_one_by_one(tmp_path, name, run_id):
    # verify_loaded (bench/soak.py verifies thousands of runs: one pass per batch).
    data = _copy(name, tmp_path)
    index, cursors = load_many(data / "wal", {run_id})
    batch = verify_loaded(index.get(run_id), cursors[run_id])
    assert batch.to_dict() == verify(data, run_id).to_dict()
