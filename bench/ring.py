"""The usched ring benchmark: Tiffany's kernel against its peers, in one run.

    python bench/ring.py [--quick] [--sizes 16,400,4000] [--impls tiffany,asyncio] [--journal]

R rings of N coroutines; each ring performs M rounds; in each round a
message goes once around the ring, each coroutine relaying what it receives
from its left neighbour to its right one; a round ends when the message is
back where it started and the next begins there (seed 004). One message per
ring is in flight, so every receive blocks and every message is a switch.
N*R coroutines, N*R*M messages; printed as messages per second and as
ratios, all in one run.

Implementations: Tiffany (``yield q.get()`` / ``q.put()``), Tiffany with one
instrument attached (the slow-dispatch watchdog), asyncio (``asyncio.Queue``),
uvloop (the same code), trio (memory channels), curio (``curio.Queue``), and a
bare generator loop: the practical floor of pure Python (a deque of ready
generators, a mailbox per coroutine, the message sent straight into the
woken generator; no states, no system calls, no instruments).

Also printed: 1,000 tasks each doing 300 cooperative yields (a bare
``yield`` against ``await asyncio.sleep(0)`` and friends), and the memory of
a parked task (100,000 tasks blocked on their own queue, tracemalloc, each
implementation in its own subprocess).

``--journal``: the Tiffany ring as a durable run, every dispatch journaled
to a WAL with fsync policy ``batch`` (issue 3's figure).

Method: each cell runs ``--repeat`` times (best kept), with the garbage
collector collected before and disabled during the timed part, for every
implementation alike. Messages per cell are scaled so a cell takes about a
second for the fast implementations; slow ones (trio, curio) get fewer.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SIZES = (16, 400, 4_000, 40_000, 400_000)
IMPLS = ("tiffany", "tiffany+instr", "asyncio", "uvloop", "trio", "curio", "bare")
#: Messages per cell, by implementation speed class.
FAST_MESSAGES = 1_000_000
SLOW_MESSAGES = 150_000
SLOW = {"trio", "curio"}


# -- Tiffany ----------------------------------------------------------------------


def _tiffany_node(i: int, n: int, m: int, inbox: Any, outbox: Any, counts: list[int]) -> Any:
    if i == 0:
        outbox.put(0)  # the token that goes round
    last = m - 1 if i == 0 else -1
    for k in range(m):
        msg = yield inbox.get()
        if k != last:
            outbox.put(msg)
    counts.append(m)
    return m


def ring_root(r: int, n: int, m: int) -> Any:
    """A whole ring benchmark as one task tree (for the journaled run)."""
    from tiffany.kernel import NewTask, Queue, WaitTask

    counts: list[int] = []
    tids = []
    for _ in range(r):
        qs = [Queue() for _ in range(n)]
        for i in range(n):
            tids.append((yield NewTask(_tiffany_node(i, n, m, qs[i], qs[(i + 1) % n], counts))))
    total = 0
    for t in tids:
        total += yield WaitTask(t)
    return total


def run_tiffany(r: int, n: int, m: int, instrumented: bool = False) -> float:
    from tiffany.kernel import Queue, Scheduler, SlowDispatchWatchdog

    sched = Scheduler(instruments=[SlowDispatchWatchdog()] if instrumented else [])
    counts: list[int] = []
    for _ in range(r):
        qs = [Queue() for _ in range(n)]
        for i in range(n):
            sched.spawn(_tiffany_node(i, n, m, qs[i], qs[(i + 1) % n], counts))
    elapsed = _timed(sched.run)
    _check(sum(counts), r, n, m)
    sched.close()
    return elapsed


def run_tiffany_journal(r: int, n: int, m: int) -> tuple[float, int]:
    from tiffany.durable import Runtime

    with tempfile.TemporaryDirectory() as d, Runtime(d, fsync="batch") as rt:
        run_id = rt.submit("ring:ring_root", r, n, m)
        elapsed = _timed(rt.run)
        _check(rt.status(run_id).result, r, n, m)
        records = rt.wal.durable_seq
    return elapsed, records


# -- asyncio / uvloop -----------------------------------------------------------------


async def _aio_node(i: int, n: int, m: int, inbox: Any, outbox: Any) -> int:
    if i == 0:
        outbox.put_nowait(0)
    last = m - 1 if i == 0 else -1
    for k in range(m):
        msg = await inbox.get()
        if k != last:
            outbox.put_nowait(msg)
    return m


def run_asyncio(r: int, n: int, m: int, use_uvloop: bool = False) -> float:
    async def main() -> float:
        tasks = []
        for _ in range(r):
            qs = [asyncio.Queue() for _ in range(n)]
            for i in range(n):
                tasks.append(asyncio.ensure_future(_aio_node(i, n, m, qs[i], qs[(i + 1) % n])))
        t0 = time.perf_counter()
        counts = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        _check(sum(counts), r, n, m)
        return elapsed

    return _run_async(main, use_uvloop)


def _run_async(main: Callable[[], Any], use_uvloop: bool) -> float:
    gc.collect()
    gc.disable()
    try:
        if use_uvloop:
            import uvloop

            return uvloop.run(main())  # type: ignore[no-any-return]
        return asyncio.run(main())
    finally:
        gc.enable()


# -- trio ---------------------------------------------------------------------------------


def run_trio(r: int, n: int, m: int) -> float:
    import trio

    async def node(i: int, recv: Any, send: Any, out: list[int]) -> None:
        if i == 0:
            send.send_nowait(0)
        last = m - 1 if i == 0 else -1
        for k in range(m):
            msg = await recv.receive()
            if k != last:
                send.send_nowait(msg)
        out.append(m)

    async def main() -> float:
        counts: list[int] = []
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(r):
                chans = [trio.open_memory_channel(math.inf) for _ in range(n)]
                for i in range(n):
                    nursery.start_soon(node, i, chans[i][1], chans[(i + 1) % n][0], counts)
        elapsed = time.perf_counter() - t0
        _check(sum(counts), r, n, m)
        return elapsed

    gc.collect()
    gc.disable()
    try:
        return trio.run(main)  # type: ignore[no-any-return]
    finally:
        gc.enable()


# -- curio --------------------------------------------------------------------------------


def run_curio(r: int, n: int, m: int) -> float:
    import curio

    async def node(i: int, inbox: Any, outbox: Any) -> int:
        if i == 0:
            await outbox.put(0)
        last = m - 1 if i == 0 else -1
        for k in range(m):
            msg = await inbox.get()
            if k != last:
                await outbox.put(msg)
        return m

    async def main() -> float:
        tasks = []
        for _ in range(r):
            qs = [curio.Queue() for _ in range(n)]
            for i in range(n):
                tasks.append(await curio.spawn(node, i, qs[i], qs[(i + 1) % n]))
        t0 = time.perf_counter()
        total = 0
        for t in tasks:
            total += await t.join()
        elapsed = time.perf_counter() - t0
        _check(total, r, n, m)
        return elapsed

    gc.collect()
    gc.disable()
    try:
        return curio.run(main)  # type: ignore[no-any-return]
    finally:
        gc.enable()


# -- the bare generator loop (the floor) -------------------------------------------------


def run_bare(r: int, n: int, m: int) -> float:
    ready: deque[tuple[Any, Any]] = deque()
    waiting: set[Any] = set()
    boxes: dict[Any, deque[Any]] = {}
    counts: list[int] = []

    def send(target: Any, msg: Any) -> None:
        if target in waiting:
            waiting.discard(target)
            ready.append((target, msg))
        else:
            boxes[target].append(msg)

    def node(i: int, right: list[Any]) -> Any:
        if i == 0:
            send(right[0], 0)
        last = m - 1 if i == 0 else -1
        for k in range(m):
            msg = yield
            if k != last:
                send(right[0], msg)
        counts.append(m)

    for _ in range(r):
        cells: list[list[Any]] = [[None] for _ in range(n)]
        gens = [node(i, cells[(i + 1) % n]) for i in range(n)]
        for i, g in enumerate(gens):
            cells[i][0] = g
            boxes[g] = deque()
            ready.append((g, None))

    def loop() -> None:
        popleft, append = ready.popleft, ready.append
        while ready:
            g, v = popleft()
            try:
                g.send(v)
            except StopIteration:
                continue
            box = boxes[g]
            if box:
                append((g, box.popleft()))
            else:
                waiting.add(g)

    elapsed = _timed(loop)
    _check(sum(counts), r, n, m)
    return elapsed


# -- yields -------------------------------------------------------------------------------------


def yields_tiffany(tasks: int, count: int) -> float:
    from tiffany.kernel import Scheduler

    def spin() -> Any:
        for _ in range(count):
            yield

    sched = Scheduler()
    for _ in range(tasks):
        sched.spawn(spin())
    return _timed(sched.run)


def yields_bare(tasks: int, count: int) -> float:
    def spin() -> Any:
        for _ in range(count):
            yield

    ready = deque(spin() for _ in range(tasks))

    def loop() -> None:
        popleft, append = ready.popleft, ready.append
        while ready:
            g = popleft()
            try:
                next(g)
            except StopIteration:
                continue
            append(g)

    return _timed(loop)


def yields_async(tasks: int, count: int, use_uvloop: bool) -> float:
    async def spin() -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    async def main() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(spin() for _ in range(tasks)))
        return time.perf_counter() - t0

    return _run_async(main, use_uvloop)


def yields_trio(tasks: int, count: int) -> float:
    import trio

    async def spin() -> None:
        for _ in range(count):
            await trio.lowlevel.checkpoint()

    async def main() -> float:
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(spin)
        return time.perf_counter() - t0

    return trio.run(main)  # type: ignore[no-any-return]


def yields_curio(tasks: int, count: int) -> float:
    import curio

    async def spin() -> None:
        for _ in range(count):
            await curio.sleep(0)

    async def main() -> float:
        t0 = time.perf_counter()
        ts = [await curio.spawn(spin) for _ in range(tasks)]
        for t in ts:
            await t.join()
        return time.perf_counter() - t0

    return curio.run(main)  # type: ignore[no-any-return]


# -- memory per parked task (run in a subprocess) ----------------------------------------


MEMORY_CODE = r"""
import asyncio, gc, sys, tracemalloc
sys.path.insert(0, {root!r})
impl, n = sys.argv[1], int(sys.argv[2])
gc.collect(); tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
if impl == "tiffany":
    from tiffany.kernel import Queue, Scheduler
    def waiter(q):
        yield q.get()
    sched = Scheduler()
    for _ in range(n):
        sched.spawn(waiter(Queue()))
    sched.run()  # every task parks; run returns (nothing can wake them)
    assert sched.alive == n
