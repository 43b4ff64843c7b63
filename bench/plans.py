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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    n = args.steps
    chain = run_tiffany(chain_plan(n), n, n)
    fan = run_tiffany(fanout_plan(n), n, n)
    fan_pool = run_tiffany(fanout_plan(n, "bench_inc_pool"), n, n)
    lg = None if args.no_peers else peer("langgraph", str(n))
    dbos = None if args.no_peers else peer("dbos", str(min(n, 2000)), "20", str(max(1, n // 20)))
    nan = float("nan")
    print(f"\nplans: {n} trivial python steps, Tiffany engine (WAL fsync batch) vs peers, steps/s")
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
