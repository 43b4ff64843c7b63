"""Child process of the memory crash tests: runs a plan or workflow of puts, dies on cue.

python memory_crash_child.py DATA_DIR TARGET_JSON KILL_AFTER_PUT

``TARGET_JSON``: ``{"plan": {...}}`` or ``{"workflow": NAME, "inputs": {...}}``,
started as run ``mem-run``. The engine is built as ``tiffany run`` builds
it; its store is wrapped so that the process SIGKILLs itself in the
thread of the ``KILL_AFTER_PUT``-th put, right after the store committed it
and before its result goes back to the loop to be journaled: the window
where a write is applied and its step not yet done. 0: no kill.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory_flows  # noqa: F401 - registers the test workflows

from tiffany.agents.registry import ToolRegistry
from tiffany.config import Settings
from tiffany.engine import build

RUN_ID = "mem-run"


class KillAfterPut:
    """Stands for the engine's store; dies right after its ``n``-th put is applied."""

    def __init__(self, store: Any, n: int) -> None:
        self._store, self._n, self._puts = store, n, 0
        self._lock = threading.Lock()

    def put(self, *args: Any, **kw: Any) -> Any:
        result = self._store.put(*args, **kw)
        with self._lock:
            self._puts += 1
            if self._puts == self._n:
                os.kill(os.getpid(), signal.SIGKILL)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def main() -> int:
    data_dir, target, kill_after = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    engine = build(Settings(data_dir=data_dir), enabled_tools=ToolRegistry.default().all_names())
    engine.env.memory = KillAfterPut(engine.env.memory, kill_after)
    with engine.runtime as rt:
        if "plan" in target:
            run_id = engine.submit_plan(target["plan"], run_id=RUN_ID)
        else:
            entry, name = engine.prepare_workflow(target["workflow"], target.get("inputs") or {})
            run_id = engine.start_entry(entry, run_id=RUN_ID, name=name)
        rt.run()
        print(json.dumps({"status": rt.status(run_id).status}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
