"""The durable CLI as a user runs it: real subprocesses on golden and fresh journals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "data" / "golden"


def tiffany(*args: str, data_dir: Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]), TIFFANY_LOG_FORMAT="json"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def golden(tmp_path):
    for name in ("fan_in", "nondeterministic"):
        shutil.copytree(GOLDEN / name, tmp_path / name)
    return tmp_path


def test_replay_verify_exits_zero_for_an_identical_replay(golden):
    proc = tiffany("replay", "golden-fan_in", "--verify", "--json", data_dir=golden / "fan_in")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["status"] == "succeeded"


def test_replay_verify_exits_non_zero_with_the_divergence(golden):
    proc = tiffany(
        "replay", "golden-nondeterministic", "--verify", data_dir=golden / "nondeterministic"
    )
    assert proc.returncode == 1
    assert "does NOT replay identically" in proc.stderr
    assert "expected (journal)" in proc.stderr
    assert "moody" in proc.stderr  # the task's stack names the code at fault
    as_json = tiffany(
        "replay",
        "golden-nondeterministic",
        "--verify",
        "--json",
        data_dir=golden / "nondeterministic",
    )
    assert json.loads(as_json.stdout)["divergence"]["code"] == "replay.nondeterminism"


def test_unknown_run_is_a_clear_error(golden):
    proc = tiffany("replay", "nope", "--verify", data_dir=golden / "fan_in")
    assert proc.returncode == 3
    assert "no run 'nope'" in proc.stderr


def test_wal_dump_verify_and_runs(golden):
    data = golden / "fan_in"
    dump = tiffany("wal", "dump", "--json", data_dir=data, check=True)
    rows = [json.loads(line) for line in dump.stdout.splitlines()]
    assert rows[0]["type"] == "RUN_START"
    assert rows[-1]["type"] == "RUN_END"
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    human = tiffany(
        "wal", "dump", "--run", "golden-fan_in", "--limit", "3", data_dir=data, check=True
    )
    assert len(human.stdout.splitlines()) == 3
    ok = tiffany("wal", "verify", "--json", data_dir=data, check=True)
    assert json.loads(ok.stdout)["ok"] is True
    runs = tiffany("runs", "--json", data_dir=data, check=True)
    assert json.loads(runs.stdout)["run_id"] == "golden-fan_in"


def test_wal_verify_and_repair_on_a_corrupted_log(golden):
    data = golden / "fan_in"
    seg = next((data / "wal").glob("*.wal"))
    raw = bytearray(seg.read_bytes())
    raw[60] ^= 0x10  # inside an early record: good records follow it
    seg.write_bytes(bytes(raw))
    bad = tiffany("wal", "verify", data_dir=data)
    assert bad.returncode == 4  # WAL_DAMAGED
    assert "corrupt" in bad.stdout.lower() or "corrupt" in bad.stderr.lower()
    refused = tiffany("wal", "repair", data_dir=data)
    assert refused.returncode == 2  # only when asked
    fixed = tiffany("wal", "repair", "--yes", data_dir=data, check=True)
    assert "repaired" in fixed.stdout
    assert json.loads(tiffany("wal", "verify", "--json", data_dir=data, check=True).stdout)["ok"]
    assert list((data / "wal").glob("*.broken"))


def test_replay_resumes_a_crashed_run(tmp_path):
    from walcut import cut_wal

    from tiffany.durable import Runtime
    from tiffany.wal import iter_records

    with Runtime(tmp_path / "full") as rt:
        rt.submit("durable_workloads:fan_in", 3, run_id="crashed")
        rt.run()
    n = sum(1 for _ in iter_records(tmp_path / "full" / "wal"))
    cut_wal(tmp_path / "full" / "wal", tmp_path / "cut" / "wal", n // 2)
    proc = tiffany("replay", "crashed", "--json", data_dir=tmp_path / "cut")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "succeeded"
    assert out["result"][0] == 30
    again = tiffany("replay", "crashed", "--verify", data_dir=tmp_path / "cut")
    assert again.returncode == 0, again.stderr
