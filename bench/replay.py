"""Replay speed: journal records replayed per second, and recovery time.

    python bench/replay.py [--records 1000000]

Records a run whose tasks yield cooperatively (one DISPATCH record per
dispatch, about ``--records`` records in all), then measures:

* verify: scan the WAL, load the run, re-run it against the journal with
  every dispatch checked (``tiffany replay --verify``);
* recovery: the same run with its last records cut off, as after a crash:
  ``Runtime.recover()`` then replay until the run goes live and finishes.

Target (issue 3): at least 200k records/s, recovery of 1 M records under 5 s.
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

from tiffany.durable import Runtime, scan, verify  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--tasks", type=int, default=100)
    args = ap.parse_args()
    yields = max(1, args.records // args.tasks)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "src"
        t0 = time.perf_counter()
        with Runtime(src) as rt:
            run_id = rt.submit("replay:workload", args.tasks, yields)
            rt.run()
        record_s = time.perf_counter() - t0
        n = scan(src / "wal").get(run_id)
        t0 = time.perf_counter()
        report = verify(src, run_id)
        verify_s = time.perf_counter() - t0
        assert report.ok, report.to_dict()
        total = report.records
        # a crash just before the end: drop the last 1% of the records
        keep = int(total * 0.99)
        cut = Path(d) / "cut"
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
        t0 = time.perf_counter()
        with Runtime(cut) as rt:
            rt.recover()
            rt.run()
            assert rt.status(run_id).status == "succeeded"
        recover_s = time.perf_counter() - t0
        del n
    print(f"\nreplay: one run, {args.tasks} tasks, {total:,} journal records")
    print(f"{'phase':<40}{'seconds':>10}{'records/s':>14}")
    print(f"{'record (live, fsync batch)':<40}{record_s:>10.2f}{total / record_s:>14,.0f}")
    print(
        f"{'verify (scan + load + replay + check)':<40}{verify_s:>10.2f}{total / verify_s:>14,.0f}"
    )
    print(f"{'recover 99% + finish live':<40}{recover_s:>10.2f}{total / recover_s:>14,.0f}")


if __name__ == "__main__":
    main()
