"""Child process of the python-step crash test: runs a plan of python steps, dies on cue.

python python_crash_child.py DATA_DIR PLAN_JSON KILL_AT_DISPATCH
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import python_steps  # noqa: F401 - registers the functions

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


def main() -> int:
    data_dir, plan, kill_at = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    engine = build(
        Settings(data_dir=data_dir), enabled_tools=["python"], instruments=[KillAt(kill_at)]
    )
    with engine.runtime as rt:
        engine.submit_plan(plan, run_id="plan-run")
        rt.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
