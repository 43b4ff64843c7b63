"""Plan throughput: steps/s of journaled plans, against DBOS and LangGraph, same run.

    python bench/plans.py [--steps 1000] [--no-peers]

Tiffany: a plan of ``--steps`` trivial ``python`` steps, (1) chained (each
``after`` the previous; every step's result feeds the next) and (2) fanned
out (all independent), run by the engine with the WAL's fsync policy
``batch``: planner, workers and steps, all journaled (a python step without
a timeout runs in its worker, without a tool task). The trivial function is
registered ``inline=True`` (a quick function that never blocks: its step is
called on the loop's thread at the commit point, after its STEP_START is
durable, instead of in the thread pool); the ``fan-out (pool)`` row runs the
same fan-out with the function registered without it, through the pool.

Peers, each in its own virtual environment under ``bench/.envs`` (created
on first use from PyPI): DBOS 3.4 on SQLite (``dbos_driver.py``: one
workflow of sequential steps, and concurrent workflows) and LangGraph with
its SQLite checkpointer (``langgraph_driver.py``: a node looping through a
conditional edge, and a ``Send`` fan-out).

Every measurement runs in a fresh process, Tiffany's as the peers' (each
Tiffany workload is a subprocess of this script, ``--workload``): what one
workload leaves on the heap is not collected during the next one's timing
(a full collection of the chain's garbage used to land in the fan-out's 35
ms and halve its figure). ``--repeat N`` (default 3) runs every process N
times and keeps each figure's best, the same for every engine.

Discussion: a chain of dependent steps is bounded by one ``fdatasync`` per
step (step k+1 must not start before step k's result is durable), so no
engine that honours write-ahead can beat the disk's sync latency there;
fan-out is where group commit pays.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tiffany.agents.tools.python import python_tool  # noqa: E402
from tiffany.config import Settings  # noqa: E402
from tiffany.durable import verify  # noqa: E402
from tiffany.engine import build, replay_resolvers  # noqa: E402

ENVS = ROOT / "bench" / ".envs"
PEERS = {
    "dbos": ("dbos==3.4.0", "dbos_driver.py"),
    "langgraph": ("langgraph langgraph-checkpoint-sqlite", "langgraph_driver.py"),
}


@python_tool("bench_inc", inline=True)
def bench_inc(x: int = 0) -> int:
    """The trivial step."""
    return x + 1


python_tool("bench_inc_pool")(bench_inc)  # the same function, through the thread pool


def chain_plan(n: int, fn: str = "bench_inc") -> dict[str, Any]:
    steps = [{"id": "s0", "tool": "python", "args": {"function": fn, "kwargs": {"x": 0}}}]
    for i in range(1, n):
        steps.append(
            {
                "id": f"s{i}",
                "tool": "python",
                "args": {"function": fn, "kwargs": {"x": f"${{steps.s{i - 1}.output}}"}},
                "after": [f"s{i - 1}"],
            }
        )
    return {"name": "chain", "steps": steps, "outputs": {"last": f"${{steps.s{n - 1}.output}}"}}


def fanout_plan(n: int, fn: str = "bench_inc") -> dict[str, Any]:
    steps = [
        {"id": f"s{i}", "tool": "python", "args": {"function": fn, "kwargs": {"x": i}}}
        for i in range(n)
    ]
    return {"name": "fanout", "steps": steps, "outputs": {"last": f"${{steps.s{n - 1}.output}}"}}


def run_tiffany(doc: dict[str, Any], n: int, expect: Any) -> float:
    """Run the plan (timed), then check that its journal replays identically (not timed)."""
    with tempfile.TemporaryDirectory() as d:
        settings = Settings(data_dir=Path(d), wal_fsync="batch")
        engine = build(settings, enabled_tools=["python"])
        try:
            run_id = engine.submit_plan(doc)
            t0 = time.perf_counter()
            engine.runtime.run()
            elapsed = time.perf_counter() - t0
            state = engine.runtime.status(run_id)
            assert state.status == "succeeded", state.error
            assert state.result["outputs"]["last"] == expect
        finally:
            engine.runtime.close()
        report = verify(Path(d), run_id, resolvers=replay_resolvers(settings))
        assert report.ok, report.to_dict()
    return n / elapsed


def peer(name: str, *args: str) -> dict[str, float] | None:
    spec, script = PEERS[name]
    env = ENVS / name
    python = env / "bin" / "python"
    if not python.exists():
        print(f"creating {env} ({spec}, first run only)...", flush=True)
        venv.create(env, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *spec.split()], check=True)
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run(
            [str(python), str(ROOT / "bench" / script), d, *args],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        print(f"{name} failed: {proc.stderr[-1500:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


WORKLOADS = {
    "chain": lambda n: chain_plan(n),
    "fan-out": lambda n: fanout_plan(n),
    "fan-out (pool)": lambda n: fanout_plan(n, "bench_inc_pool"),
}


def tiffany(workload: str, n: int) -> float:
    """Run one Tiffany workload in a fresh process; return its steps/s."""
    proc = subprocess.run(
        [sys.executable, __file__, "--workload", workload, "--steps", str(n)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["steps_per_s"])


def best(runs: list[dict[str, float] | None]) -> dict[str, float] | None:
    """Each figure's best over the runs (None if every run failed)."""
    ok = [r for r in runs if r]
    return {k: max(r[k] for r in ok) for k in ok[0]} if ok else None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs per process, best kept")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.steps
    if args.workload:  # a child process: one measurement
        rate = run_tiffany(WORKLOADS[args.workload](n), n, n)
        print(json.dumps({"steps_per_s": rate}))
        return
    reps = range(max(1, args.repeat))
    chain, fan, fan_pool = (max(tiffany(w, n) for _ in reps) for w in WORKLOADS)
    lg = dbos = None
    if not args.no_peers:
        lg = best([peer("langgraph", str(n)) for _ in reps])
        dbos_args = (str(min(n, 2000)), "20", str(max(1, n // 20)))
        dbos = best([peer("dbos", *dbos_args) for _ in reps])
    nan = float("nan")
    print(
        f"\nplans: {n} trivial python steps, Tiffany engine (WAL fsync batch) vs peers, "
        f"steps/s, best of {len(reps)} (each run a fresh process)"
    )
    print(
        f"{'workload':<16}{'tiffany':>10}{'langgraph':>11}{'dbos':>9}{'/langgraph':>12}{'/dbos':>8}"
    )
    rows = (
        (
            "chain",
            chain,
            (lg or {}).get("chain_steps_per_s", nan),
            (dbos or {}).get("sequential_steps_per_s", nan),
        ),
        (
            "fan-out",
            fan,
            (lg or {}).get("fanout_steps_per_s", nan),
            (dbos or {}).get("concurrent_steps_per_s", nan),
        ),
        (
            "fan-out (pool)",
            fan_pool,
            (lg or {}).get("fanout_steps_per_s", nan),
            (dbos or {}).get("concurrent_steps_per_s", nan),
        ),
    )
    for label, t, lgv, db in rows:
        print(f"{label:<16}{t:>10,.0f}{lgv:>11,.0f}{db:>9,.0f}{t / lgv:>11.1f}x{t / db:>7.1f}x")


if __name__ == "__main__":
    main()
