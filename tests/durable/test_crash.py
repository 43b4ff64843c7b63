"""kill -9 of a real engine process at random dispatches, then recovery."""

from __future__ import annotations

import json
import os
import random  # noqa: TID251 - the test picks kill points, not task code
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tiffany.durable import RecordType, Runtime, scan, verify
from tiffany.durable.history import decoded_records

HERE = Path(__file__).resolve().parent
CHILD = HERE / "crash_child.py"
KILLS = 50
SEED = 20261122


def _child(data_dir: Path, out: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    return subprocess.run(
        [sys.executable, str(CHILD), str(data_dir), str(out), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def _journaled_steps(data_dir: Path) -> tuple[set[str], int] | None:
    """Lines whose step completion is in the WAL, and how many steps were in flight."""
    index = scan(data_dir / "wal")
    if "crash-run" not in index.runs:
        return None
    info = index.get("crash-run")
    done: set[str] = set()
    started = 0
    for _seq, rtype, fields in decoded_records(data_dir / "wal", info):
        if rtype == RecordType.WAKE and fields.cause == "step":
            done.add(fields.value)
        elif rtype == RecordType.STEP_START:
            started += 1
    return done, started - len(done)


@pytest.mark.slow
def test_kill_9_at_random_dispatches_then_recover(tmp_path):
    ref = _child(tmp_path / "ref", tmp_path / "ref.txt", 0)
    assert ref.returncode == 0, ref.stderr
    reference = json.loads(ref.stdout)
    expected_lines = sorted(reference["result"])
    total = reference["dispatches"]
    assert len(expected_lines) == 32
    rng = random.Random(SEED)
    points = sorted(rng.sample(range(1, total), KILLS))
    twice = 0
    mid_run = 0
    for kill_at in points:
        data_dir = tmp_path / f"k{kill_at}"
        out = tmp_path / f"k{kill_at}.txt"
        crashed = _child(data_dir, out, kill_at)
        assert crashed.returncode == -signal.SIGKILL, (kill_at, crashed.stderr[-2000:])
        journaled = _journaled_steps(data_dir)
        if journaled is None:
            # Killed before the run's first commit: it was never acknowledged, and
            # write-ahead means none of its effects may have happened.
            assert not out.exists() or out.read_text() == "", kill_at
            continue
        done, in_flight = journaled
        mid_run += len(done) < len(expected_lines)
        with Runtime(data_dir) as rt:
            assert rt.recover() == ["crash-run"]
            rt.run()
            state = rt.status("crash-run")
        assert state.status == "succeeded", kill_at
        assert state.result == expected_lines, kill_at
        counts = Counter(out.read_text().splitlines())
        assert sorted(counts) == expected_lines, kill_at
        for line in done:
            assert counts[line] == 1, (kill_at, line, "completed before the crash, ran again")
        extra = sum(c - 1 for c in counts.values())
        assert all(c <= 2 for c in counts.values()), (kill_at, counts)
        assert extra <= in_flight, (kill_at, extra, in_flight)
        twice += extra
        assert verify(data_dir, "crash-run").ok, kill_at
    # the kills really landed mid-run, with steps still to do
    assert mid_run >= KILLS // 2, mid_run
