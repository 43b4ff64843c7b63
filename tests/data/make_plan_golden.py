"""Record a golden data dir of plan runs (and one workflow run) with a release's code.

    git archive <release commit> | tar -x -C /tmp/release
    PYTHONPATH=/tmp/release:tests/data python tests/data/make_plan_golden.py NAME

``tiffany`` is imported from ``PYTHONPATH`` (the released code, not this
tree's), so the journal is what that release wrote for entries of kind
``plan`` (and ``workflow``). ``tests/data/golden/NAME`` holds, all finished:

* ``golden-plan``: a plan with inputs (defaults and given), a budget, the
  engine's ``limits`` (``max_steps``), a write and a read;
* ``golden-limited``: a plan of concurrency key ``golden`` (limit 1);
* ``golden-rerun``: a re-run of ``golden-plan`` from step ``r``: its entry
  carries ``rerun_of`` and ``reuse`` (step ``w``'s output, packed), built
  as the engine's ``rerun`` builds it;
* ``golden-flow``: a run of the workflow ``golden.flow``
  (``tests/data/golden_flows.py``: steps, a tool call, ``Now()``).

``tests/durable/test_plan_golden.py`` replays each with ``--verify`` under
the current code. Keep every recording (``plans_v3`` was made with main at
08385b2, before a plan run became the built-in workflow ``plan``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
TOOLS = ["file.write", "file.read", "sleep"]

PLAN: dict[str, Any] = {
    "name": "golden-plan",
    "inputs": {"who": "nobody", "greeting": "hello"},
    "budget": {"tokens": 5000},
    "steps": [
        {"id": "w", "tool": "file.write", "args": {"path": "w.txt", "content": "${inputs.who}"}},
        {"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}, "after": ["w"]},
        {"id": "r", "tool": "file.read", "args": {"path": "w.txt"}, "after": ["nap"]},
    ],
    "outputs": {"said": "${inputs.greeting}", "who": "${steps.r.output.content}"},
}

LIMITED: dict[str, Any] = {
    "name": "limited",
    "concurrency": {"key": "golden", "limit": 1},
    "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}}],
    "outputs": {"done": True},
}


def child(data_dir: str) -> None:
    """Run the four runs to their ends with the ``tiffany`` on PYTHONPATH."""
    import golden_flows  # noqa: F401 - registers golden.flow

    from tiffany.config import Settings
    from tiffany.engine import build
    from tiffany.wire.values import pack_value

    settings = Settings(
        data_dir=data_dir,
        enabled_tools=TOOLS,
        wal_fsync="always",
        wal_preallocate=False,
        _env_file=None,
    )
    engine = build(settings)
    engine.submit_plan(PLAN, {"who": "golden"}, run_id="golden-plan")
    engine.submit_plan(LIMITED, run_id="golden-limited")
    entry, name = engine.prepare_workflow("golden.flow", {"n": 3})
    engine.start_entry(entry, run_id="golden-flow", name=name)
    engine.runtime.run()
    entry, name = engine.prepare_plan(PLAN, {"who": "golden"})
    entry["rerun_of"] = {"run_id": "golden-plan", "restart": ["r"]}
    entry["reuse"] = {
        "w": {"run_id": "golden-plan", "seq": 7, "output": pack_value({"path": "w.txt"})},
        "nap": {"run_id": "golden-plan", "seq": 11, "output": pack_value({"slept": 0.01})},
    }
    engine.start_entry(entry, run_id="golden-rerun", name=name)
    engine.runtime.run()
    engine.runtime.close()


def record(name: str) -> None:
    """Record ``tests/data/golden/NAME`` with the ``tiffany`` on PYTHONPATH."""
    out = GOLDEN / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = [sys.executable, __file__, "--child", str(out)]
    proc = subprocess.run(argv, check=False, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"the child exited {proc.returncode}: {proc.stderr!r}")
    (out / "wal" / "LOCK").unlink(missing_ok=True)
    for extra in ("tiffany.db", "tiffany.db-wal", "tiffany.db-shm"):
        (out / extra).unlink(missing_ok=True)
    shutil.rmtree(out / "workspaces", ignore_errors=True)
    print("written:", sorted(str(p.relative_to(ROOT)) for p in out.rglob("*") if p.is_file()))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        record(sys.argv[1])
