"""What a step's trip to the thread pool costs the kernel alone: no journal, no disk.

A chain of ``--steps`` calls of a trivial function, each the previous one's
result: ``yield RunInThread(fn, x)`` (the pool: the loop hands the call to a
worker thread and sleeps in epoll until the worker's eventfd wakes it), and
the same call made inline by the task. Per step: wall and CPU microseconds
(user and system), and the voluntary context switches of the process. The
difference is the hand-off a durable ``Step(fn)`` pays over ``Step(fn,
inline=True)`` (bench/workflows.py, part 4):

    .venv/bin/python bench/pool_handoff.py
    .venv/bin/python bench/pool_handoff.py --steps 50000 --repeat 5

Prints the best and the worst of ``--repeat`` runs of each; asserts nothing.
"""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

from tiffany.kernel import RunInThread, Scheduler


def trivial(x: int) -> int:
    """The step's function: as cheap as a function gets."""
    return x + 1


def _chain(steps: int, pool: bool) -> Any:
    x = 0
    for _ in range(steps):
        x = (yield RunInThread(trivial, x)) if pool else trivial(x)
        if not pool:
            yield
    if x != steps:
        raise AssertionError(f"the chain ended at {x}, not {steps}")


def run(steps: int, pool: bool) -> dict[str, float]:
    """One chain in a fresh scheduler: per-step wall, CPU, user, sys (us), context switches."""
    sched = Scheduler()
    sched.spawn(_chain(steps, pool))
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    sched.run()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    sched.close()
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    return {
        "wall": 1e6 * wall / steps,
        "cpu": 1e6 * (user + system) / steps,
        "user": 1e6 * user / steps,
        "sys": 1e6 * system / steps,
        "switches": (r1.ru_nvcsw - r0.ru_nvcsw) / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"a chain of {args.steps:,} trivial calls, {args.repeat} runs each (best - worst)")
    heads = " ".join(f"{h:>14s}" for h in ("wall us", "cpu us", "user us", "sys us"))
    print(f"{'call':34s} {heads} {'csw':>6s}")
    for label, pool in (("inline (a bare yield between)", False), ("RunInThread (the pool)", True)):
        runs = [run(args.steps, pool) for _ in range(args.repeat)]
        cells = []
        for key in ("wall", "cpu", "user", "sys"):
            values = sorted(r[key] for r in runs)
            cells.append(f"{values[0]:.1f} - {values[-1]:.1f}")
        switches = max(r["switches"] for r in runs)
        print(f"{label:34s} " + " ".join(f"{c:>14s}" for c in cells) + f" {switches:6.2f}")
    print("(us: microseconds a step; csw: voluntary context switches a step, the worst run)")


if __name__ == "__main__":
    main()
