"""Child process of the kill -9 test: runs the appenders workload, dies on cue.

    python crash_child.py DATA_DIR OUT_PATH KILL_AT

Kills itself with SIGKILL after dispatch number KILL_AT (0: never) and
prints the result as JSON when it survives. With ``CRASH_PG_URL`` and
``CRASH_PG_STREAM`` set, journals into that PostgreSQL stream (lease of
``CRASH_PG_LEASE_S`` seconds) instead of DATA_DIR's WAL.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiffany.durable import Runtime
from tiffany.kernel import Instrument

RUN_ID = "crash-run"
WORKERS = 4
STEPS = 8


class KillAt(Instrument):
    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0

    def after_dispatch(self, task, yielded) -> None:
        self.count += 1
        if self.count == self.n:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    data_dir, out_path, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    url = os.environ.get("CRASH_PG_URL")
    log = None
    if url:
        from tiffany.wal.pg import PgLog

        lease_s = float(os.environ.get("CRASH_PG_LEASE_S", "1"))
        log = PgLog.open(url, os.environ["CRASH_PG_STREAM"], lease_s=lease_s)
    with Runtime(data_dir, log=log) as rt:
        counter = KillAt(kill_at)
        rt.sched.add_instrument(counter)
        rt.submit("durable_workloads:appenders", out_path, WORKERS, STEPS, run_id=RUN_ID)
        rt.run()
        state = rt.status(RUN_ID)
        print(
            json.dumps(
                {"status": state.status, "result": state.result, "dispatches": counter.count}
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
