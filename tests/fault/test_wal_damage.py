"""Damaged logs under a real ``tiffany engine``: tails, a flipped bit mid-log, a missing segment.

Each test runs a handful of runs, kills the engine with SIGKILL while they
are in flight, damages the WAL as a disk or a person might, and checks what
an operator sees: ``wal verify``'s verdict, the engine refusing (or not) to
start, ``wal repair --salvage`` keeping every intact record and failing only
the runs that lost one (with the reason), and every other run finishing.
All damage is seeded.
"""

from __future__ import annotations

import os
import random  # noqa: TID251 - seeded damage, not task code
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_process import EngineProc

from tiffany.durable import scan
from tiffany.durable.records import unpack_error
from tiffany.wal import Wal, iter_records
from tiffany.wal.format import RECORD_HEADER_SIZE_BYTES
from tiffany.wire.records import RecordType, decode, run_of

RUNS = 3
NAP_S = 2.0
PLAN = {
    "name": "damaged",
    "steps": [
        {"id": "a", "tool": "file.write", "args": {"path": "a.txt", "content": "1"}},
        {"id": "nap", "tool": "sleep", "after": ["a"], "args": {"seconds": NAP_S}},
        {
            "id": "b",
            "tool": "file.write",
            "after": ["nap"],
            "args": {"path": "b.txt", "content": "2"},
        },
    ],
}


def cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiffany", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture
def crashed(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A data dir whose engine was killed with RUNS runs in flight (asleep after step a)."""
    data = tmp_path / "data"
    eng = EngineProc(data)
    try:
        eng.wait_ready()
        ids = [eng.call("submit", plan=PLAN)["run_id"] for _ in range(RUNS)]
        deadline = time.monotonic() + 20
        while _napping(data / "wal") < RUNS:
            assert time.monotonic() < deadline, eng.log()
            time.sleep(0.02)
    finally:
        eng.stop(signal.SIGKILL)
    return data, ids


def _napping(wal_dir: Path) -> int:
    """How many runs have started their nap."""
    return len(
        {
            run_of(r.payload)
            for r in iter_records(wal_dir)
            if r.rtype == RecordType.DISPATCH and decode(r.rtype, r.payload).kind == "sleep"
        }
    )


def _live(data: Path) -> list[str]:
    """The runs the crash left running, in start order."""
    return [i.run_id for i in scan(data / "wal").runs.values() if i.status == "running"]


def _finish_all(data: Path, ids: list[str], failed: set[str]) -> dict[str, str]:
    """Start the engine; wait until no run is running; check who failed."""
    eng = EngineProc(data)
    states: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 60
        while True:
            index = scan(data / "wal")
            states = {r: (index.runs[r].status if r in index.runs else "?") for r in ids}
            if all(s != "running" for s in states.values()):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.1)
    finally:
        assert eng.stop() == 0, eng.log()
    want = {r: "failed" if r in failed else "succeeded" for r in ids}
    assert states == want
    return states


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x04
    path.write_bytes(bytes(data))


def _last_segment(data: Path) -> Path:
    return sorted((data / "wal").glob("*.wal"))[-1]


TAILS = {
    "torn": lambda rng, last: b"\x21\x43\x65\x87\x40\x00\x00\x00\x03" + rng.randbytes(20),
    "zeros": lambda rng, last: bytes(4096),
    "garbage": lambda rng, last: rng.randbytes(300),
}


#: Every tail kind at every byte is tested in-process (tests/wal/test_recovery.py);
#: with the engine, two by default and all with TIFFANY_FAULT_LONG=1 (CI budget).
LONG = os.environ.get("TIFFANY_FAULT_LONG") == "1"
_long_only = pytest.mark.skipif(not LONG, reason="set TIFFANY_FAULT_LONG=1 for every tail kind")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param("torn", marks=_long_only),
        pytest.param("zeros", marks=_long_only),
        "garbage",
        "flip-last",
    ],
)
def test_a_damaged_tail_is_cut_and_every_run_finishes(crashed, damage) -> None:
    data, ids = crashed
    last = _last_segment(data)
    rng = random.Random(damage)
    if damage == "flip-last":
        rec = _records(data)[-1]
        _flip(last, rec.offset + RECORD_HEADER_SIZE_BYTES + len(rec.payload) - 1)
    else:
        with last.open("ab") as f:
            f.write(TAILS[damage](rng, last))
    size = last.stat().st_size
    out = cli(data, "wal", "verify")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("WAL ok: ")
    assert "torn tail" in out.stdout
    _finish_all(data, ids, failed=set())
    broken = list((data / "wal").glob("*.broken"))
    assert len(broken) == 1
    assert broken[0].stat().st_size < size  # the cut bytes only, not a copy


def _records(data: Path) -> list:
    return list(iter_records(data / "wal"))


def test_a_flipped_bit_mid_log_fails_only_its_run_and_the_others_finish(crashed) -> None:
    data, ids = crashed
    recs = _records(data)
    index = scan(data / "wal")
    live = _live(data)
    assert len(live) >= 2
    victim = live[0]
    run_no = index.runs[victim].run_no
    # Its first step's STEP_START: other runs' records follow it.
    rec = next(r for r in recs if r.rtype == RecordType.STEP_START and run_of(r.payload) == run_no)
    assert recs[-1].seq > rec.seq + 3
    _flip(data / "wal" / rec.segment, rec.offset + RECORD_HEADER_SIZE_BYTES + 6)

    out = cli(data, "wal", "verify")
    assert out.returncode == 4  # WAL_DAMAGED (tiffany/cli/exits.py)
    assert (
        f"WAL DAMAGED at segment {rec.segment} offset {rec.offset} (seq {rec.seq}): bad checksum"
        in out.stderr
    )
    assert f"`tiffany wal repair --salvage --data-dir {data}`" in out.stderr  # this data dir

    with pytest.raises(RuntimeError) as refused:
        EngineProc(data)
    assert f"offset {rec.offset}" in str(refused.value)
    assert f"seq {rec.seq}" in str(refused.value)

    out = cli(data, "wal", "repair", "--salvage")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{victim}: " in out.stdout
    assert f"record seq {rec.seq} lost" in out.stdout
    assert "rebuilt the store" in out.stdout
    assert cli(data, "wal", "verify").returncode == 0
    kept = _records(data)
    assert len(kept) == len(recs), out.stdout  # one lost, one RUN_END added
    assert [r.payload for r in kept[: rec.seq - 1]] == [r.payload for r in recs[: rec.seq - 1]]
    assert [r.payload for r in kept[rec.seq - 1 : -1]] == [r.payload for r in recs[rec.seq :]]

    _finish_all(data, ids, failed={victim})
    end = next(
        r for r in _records(data) if r.rtype == RecordType.RUN_END and run_of(r.payload) == run_no
    )
    error = unpack_error(decode(end.rtype, end.payload).value)
    assert f"{rec.segment} offset {rec.offset}" in str(error)


def test_a_missing_segment_fails_the_runs_live_across_it(crashed) -> None:
    data, ids = crashed
    wal_dir = data / "wal"
    recs = _records(data)
    # Rewrite the same records into small segments, then lose one of them.
    for seg in wal_dir.glob("*.wal"):
        seg.unlink()
    with Wal.open(wal_dir, segment_size_bytes=400) as wal:
        for r in recs:
            wal.append(r.rtype, r.payload)
    segs = sorted(wal_dir.glob("*.wal"))
    starts = [r for r in _records(data) if r.rtype == RecordType.RUN_START]
    last_start = starts[-1]
    gone = next(s for s in reversed(segs) if s.name < last_start.segment)
    first_lost = int(gone.name[:20])
    live = {decode(r.rtype, r.payload).run_id for r in starts if r.seq < first_lost} & set(
        _live(data)
    )
    assert live
    assert live != set(ids)
    gone.unlink()

    out = cli(data, "wal", "verify")
    assert out.returncode == 4  # WAL_DAMAGED (tiffany/cli/exits.py)
    assert "sequence gap" in out.stderr
    out = cli(data, "wal", "repair", "--salvage")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "missing segment" in out.stdout
    for run_id in live:
        assert f"{run_id}: " in out.stdout
    _finish_all(data, ids, failed=live)


def test_an_engine_refuses_a_damaged_log_once_and_serve_does_not_loop(crashed) -> None:
    data, _ids = crashed
    recs = _records(data)
    mid = recs[len(recs) // 2]
    _flip(data / "wal" / mid.segment, mid.offset + RECORD_HEADER_SIZE_BYTES + 2)

    exe = [sys.executable, "-m", "tiffany", "--data-dir", str(data), "--log-format", "json"]
    engine = subprocess.run(
        [*exe, "engine"], capture_output=True, text=True, check=False, timeout=120
    )
    assert engine.returncode == 4, engine.stderr  # EXIT_WAL_DAMAGED: restarting cannot help
    assert f"offset {mid.offset}" in engine.stderr
    assert "tiffany wal repair --salvage" in engine.stderr
    assert "Traceback" not in engine.stderr

    served = subprocess.run(
        [*exe, "serve", "--port", "0"], capture_output=True, text=True, check=False, timeout=120
    )
    assert served.returncode == 4, served.stderr  # the engine's WAL_DAMAGED, passed on
    assert "engine exited with code 4" in served.stderr
    assert f"`tiffany wal repair --salvage --data-dir {data}`" in served.stderr  # this data dir
    assert "restarting it" not in served.stderr
