"""Child process of the crash tests: runs a plan on the engine, dies on cue.

python plan_crash_child.py DATA_DIR PLAN_JSON KILL_AT_DISPATCH

Every tool is enabled and the test ``python`` functions are registered, so
one child serves the shell/sleep example crash test and the python-step one.
Tests call :func:`run_child`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import python_steps  # noqa: F401 - registers the test functions

from tiffany.agents.registry import ToolRegistry
from tiffany.config import Settings
from tiffany.engine import build
from tiffany.kernel import Instrument


class KillAt(Instrument):
    def __init__(self, n: int) -> None:
        self.n, self.count = n, 0

    def after_dispatch(self, task, yielded) -> None:
        self.count += 1
        if self.count == self.n:
            os.kill(os.getpid(), signal.SIGKILL)


def run_child(
    data_dir: Path, plan: dict, kill_at: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run this file as a child process on ``data_dir`` (it dies at dispatch ``kill_at``)."""
    return subprocess.run(
        [sys.executable, __file__, str(data_dir), json.dumps(plan), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def main() -> int:
    data_dir, plan, kill_at = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    engine = build(
        Settings(data_dir=data_dir),
        enabled_tools=ToolRegistry.default().all_names(),
        instruments=[KillAt(kill_at)],
    )
    with engine.runtime as rt:
        run_id = engine.submit_plan(plan, run_id="plan-run")
        rt.run()
        print(json.dumps({"status": rt.status(run_id).status}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
