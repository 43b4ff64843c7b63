"""Regenerate the golden journals under tests/data/golden (run from the repo root).

    python tests/data/make_golden.py

* ``fan_in``: a run of ``durable_workloads:fan_in(3)`` (spawns, a queue,
  joins, sleeps, steps, ``Now()``, ``Random()``): must replay identically.
* ``nondeterministic``: ``durable_workloads:moody(4)`` recorded with
  ``TIFFANY_GOLDEN_MODE=b``; the tests replay it in mode ``a``, where the
  code takes another path, and expect ``NondeterminismError``.

Regenerate only on purpose (a WAL format or journal schema change): the
point of a golden journal is that old histories keep replaying. Keep the
previous recordings beside the new ones under a suffix (``fan_in_v1``,
``nondeterministic_v1``: written before a NewTask, Now(), Random() or Step
dispatch was carried by its SPAWN, OUTCOME or STEP_START record), and keep
testing that they replay.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "durable"))
sys.path.insert(0, str(ROOT))

import durable_workloads  # noqa: E402

from tiffany.durable import Runtime  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "golden"


def record(name: str, target: str, *args: object, mode: str = "a") -> None:
    out = GOLDEN / name
    shutil.rmtree(out, ignore_errors=True)
    durable_workloads.MODE["value"] = mode
    with Runtime(out, fsync="always") as rt:
        rt.submit(target, *args, run_id=f"golden-{name}")
        rt.run()
    (out / "wal" / "LOCK").unlink()


if __name__ == "__main__":
    record("fan_in", "durable_workloads:fan_in", 3)
    record("nondeterministic", "durable_workloads:moody", 4, mode="b")
    print("written:", sorted(str(p.relative_to(ROOT)) for p in GOLDEN.rglob("*.wal")))
