"""Record golden data dirs whose journals hold the engine's own signals, with a release's code.

    git archive <release commit> | tar -x -C /tmp/release
    PYTHONPATH=/tmp/release python tests/data/make_signals_golden.py NAME

``tiffany`` is imported from ``PYTHONPATH`` (the released code, not this
tree's), so the journals are honestly what that release wrote: a sub-plan's
end reached its parent as the signal ``child:<child run id>`` (signal id
``end:<child run id>``), and a limited run's slot as ``concurrency.slot``.
Two data dirs are written:

* ``NAME``: every run finished: ``golden-parent`` (a ``plan.run`` step, its
  child ``golden-parent.sub.1``), ``golden-holder`` and ``golden-queued``
  (one concurrency key, limit 1: the second waited for the first's slot).
  ``tests/durable/test_golden.py`` replays each with the current code.
* ``inflight_NAME``: killed by SIGKILL while ``inflight-parent``'s child
  sleeps and ``inflight-queued`` waits for the slot ``inflight-holder``
  holds (sleeping too). ``tests/durable/test_upgrade.py`` recovers it with
  the current code: the child's end must reach its parent, the queued run
  its slot.

Keep every recording (``signals_v2`` was made with main at 235120f, journal
compatibility version 2): an upgrade must replay each of them forever.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
TOOLS = ["file.write", "file.read", "sleep", "plan.run"]


def parent(nap_s: float) -> dict[str, Any]:
    """A plan whose step ``sub`` runs a child plan (a write, a durable sleep, a read)."""
    kid = {
        "name": "kid",
        "inputs": {"who": "nobody"},
        "steps": [
            {
                "id": "w",
                "tool": "file.write",
                "args": {"path": "k.txt", "content": "${inputs.who}"},
            },
            {"id": "nap", "tool": "sleep", "args": {"seconds": nap_s}, "after": ["w"]},
            {"id": "r", "tool": "file.read", "args": {"path": "k.txt"}, "after": ["nap"]},
        ],
        "outputs": {"who": "${steps.r.output.content}"},
    }
    return {
        "name": "parent",
        "steps": [
            {"id": "sub", "tool": "plan.run", "args": {"plan": kid, "inputs": {"who": "kid"}}},
            {
                "id": "after",
                "tool": "file.write",
                "args": {"path": "who.txt", "content": "${steps.sub.output.who}"},
                "after": ["sub"],
            },
        ],
        "outputs": {"who": "${steps.sub.output.who}"},
    }


def limited(nap_s: float) -> dict[str, Any]:
    """A plan of concurrency key ``golden`` (limit 1) that sleeps."""
    return {
        "name": "limited",
        "concurrency": {"key": "golden", "limit": 1},
        "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": nap_s}}],
        "outputs": {"done": True},
    }


def child(data_dir: str, inflight: bool) -> None:
    """Submit the runs; finish them all, or die by SIGKILL while the child sleeps."""
    from tiffany.config import Settings
    from tiffany.engine import build
    from tiffany.kernel import Instrument

    class KillWhenAsleep(Instrument):
        def task_blocked(self, task: object, call: object) -> None:
            name = getattr(task, "name", "")
            meta = getattr(task, "meta", None)
            run = getattr(getattr(meta, "run", None), "run_id", "")
            if name == "worker:nap" and run.endswith(".sub.1") and call.kind == "sleep":  # type: ignore[attr-defined]
                os.kill(os.getpid(), signal.SIGKILL)

    settings = Settings(
        data_dir=data_dir,
        enabled_tools=TOOLS,
        wal_fsync="always",
        wal_preallocate=False,
        _env_file=None,
    )
    prefix = "inflight" if inflight else "golden"
    engine = build(settings, instruments=[KillWhenAsleep()] if inflight else [])
    engine.submit_plan(limited(0.5 if inflight else 0.05), run_id=f"{prefix}-holder")
    engine.submit_plan(limited(0.05), run_id=f"{prefix}-queued")
    engine.submit_plan(parent(5.0 if inflight else 0.05), run_id=f"{prefix}-parent")
    engine.runtime.run()
    if inflight:
        raise SystemExit("the runs finished: the kill never came")
    engine.runtime.close()


def record(name: str, inflight: bool) -> None:
    """Record ``tests/data/golden/NAME`` with the ``tiffany`` on PYTHONPATH."""
    out = GOLDEN / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = [sys.executable, __file__, "--child", str(out), "1" if inflight else "0"]
    proc = subprocess.run(argv, check=False, capture_output=True)
    expected = -signal.SIGKILL if inflight else 0
    if proc.returncode != expected:
        raise SystemExit(f"the child exited {proc.returncode}, not {expected}: {proc.stderr!r}")
    (out / "wal" / "LOCK").unlink(missing_ok=True)
    for extra in ("tiffany.db", "tiffany.db-wal", "tiffany.db-shm"):
        (out / extra).unlink(missing_ok=True)
    print("written:", sorted(str(p.relative_to(ROOT)) for p in out.rglob("*") if p.is_file()))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3] == "1")
    else:
        record(sys.argv[1], inflight=False)
        record(f"inflight_{sys.argv[1]}", inflight=True)
