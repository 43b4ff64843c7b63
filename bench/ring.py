"""The usched ring benchmark: Tiffany's kernel against its peers, in one run.

    python bench/ring.py                      # the full run (< ~10 min on 2 cores)
    python bench/ring.py --quick              # a smoke run (~1 min)
    python bench/ring.py --sizes 16,4000 --impls tiffany,asyncio,bare --repeat 5
    python bench/ring.py --json results.json  # also write machine-readable results

Table 1 -- the ring (seed 004, usched's ``gmain.go``): R rings of N
coroutines; each ring performs M rounds; round k is started by coroutine
k mod N, which sends a token to its right neighbour and waits for it to come
back; every other coroutine relays what it receives from the left to the
right. N*R coroutines, N*R*M messages, printed as messages per second for
each implementation and as Tiffany's ratio to each peer; then Tiffany with
one instrument attached (the slow-dispatch watchdog) against asyncio.

Table 2 -- 1,000 tasks each doing 300 cooperative yields (a bare ``yield``;
``await asyncio.sleep(0)``; ``trio.lowlevel.checkpoint()``; ``curio.sleep(0)``).

Table 3 -- memory per parked task: 100,000 tasks each blocked forever on a
get from its own queue, tracemalloc, one subprocess per implementation.

``--journal``: the Tiffany ring as a durable run (see :func:`journal_hook`).

Peers (``bench/_peers.py``): asyncio, uvloop (the same code), trio, curio,
and a bare generator loop, the floor of pure Python. Method: gc collected
before and disabled from build to end of every timed run, for every
implementation alike; only the run is timed (not building the rings); best
of ``--repeat`` runs. M = 600,000 / (N*R) (at least 1), the same for every
implementation in a cell.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _peers  # noqa: E402
from _peers import RingError, bad_token, check, gc_off  # noqa: E402

SIZES = (16, 400, 4_000, 40_000, 400_000)
QUICK_SIZES = (16, 4_000)
NS = (2, 8)
IMPLS = ("tiffany", "tiffany+instr", "asyncio", "uvloop", "trio", "curio", "bare")
PEERS = ("asyncio", "uvloop", "trio", "curio", "bare")

#: Messages per run: M = MESSAGES / (N*R), at least 1, the same M for every
#: implementation in a cell (a task's start and end are inside the timed run,
#: so a smaller M for the slow ones would charge them more per message). A
#: run takes ~0.2 s for Tiffany and the bare loop, ~1.5 s for asyncio, ~5 s
#: for trio; at 400,000 coroutines M = 1 (one round per ring).
MESSAGES = 600_000
QUICK_SCALE = 0.1
#: From this many coroutines a cell runs once (``--repeat-large``).
LARGE = 100_000
#: curio's costs grow with the task count (about 8 s to spawn 40,000 tasks,
#: minutes for 400,000; at N=2 0.09 M msgs/s with 4,000 coroutines, 0.009
#: with 40,000): its cells from this size on are skipped...
CURIO_MAX = 40_000
#: ... and from this size on it runs once (a 4,000-coroutine N=2 run takes ~7 s).
CURIO_ONCE = 4_000
#: ``--progress``: a line on stderr per cell.
PROGRESS = False

YIELD_TASKS, YIELD_COUNT = 1_000, 300
MEMORY_TASKS = 100_000
MEMORY_IMPLS = ("tiffany", "asyncio", "trio", "curio", "bare")
#: Spawning 100,000 curio tasks under tracemalloc takes over two minutes;
#: its figure is taken over 10,000 (the per-task cost does not depend on it).
MEMORY_TASKS_CURIO = 10_000


# -- Tiffany ---------------------------------------------------------------------------------


def tiffany_missing(instrumented: bool = False) -> str | None:
    """Return why the kernel cannot be benchmarked, or None if it can."""
    try:
        from tiffany.kernel import Queue, Scheduler  # noqa: F401

        if instrumented:
            from tiffany.kernel import SlowDispatchWatchdog  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def _tiffany_node(i: int, m: int, period: int, inbox: Any, outbox: Any, out: list[int]) -> Any:
    get, put = inbox.get, outbox.put
    for k in range(m):
        if k % period == i:
            put(k)
            msg = yield get()
        else:
            msg = yield get()
            put(msg)
        if msg != k:
            raise bad_token("tiffany", i, k, msg)
    out.append(m)


#: Filled by the last Tiffany ring run: the kernel's turns (a task run until
#: it parks or requeues) per message (1.0 = every receive blocked).
LAST_TURNS: dict[str, float] = {}


def ring_tiffany(r: int, n: int, m: int, period: int, instrumented: bool = False) -> float:
    from tiffany.kernel import Queue, Scheduler

    instruments = []
    if instrumented:
        from tiffany.kernel import SlowDispatchWatchdog

        instruments.append(SlowDispatchWatchdog())
    name = "tiffany+instr" if instrumented else "tiffany"
    out: list[int] = []
    with gc_off():
        sched = Scheduler(instruments=instruments)
        for _ in range(r):
            qs: list[Any] = [Queue() for _ in range(n)]
            for i in range(n):
                sched.spawn(_tiffany_node(i, m, period, qs[i], qs[(i + 1) % n], out))
        t0 = time.perf_counter()
        sched.run()
        elapsed = time.perf_counter() - t0
    alive = sched.alive
    LAST_TURNS[name] = sched.turns / (n * r * m)
    sched.close()
    check(out, r, n, m, name, f"; {alive} task(s) still alive after run() returned")
    return elapsed


def ring_tiffany_instr(r: int, n: int, m: int, period: int) -> float:
    return ring_tiffany(r, n, m, period, instrumented=True)


def yields_tiffany(tasks: int, count: int) -> float:
    from tiffany.kernel import Scheduler

    def spin() -> Any:
        for _ in range(count):
            yield

    with gc_off():
        sched = Scheduler()
        for _ in range(tasks):
            sched.spawn(spin())
        t0 = time.perf_counter()
        sched.run()
        elapsed = time.perf_counter() - t0
    if sched.alive:
        raise RingError(f"tiffany: {sched.alive} spinning task(s) alive after run()")
    sched.close()
    return elapsed


def memory_tiffany(n: int, measure: Callable[[], int]) -> int:
    from tiffany.kernel import Queue, Scheduler

    def waiter(q: Any) -> Any:
        yield q.get()

    sched = Scheduler()
    for _ in range(n):
        sched.spawn(waiter(Queue()))
    sched.run()  # every task parks; nothing can wake them, so run() returns
    if sched.alive != n:
        raise RingError(f"tiffany: {sched.alive} of {n} waiters parked")
    return measure()


# -- the journaled ring (the durable layer's hook) ----------------------------------------


def ring_root(r: int, n: int, m: int, period: int) -> Any:
    """The whole ring as one task tree (a durable run's entry point)."""
    from tiffany.kernel import NewTask, Queue, WaitTask

    out: list[int] = []
    tids = []
    for _ in range(r):
        qs: list[Any] = [Queue() for _ in range(n)]
        for i in range(n):
            node = _tiffany_node(i, m, period, qs[i], qs[(i + 1) % n], out)
            tids.append((yield NewTask(node)))
    for t in tids:
        yield WaitTask(t)
    return sum(out)


def journal_available() -> str | None:
    """Return why the journaled ring cannot run, or None if it can."""
    try:
        import tiffany.durable  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def journal_hook(sizes: list[int], scale: float) -> dict[str, Any]:
    """The journaled ring: every dispatch of the Tiffany ring recorded in the WAL.

    One durable run per size (N = 2, at most 40,000 coroutines), fsync policy
    ``batch``; prints durable dispatches (messages) per second and returns
    them for the JSON. The plain ring's figure is the ceiling this is
    compared with.
    """
    from tiffany.durable import Runtime

    results: dict[str, Any] = {}
    n, period = 2, 2
    print("\nJournaled ring (Tiffany durable run, fsync=batch), N=2")
    rows = []
    for total in [s for s in sizes if s <= 40_000] or [4_000]:
        r = max(1, total // n)
        m = max(1, int(400_000 * scale) // (r * n))
        with tempfile.TemporaryDirectory() as d, Runtime(d, fsync="batch") as rt:
            run_id = rt.submit("ring:ring_root", r, n, m, period)
            with gc_off():
                t0 = time.perf_counter()
                rt.run()
                elapsed = time.perf_counter() - t0
            got = rt.status(run_id).result
            records = rt.wal.durable_seq
        check([got], 1, 1, r * n * m, "tiffany journaled")
        rate = r * n * m / elapsed
        results[str(total)] = {"R": r, "M": m, "msgs_per_s": rate, "wal_records": records}
        rows.append([f"{total:,}", f"{m:,}", f"{rate / 1e6:.3f}", f"{records:,}"])
    print_table(["coroutines", "M", "M msgs/s", "WAL records"], rows)
    return results


# -- harness -------------------------------------------------------------------------------


RING: dict[str, Callable[[int, int, int, int], float]] = {
    "tiffany": ring_tiffany,
    "tiffany+instr": ring_tiffany_instr,
    "asyncio": _peers.ring_asyncio,
    "uvloop": _peers.ring_uvloop,
    "trio": _peers.ring_trio,
    "curio": _peers.ring_curio,
    "bare": _peers.ring_bare,
}
YIELDS: dict[str, Callable[[int, int], float]] = {
    "tiffany": yields_tiffany,
    "asyncio": _peers.yields_asyncio,
    "uvloop": _peers.yields_uvloop,
    "trio": _peers.yields_trio,
    "curio": _peers.yields_curio,
    "bare": _peers.yields_bare,
}
MEMORY: dict[str, Callable[[int, Callable[[], int]], int]] = {
    "tiffany": memory_tiffany,
    **_peers.MEMORY,
}


def missing(impl: str) -> str | None:
    """Why ``impl`` cannot run here (shown as n/a), or None."""
    if impl.startswith("tiffany"):
        return tiffany_missing(impl == "tiffany+instr")
    mod = {"uvloop": "uvloop", "trio": "trio", "curio": "curio"}.get(impl)
    if mod:
        try:
            __import__(mod)
        except ImportError as exc:
            return str(exc)
    return None


#: A run that has not finished after this long is reported as a deadlock
#: (asyncio, trio and curio would otherwise wait forever for a lost message;
#: Tiffany's and the bare loop's run return, and the count check fails).
RUN_TIMEOUT_S = 300


def guarded(impl: str, fn: Callable[..., float], *args: Any) -> float:
    """Run ``fn(*args)``; raise RingError if it takes over RUN_TIMEOUT_S."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise RingError(f"{impl}: no result after {RUN_TIMEOUT_S} s (deadlock? lost message?)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(RUN_TIMEOUT_S)
    try:
        return fn(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def ring_cell(impl: str, r: int, n: int, m: int, period: int, repeat: int) -> dict[str, Any]:
    cell: dict[str, Any] = {"R": r, "M": m, "messages": r * n * m}
    if impl == "curio" and r * n >= CURIO_MAX:
        cell["skipped"] = f"curio from {CURIO_MAX:,} coroutines (minutes per run)"
        return cell
    if impl == "curio" and r * n >= CURIO_ONCE:
        repeat = 1
    wall = time.perf_counter()
    times = [guarded(impl, RING[impl], r, n, m, period) for _ in range(repeat)]
    cell["wall_seconds"] = time.perf_counter() - wall
    if PROGRESS:
        print(
            f"  [{impl} N={n} coroutines={r * n:,} M={m:,}: best {min(times):.2f} s of {repeat}, "
            f"cell {cell['wall_seconds']:.1f} s]",
            file=sys.stderr,
            flush=True,
        )
    cell["seconds"] = min(times)
    cell["msgs_per_s"] = r * n * m / min(times)
    if impl in LAST_TURNS:
        cell["turns_per_msg"] = LAST_TURNS.pop(impl)
    return cell


def fmt_rate(v: float | None) -> str:
    return "n/a" if v is None else "skip" if v != v else f"{v / 1e6:.3f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a != a or b != b:
        return "n/a"
    return f"{a / b:.2f}"


class Table:
    """An aligned text table printed row by row (a long run shows progress)."""

    def __init__(self, head: list[str], min_width: int = 7) -> None:
        self.widths = [max(len(h), min_width) for h in head]
        print("  ".join(h.rjust(w) for h, w in zip(head, self.widths, strict=True)))
        print("  ".join("-" * w for w in self.widths), flush=True)

    def row(self, cells: list[str]) -> None:
        print("  ".join(c.rjust(w) for c, w in zip(cells, self.widths, strict=True)), flush=True)


def print_table(head: list[str], rows: list[list[str]]) -> None:
    table = Table(head, max((len(c) for row in rows for c in row), default=1))
    for row in rows:
        table.row(row)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("uvloop", "trio", "curio"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = "missing"
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        out["tiffany"] = rev
    except (OSError, subprocess.CalledProcessError):
        out["tiffany"] = "?"
    return out


def table_ring(
    args: argparse.Namespace, impls: list[str], sizes: list[int], scale: float
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    variants = ("rotate", "fixed") if args.originator == "both" else (args.originator,)
    for variant, n in [(v, n) for v in variants for n in NS]:
        period = n if variant == "rotate" else 1
        label = "" if variant == "rotate" else ", fixed originator (one token per ring)"
        print(
            f"\nTable 1 (N={n}{label}): ring messages per second (millions); "
            "ratios are Tiffany / peer"
        )
        rate: dict[tuple[int, str], float | None] = {}
        instr_rows = []
        head = ["coroutines", "R", "M"] + [i for i in impls if i != "tiffany+instr"]
        if "tiffany" in impls:
            head += [f"t/{p}" for p in PEERS if p in impls]
        table = Table(head)
        for total in sizes:
            if total < n:
                continue
            key = f"N={n},coroutines={total}" + ("" if variant == "rotate" else ",fixed")
            r = max(1, total // n)
            m = max(1, int(MESSAGES * scale) // (r * n))
            results[key] = {}
            repeat = args.repeat if total < LARGE else args.repeat_large
            for impl in impls:
                why = missing(impl)
                if why:
                    results[key][impl] = {"n/a": why}
                    rate[total, impl] = None
                    continue
                cell = ring_cell(impl, r, n, m, period, repeat)
                results[key][impl] = cell
                rate[total, impl] = cell.get("msgs_per_s", math.nan)
            t = rate[total, "tiffany"] if "tiffany" in impls else None
            row = [f"{total:,}", f"{r:,}", f"{m:,}"]
            row += [fmt_rate(rate[total, i]) for i in impls if i != "tiffany+instr"]
            if "tiffany" in impls:
                row += [fmt_ratio(t, rate[total, p]) for p in PEERS if p in impls]
            table.row(row)
            if "tiffany+instr" in impls:
                ti = rate[total, "tiffany+instr"]
                a = rate[total, "asyncio"] if "asyncio" in impls else None
                tpm = results[key].get("tiffany", {}).get("turns_per_msg")
                instr_rows.append(
                    [
                        f"{total:,}",
                        fmt_rate(ti),
                        fmt_ratio(ti, a),
                        fmt_ratio(ti, t),
                        "n/a" if tpm is None else f"{tpm:.2f}",
                    ]
                )
        if instr_rows:
            print(f"\nTable 1b (N={n}{label}): tiffany + 1 instrument (SlowDispatchWatchdog)")
            print_table(
                ["coroutines", "tiffany+instr", "instr/asyncio", "instr/tiffany", "turns/msg"],
                instr_rows,
            )
    return results


def table_yields(args: argparse.Namespace, impls: list[str]) -> dict[str, Any]:
    names = [i for i in YIELDS if i in impls]
    print(
        f"\nTable 2: {YIELD_TASKS:,} tasks x {YIELD_COUNT} cooperative yields, "
        "switches per second (millions), best of {}".format(max(args.repeat, 3))
    )
    rate: dict[str, float | None] = {}
    for name in names:
        if missing(name):
            rate[name] = None
            continue
        best = min(YIELDS[name](YIELD_TASKS, YIELD_COUNT) for _ in range(max(args.repeat, 3)))
        rate[name] = YIELD_TASKS * YIELD_COUNT / best
    t = rate.get("tiffany")
    print_table(
        ["impl", "M switches/s", "tiffany/impl"],
        [[name, fmt_rate(rate[name]), fmt_ratio(t, rate[name])] for name in names],
    )
    return {k: {"switches_per_s": v} for k, v in rate.items()}


def memory_child(impl: str, n: int) -> None:
    """Runs in a subprocess: print the traced bytes of ``n`` parked tasks."""
    if missing(impl):
        print("RESULT n/a")
        return
    if impl == "tiffany":
        import tiffany.kernel  # noqa: F401 - imported before tracing starts
    elif impl in ("trio", "curio"):
        __import__(impl)
        if impl == "trio":
            import trio.testing  # noqa: F401

    def measure() -> int:
        import gc

        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base

    import gc

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    used = MEMORY[impl](n, measure)
    print(f"RESULT {used}", flush=True)
    os._exit(0)  # skip tearing 100,000 parked tasks down


def table_memory(impls: list[str], n: int) -> dict[str, Any]:
    names = [i for i in MEMORY_IMPLS if i in impls]
    print(
        f"\nTable 3: memory per parked task ({n:,} tasks, each blocked on its own queue; "
        "tracemalloc)"
    )
    per: dict[str, float | None] = {}
    count: dict[str, int] = {}
    for impl in names:
        count[impl] = k = min(n, MEMORY_TASKS_CURIO) if impl == "curio" else n
        proc = subprocess.run(
            [sys.executable, __file__, "--memory-child", impl, "--memory-tasks", str(k)],
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RingError(
                f"memory child {impl} failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}"
            )
        value = lines[-1].split()[1]
        per[impl] = None if value == "n/a" else int(value) / count[impl]
    t = per.get("tiffany")
    print_table(
        ["impl", "tasks", "bytes/task", "impl/tiffany"],
        [
            [k, f"{count[k]:,}", "n/a" if v is None else f"{v:,.0f}", fmt_ratio(v, t)]
            for k, v in per.items()
        ],
    )
    return {k: {"bytes_per_task": v, "tasks": count[k]} for k, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: sizes 16,4000, a tenth of the messages"
    )
    ap.add_argument(
        "--sizes", help="comma-separated coroutine counts N*R (default 16,400,4000,40000,400000)"
    )
    ap.add_argument("--impls", help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs per cell below 100,000 coroutines, best kept"
    )
    ap.add_argument(
        "--repeat-large", type=int, default=1, help="runs per cell from 100,000 coroutines"
    )
    ap.add_argument(
        "--originator",
        choices=("rotate", "fixed", "both"),
        default="rotate",
        help="rotate: round k starts at coroutine k mod N (the seed's gmain.go; rounds overlap, "
        "up to N tokens per ring); fixed: always coroutine 0 (one token per ring, every receive "
        "blocks); both: Table 1 twice",
    )
    ap.add_argument("--tables", default="1,2,3", help="which tables to print (default 1,2,3)")
    ap.add_argument(
        "--journal",
        action="store_true",
        help="also the journaled Tiffany ring (needs tiffany.durable)",
    )
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--progress", action="store_true", help="a line on stderr per cell (timings)")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    ap.add_argument("--memory-tasks", type=int, default=MEMORY_TASKS, help=argparse.SUPPRESS)
    args = ap.parse_args()

    global PROGRESS
    PROGRESS = args.progress
    if args.memory_child:
        memory_child(args.memory_child, args.memory_tasks)
        return
    if args.journal:
        why = journal_available()
        if why:
            sys.exit(f"ring.py: --journal: journaling not available yet (tiffany.durable: {why})")
    impls = args.impls.split(",") if args.impls else list(IMPLS)
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        ap.error(f"unknown implementation(s) {unknown}; choose from {','.join(IMPLS)}")
    impls = [i for i in IMPLS if i in impls]  # canonical order
    if args.sizes:
        sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    else:
        sizes = list(QUICK_SIZES if args.quick else SIZES)
    scale = QUICK_SCALE if args.quick else 1.0
    tables = set(args.tables.split(","))

    ver = versions()
    started = time.perf_counter()
    print(
        f"Python {ver['python']} ({platform.python_implementation()}), {cpu_model()}, "
        f"{os.cpu_count()} CPUs, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; "
        f"uvloop {ver['uvloop']}, trio {ver['trio']}, curio {ver['curio']}; "
        f"tiffany @ {ver['tiffany']}"
    )
    print(
        f"gc collected before and disabled during every timed run; best of {args.repeat} "
        f"(below {LARGE:,} coroutines) / {args.repeat_large} (from {LARGE:,}; "
        f"curio 1 from {CURIO_ONCE:,}); originator: {args.originator}"
        f"{'; QUICK' if args.quick else ''}"
    )
    for impl in impls:
        why = missing(impl)
        if why:
            print(f"  {impl}: n/a ({why})")
    results: dict[str, Any] = {
        "env": {
            **ver,
            "cpu": cpu_model(),
            "date": datetime.datetime.now().astimezone().isoformat(),
        },
        "params": {
            "sizes": sizes,
            "N": list(NS),
            "messages_per_run": int(MESSAGES * scale),
            "repeat": args.repeat,
            "repeat_large": args.repeat_large,
            "originator": args.originator,
            "quick": args.quick,
        },
    }
    if "1" in tables:
        results["ring"] = table_ring(args, impls, sizes, scale)
    if "2" in tables:
        results["yields"] = table_yields(args, impls)
    if "3" in tables:
        results["memory"] = table_memory(impls, MEMORY_TASKS)
    if args.journal:
        results["journal"] = journal_hook(sizes, scale)
    results["wall_seconds"] = time.perf_counter() - started
    print(f"\n(wall time {results['wall_seconds']:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
