"""DBOS side of bench/durable_steps.py; runs inside the bench's DBOS environment.

    python dbos_driver.py WORKDIR SEQ_STEPS RUNS STEPS_PER_RUN [sqlite|postgres]

Prints one JSON object: sequential steps/s and concurrent steps/s.
"""

from __future__ import annotations

import json
import os
import sys
import time

from dbos import DBOS, DBOSConfig


def main() -> None:
    workdir, seq_steps, runs, per_run = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    backend = sys.argv[5] if len(sys.argv) > 5 else "sqlite"
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
    DBOS(config=config)

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
            }
        )
    )


if __name__ == "__main__":
    main()
