"""Record a golden data dir with runs IN FLIGHT, with the code a release shipped.

    git archive <release commit> | tar -x -C /tmp/release
    PYTHONPATH=/tmp/release python tests/data/make_inflight_golden.py NAME

``tiffany`` is imported from ``PYTHONPATH`` (the released code, not this
tree's), so the journal is honestly what that release wrote. A child
process submits two runs and dies by SIGKILL part-way through them:

* ``inflight-plan``: a plan (file.write, a durable sleep, file.read,
  file.write), killed while its ``wait`` step sleeps;
* ``inflight-sleeper``: ``durable_workloads:cancellable(0.5)``, a root
  joining a child in a durable sleep, started before the kill.

``tests/durable/test_upgrade.py`` copies the data dir, recovers it with the
current code and checks that both runs finish with the outputs they would
have had without the crash. Keep every recording (``inflight_v1`` was made
with main at d869a26, journal compatibility version 1; ``inflight_v2`` with
main at 235120f, version 2): an upgrade must replay each of them forever.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
WORKLOADS = ROOT / "tests" / "durable"

PLAN = {
    "name": "inflight",
    "steps": [
        {"id": "a", "tool": "file.write", "args": {"path": "a.txt", "content": "alpha"}},
        {"id": "wait", "tool": "sleep", "args": {"seconds": 0.3}, "after": ["a"]},
        {"id": "b", "tool": "file.read", "args": {"path": "a.txt"}, "after": ["wait"]},
        {
            "id": "c",
            "tool": "file.write",
            "args": {"path": "c.txt", "content": "${steps.b.output.content}!"},
            "after": ["b"],
        },
    ],
    "outputs": {"read": "${steps.b.output.content}"},
}
TOOLS = ["file.write", "file.read", "sleep"]


def child(data_dir: str) -> None:
    """Submit both runs, then die by SIGKILL when the plan's ``wait`` step sleeps."""
    sys.path.insert(0, str(WORKLOADS))
    from tiffany.config import Settings
    from tiffany.engine import build
    from tiffany.kernel import Instrument

    class KillWhenAsleep(Instrument):
        def task_blocked(self, task: object, call: object) -> None:
            if getattr(task, "name", "") == "worker:wait" and getattr(call, "kind", "") == "sleep":
                os.kill(os.getpid(), signal.SIGKILL)

    settings = Settings(data_dir=data_dir, enabled_tools=TOOLS, wal_fsync="always", _env_file=None)
    engine = build(settings, instruments=[KillWhenAsleep()])
    engine.runtime.submit("durable_workloads:cancellable", 0.5, run_id="inflight-sleeper")
    engine.submit_plan(PLAN, run_id="inflight-plan")
    engine.runtime.run()
    raise SystemExit("the run finished: the kill never came")


def record(name: str) -> None:
    """Record ``tests/data/golden/NAME`` with the ``tiffany`` on PYTHONPATH."""
    out = GOLDEN / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(out)], check=False, capture_output=True
    )
    if proc.returncode != -signal.SIGKILL:
        raise SystemExit(f"the child did not die by SIGKILL: {proc.returncode} {proc.stderr!r}")
    (out / "wal" / "LOCK").unlink(missing_ok=True)
    for extra in ("tiffany.db", "tiffany.db-wal", "tiffany.db-shm"):
        (out / extra).unlink(missing_ok=True)
    print("written:", sorted(str(p.relative_to(ROOT)) for p in out.rglob("*") if p.is_file()))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        record(sys.argv[1])