elif impl == "asyncio":
    async def waiter(q):
        await q.get()
    async def main():
        tasks = [asyncio.ensure_future(waiter(asyncio.Queue())) for _ in range(n)]
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
        print(tracemalloc.get_traced_memory()[0] - before)
        for t in tasks:
            t.cancel()
    asyncio.run(main())
    raise SystemExit(0)
elif impl == "bare":
    waiting = {{}}
    def waiter():
        yield
    for _ in range(n):
        g = waiter(); next(g); waiting[g] = []
gc.collect()
print(tracemalloc.get_traced_memory()[0] - before)
"""


def memory_per_task(impl: str, n: int) -> float:
    code = MEMORY_CODE.format(root=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code, impl, str(n)], capture_output=True, text=True, check=True
    )
    return int(proc.stdout.strip().splitlines()[-1]) / n


# -- harness ---------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()


def _check(total: int, r: int, n: int, m: int) -> None:
    if total != r * n * m:
        raise AssertionError(f"ring delivered {total} messages, expected {r * n * m}")


RUNNERS: dict[str, Callable[[int, int, int], float]] = {
    "tiffany": run_tiffany,
    "tiffany+instr": lambda r, n, m: run_tiffany(r, n, m, True),
    "asyncio": run_asyncio,
    "uvloop": lambda r, n, m: run_asyncio(r, n, m, True),
    "trio": run_trio,
    "curio": run_curio,
    "bare": run_bare,
}


def _available(impl: str) -> bool:
    mod = {"uvloop": "uvloop", "trio": "trio", "curio": "curio"}.get(impl)
    if mod is None:
        return True
    try:
        __import__(mod)
    except ImportError:
        return False
    return True


#: Past this many coroutines curio takes minutes per cell (its per-task cost
#: grows with the task count): those cells are skipped and printed as nan.
CURIO_MAX_COROUTINES = 40_000


def ring_cell(impl: str, total: int, n: int, repeat: int, scale: float) -> float:
    if impl == "curio" and total > CURIO_MAX_COROUTINES:
        return math.nan
    r = max(1, total // n)
    budget = (SLOW_MESSAGES if impl in SLOW else FAST_MESSAGES) * scale
    m = max(1, int(budget // (r * n)))
    best = min(RUNNERS[impl](r, n, m) for _ in range(repeat))
    return r * n * m / best


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes and budgets (a smoke run)")
    ap.add_argument("--sizes", help="comma-separated coroutine counts")
    ap.add_argument("--impls", help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--journal", action="store_true", help="also the journaled Tiffany ring")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(SIZES)
    scale = 0.1 if args.quick else 1.0
    if args.quick and not args.sizes:
        sizes = [16, 4_000]
    impls = [i for i in (args.impls.split(",") if args.impls else IMPLS) if _available(i)]
    results: dict[str, Any] = {"ring": {}, "yields": {}, "memory": {}, "journal": {}}
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    print(f"Python {platform.python_version()} on {cpu}, {time.strftime('%Y-%m-%d %H:%M')}")
    for n in (2, 8):
        print(f"\nring, N={n}: messages/s (M), and Tiffany's ratio to each")
        head = f"{'coroutines':>10}" + "".join(f"{i:>14}" for i in impls)
        others = [i for i in impls if not i.startswith("tiffany")]
        head += "".join(f"{'/' + i:>10}" for i in others)
        if "tiffany+instr" in impls and "asyncio" in impls:
            head += f"{'instr/aio':>10}"
        print(head)
        for total in sizes:
            if total < n:
                continue
            rep = 1 if total >= 400_000 else args.repeat
            row = {i: ring_cell(i, total, n, rep, scale) for i in impls}
            results["ring"][f"N={n},total={total}"] = row
            line = f"{total:>10}" + "".join(f"{row[i] / 1e6:>14.3f}" for i in impls)
            if "tiffany" in row:
                line += "".join(f"{row['tiffany'] / row[i]:>10.2f}" for i in others)
            if "tiffany+instr" in row and "asyncio" in row:
                line += f"{row['tiffany+instr'] / row['asyncio']:>10.2f}"
            print(line, flush=True)
    tasks, count = 1_000, 300
    print(f"\nyields: {tasks} tasks x {count} cooperative yields, switches/s (M)")
    yrow: dict[str, float] = {}
    ycalls: dict[str, Callable[[], float]] = {
        "tiffany": lambda: yields_tiffany(tasks, count),
        "asyncio": lambda: yields_async(tasks, count, False),
        "uvloop": lambda: yields_async(tasks, count, True),
        "trio": lambda: yields_trio(tasks, count),
        "curio": lambda: yields_curio(tasks, count),
        "bare": lambda: yields_bare(tasks, count),
    }
    for name, fn in ycalls.items():
        if _available(name):
            yrow[name] = tasks * count / min(fn() for _ in range(args.repeat))
    results["yields"] = yrow
    print(
        "".join(f"{k:>12}" for k in yrow)
        + "".join(f"{'tiffany/' + k:>16}" for k in yrow if k != "tiffany")
    )
    print(
        "".join(f"{v / 1e6:>12.3f}" for v in yrow.values())
        + "".join(f"{yrow['tiffany'] / v:>16.2f}" for k, v in yrow.items() if k != "tiffany")
    )
    if not args.no_memory:
        n_tasks = 100_000
        print(f"\nmemory per parked task ({n_tasks:,} tasks, tracemalloc, bytes)")
        for impl in ("tiffany", "asyncio", "bare"):
            results["memory"][impl] = memory_per_task(impl, n_tasks)
            print(f"{impl:>12}{results['memory'][impl]:>10.0f}")
    if args.journal:
        print("\njournaled ring (every dispatch to the WAL, fsync batch): durable dispatches/s")
        for total in [s for s in sizes if s <= 40_000] or [4_000]:
            n = 2
            r = total // n
            m = max(1, int(400_000 * scale // total))
            elapsed, records = run_tiffany_journal(r, n, m)
            rate = r * n * m / elapsed
            results["journal"][f"N={n},total={total}"] = {
                "dispatches_per_s": rate,
                "records": records,
            }
            print(
                f"{total:>10} coroutines: {rate / 1e6:.3f} M dispatches/s ({records:,} WAL records)"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
