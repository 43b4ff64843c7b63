"""Golden journals: histories recorded once, replayed by every build (Temporal's pattern)."""

from __future__ import annotations

import shutil
from pathlib import Path

import durable_workloads as wl

from tiffany.durable import scan, verify

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(GOLDEN / name, dst)
    return dst


def test_the_golden_fan_in_journal_replays_identically(tmp_path):
    data = _copy("fan_in", tmp_path)
    info = scan(data / "wal").get("golden-fan_in")
    assert info.status == "succeeded"
    report = verify(data, "golden-fan_in")
    assert report.ok, report.to_dict()
    assert report.dispatches > 20
    assert wl.CALLS == []  # steps were not called again


def test_the_nondeterministic_golden_journal_raises(tmp_path):
    data = _copy("nondeterministic", tmp_path)
    report = verify(data, "golden-nondeterministic")
    assert not report.ok
    div = report.divergence
    assert div is not None
    assert div["code"] == "replay.nondeterminism"
    assert div["run_id"] == "golden-nondeterministic"
    assert div["expected"][2] == "yield"
    assert div["actual"][2] == "sleep"
    assert div["seq"] > 0
