"""Replay speed: journal records replayed per second, and recovery time.

    python bench/replay.py [--records 1000000]

Records a run whose tasks yield cooperatively (one DISPATCH record per
dispatch, about ``--records`` records in all), then measures:

* verify: scan the WAL, load the run, re-run it against the journal with
  every dispatch checked (``tiffany replay --verify``);
* recovery: the same run with its last 1% of records cut off, as after a
  crash: ``Runtime(...)`` (open the WAL), ``recover()`` (scan and load),
  then ``run()`` (replay to the end of the journal, go live, finish).

Each phase prints wall seconds and CPU seconds (``time.process_time``: on a
shared machine the wall time also counts other processes), and the ratio
of verify speed to recording speed in the same run (1.0: as fast).

Targets (issue 10): verify at least as fast as recording the same run;
recovery of a 1 M-record run under 2 s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tiffany.durable import Runtime, verify  # noqa: E402
from tiffany.kernel import NewTask, WaitTask  # noqa: E402
from tiffany.wal import iter_records  # noqa: E402


def spinner(n: int) -> object:
    for _ in range(n):
        yield
    return n


def workload(tasks: int, yields: int) -> object:
    tids = []
    for _ in range(tasks):
        tids.append((yield NewTask(spinner(yields))))
    total = 0
    for t in tids:
        total += yield WaitTask(t)
    return total


class Timer:
    """Wall and CPU seconds of a ``with`` block."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def cut_tail(src: Path, cut: Path, keep: int) -> None:
    """Copy the data dir ``src`` to ``cut`` with only its first ``keep`` records."""
    shutil.copytree(src, cut)
    last = None
    for i, rec in enumerate(iter_records(src / "wal")):
        if i == keep:
            last = rec
            break
    assert last is not None
    seg = Path(last.segment)
    seg = seg if seg.is_absolute() else src / "wal" / seg
    for p in (cut / "wal").iterdir():
        if p.suffix == seg.suffix and p.name > seg.name:
            p.unlink()
    with open(cut / "wal" / seg.name, "r+b") as f:
        f.truncate(last.offset)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--tasks", type=int, default=100)
    args = ap.parse_args()
    yields = max(1, args.records // args.tasks)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "src"
        with Runtime(src) as rt, Timer() as record:
            run_id = rt.submit("replay:workload", args.tasks, yields)
            rt.run()
        with Timer() as check:
            report = verify(src, run_id)
        assert report.ok, report.to_dict()
        total = report.records
        cut = Path(d) / "cut"
        cut_tail(src, cut, int(total * 0.99))  # a crash just before the end
        with Timer() as opened:
            rt = Runtime(cut)
        with rt:
            with Timer() as load:
                rt.recover()
            with Timer() as finish:
                rt.run()
            assert rt.status(run_id).status == "succeeded"
    rows = [
        ("record (live, fsync batch)", record),
        ("verify (scan + load + replay + check)", check),
        ("recover: open (Runtime: WAL check + one pass)", opened),
        ("recover: decode (Runtime.recover)", load),
        ("recover: replay 99% + finish live (run)", finish),
    ]
    print(f"\nreplay: one run, {args.tasks} tasks, {total:,} journal records")
    print(f"{'phase':<42}{'wall s':>8}{'records/s':>12}{'cpu s':>8}{'records/cpu s':>15}")
    for label, t in rows:
        print(
            f"{label:<42}{t.wall:>8.2f}{total / t.wall:>12,.0f}{t.cpu:>8.2f}{total / t.cpu:>15,.0f}"
        )
    recover_wall = opened.wall + load.wall + finish.wall
    recover_cpu = opened.cpu + load.cpu + finish.cpu
    print(
        f"{'recover, in all (open + load + finish)':<42}"
        f"{recover_wall:>8.2f}{total / recover_wall:>12,.0f}",
        end="",
    )
    print(f"{recover_cpu:>8.2f}{total / recover_cpu:>15,.0f}")
    print(
        f"verify speed / record speed: {record.wall / check.wall:.2f} (wall), "
        f"{record.cpu / check.cpu:.2f} (cpu); target >= 1.0"
    )
    print(f"recovery: {recover_wall:.2f} s wall, {recover_cpu:.2f} s cpu; target < 2 s")


if __name__ == "__main__":
    main()
