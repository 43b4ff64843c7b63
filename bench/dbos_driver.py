"""DBOS side of bench/durable_steps.py; runs inside the bench's DBOS environment.

    python dbos_driver.py WORKDIR SEQ_STEPS RUNS STEPS_PER_RUN [sqlite|postgres] [WARMUP]

WARMUP (default 0): the steps of a sequential workflow run first and not
timed, as bench/workflows.py warms Tiffany up.

Prints one JSON object: sequential steps/s and concurrent steps/s, and the
system database's durability settings as DBOS's own connections read them
(:func:`durability`).

DBOS records each step's outcome in its own transaction on the system
database before the step call returns (``record_operation_result``), so a
step's result is durable before the next step starts when a commit is
synced: on SQLite, ``synchronous`` FULL (DBOS sets no journal mode or
``synchronous``, only ``busy_timeout`` and ``foreign_keys``; both come from
the SQLite build, FULL and ``delete`` here); on PostgreSQL,
``synchronous_commit`` on (its default) with ``fsync`` on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib.metadata import version
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig

#: What SQLite's ``PRAGMA synchronous`` returns, by value.
SQLITE_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def durability(dbos: Any, backend: str) -> dict[str, str]:
    """The system database's commit settings, read on a connection of DBOS's engine."""
    engine = dbos._sys_db.engine  # no public accessor; a read-only look
    with engine.connect() as c:
        if backend == "sqlite":
            mode = c.execute(sa.text("PRAGMA journal_mode")).scalar()
            sync = c.execute(sa.text("PRAGMA synchronous")).scalar()
            return {"journal_mode": str(mode), "synchronous": SQLITE_SYNCHRONOUS[int(sync)]}
        return {
            "synchronous_commit": str(c.execute(sa.text("SHOW synchronous_commit")).scalar()),
            "fsync": str(c.execute(sa.text("SHOW fsync")).scalar()),
        }


def main() -> None:
    workdir, seq_steps, runs, per_run = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    backend = sys.argv[5] if len(sys.argv) > 5 else "sqlite"
    warmup = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    url = (
        f"sqlite:///{os.path.join(workdir, 'dbos.sqlite')}"
        if backend == "sqlite"
        else "postgresql://postgres@127.0.0.1:5432/dbos_bench"
    )
    config: DBOSConfig = {
        "name": "tiffany-bench",
        "system_database_url": url,
        "log_level": "WARNING",
    }
    dbos = DBOS(config=config)

    @DBOS.step()
    def trivial(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    def sequential(n: int) -> int:
        total = 0
        for i in range(n):
            total += trivial(i)
        return total

    DBOS.launch()
    settings = durability(dbos, backend)
    if warmup:
        assert sequential(warmup) == sum(range(1, warmup + 1))
    t0 = time.perf_counter()
    assert sequential(seq_steps) == sum(range(1, seq_steps + 1))
    seq_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    handles = [DBOS.start_workflow(sequential, per_run) for _ in range(runs)]
    for h in handles:
        assert h.get_result() == sum(range(1, per_run + 1))
    conc_s = time.perf_counter() - t0
    DBOS.destroy()
    print(
        json.dumps(
            {
                "backend": backend,
                "sequential_steps_per_s": seq_steps / seq_s,
                "concurrent_steps_per_s": runs * per_run / conc_s,
                "concurrent_workflows_per_s": runs / conc_s,
                "version": version("dbos"),
                **settings,
            }
        )
    )


# -- bench/signals.py: a message round trip (DBOS.send -> the workflow resumed after recv) ----


def _machine_busy_s() -> float:
    """CPU seconds all processes on the machine have used (user + system, /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
        return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return float("nan")


def signals_main() -> None:
    """The DBOS cell of bench/signals.py (run by it; not through :func:`main`).

        python -c 'import dbos_driver; dbos_driver.signals_main()' URL RUNS CONCURRENCY WARMUP

    Each round trip: start a workflow that ``DBOS.recv("approve")``s, then runs
    a trivial step; wait until DBOS lists the recv's timeout record
    (``DBOS.sleep`` in ``list_workflow_steps``: recv is past its set-up and
    waits on its event); then ``DBOS.send`` the message from outside any
    workflow. The workflow writes ``time.perf_counter()`` right after recv
    returns (same process, same clock). Prints one JSON object: the sends'
    latencies and the send -> resumed times, in seconds, and the loop's wall
    and CPU seconds.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    url, runs, concurrency, warmup = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    config: DBOSConfig = {
        "name": "tiffany-bench-signals",
        "system_database_url": url,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    resumed: dict[str, float] = {}
    cond = threading.Condition()

    @DBOS.step()
    def after_approval() -> int:
        return 1

    @DBOS.workflow()
    def approval() -> object:
        message = DBOS.recv("approve", timeout_seconds=3600)
        at = time.perf_counter()
        with cond:
            resumed[str(DBOS.workflow_id)] = at
            cond.notify_all()
        after_approval()
        return message

    def waiting(workflow_id: str) -> bool:
        steps = DBOS.list_workflow_steps(workflow_id, load_output=False)
        return any(s["function_name"] == "DBOS.sleep" for s in steps)

    def one() -> tuple[float, float, object]:
        handle = DBOS.start_workflow(approval)
        wid = handle.get_workflow_id()
        deadline = time.monotonic() + 60
        while not waiting(wid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"workflow {wid} never waited in recv")
            time.sleep(0.005)
        t0 = time.perf_counter()
        DBOS.send(wid, {"ok": True}, "approve")
        t1 = time.perf_counter()
        with cond:
            if not cond.wait_for(lambda: wid in resumed, timeout=60):
                raise RuntimeError(f"workflow {wid} did not resume within 60 s")
            at = resumed[wid]
        return t1 - t0, at - t0, handle

    def loop(count: int) -> list[tuple[float, float, object]]:
        return [one() for _ in range(count)]

    DBOS.launch()
    for _ in range(warmup):
        one()
    shares = [
        runs // concurrency + (1 if i < runs % concurrency else 0) for i in range(concurrency)
    ]
    cpu0, busy0, t0 = time.process_time(), _machine_busy_s(), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = [r for part in pool.map(loop, shares) for r in part]
    wall = time.perf_counter() - t0
    cpu, busy = time.process_time() - cpu0, _machine_busy_s() - busy0
    for _, _, handle in done:
        handle.get_result()  # type: ignore[attr-defined]
    DBOS.destroy()
    print(
        json.dumps(
            {
                "runs": len(done),
                "send": [s for s, _, _ in done],
                "roundtrip": [r for _, r, _ in done],
                "wall_s": wall,
                "cpu_process_s": cpu,
                "cpu_machine_s": busy,
            }
        )
    )


if __name__ == "__main__":
    main()
