"""Workflows (``@workflow`` generator functions): steps/s against DBOS, verify, a step's cost.

    python bench/workflows.py            # the full run (~2-5 min, the DBOS venv built once)
    python bench/workflows.py --quick    # small sizes, for a smoke run (~30 s)
    python bench/workflows.py --no-dbos  # Tiffany only

Four parts, in one run, on one filesystem (the data dirs go under ``--dir``,
default a temporary directory beside this script, the repository's disk):

1. **Against DBOS.** A workflow of ``--seq`` (1,000) sequential steps of a
   trivial function (``total += yield Step(trivial, i)``), and ``--runs``
   (100) workflows of ``--steps`` (100) steps each started at once, run by
   the engine in this process (``tiffany.engine.build``, then
   ``prepare_workflow`` and ``start_entry``, as ``tiffany run MOD:FN`` does)
   on the file WAL at the engine's default fsync policy ``batch``. DBOS 3.4
   runs the same workloads (``@DBOS.workflow()`` of ``@DBOS.step()`` calls,
   ``DBOS.start_workflow`` for the concurrent ones) in its own virtual
   environment (``bench/.envs/dbos``, ``dbos_driver.py``, as
   ``durable_steps.py`` drives it) on SQLite at ``synchronous=FULL``.
   Equal durability: Tiffany releases a step only after the commit that
   made its STEP_START durable, and with it the previous step's result;
   DBOS commits each step's outcome in a transaction of its own before the
   step returns. Tiffany's steps run in the thread pool (``Step(fn)``) and
   ``inline=True`` (on the loop's thread, as a DBOS step runs in its
   workflow's thread). The sequential runs go in two rounds, before and
   after DBOS's process: the host's sync latency drifts by an order of
   magnitude from minute to minute. Printed: steps/s of each and the ratio.
2. **The fsync ceiling.** One record appended and committed at a time
   (``Wal.append`` + ``Wal.commit``, policy ``batch``: one ``fdatasync``
   each) on the same filesystem for ``--ceiling-s`` seconds, between the
   runs of part 1, into a new log's first segment as an engine writes it
   (zero-filled ahead of its records, where part 1's runs write), and once
   each into a prepared segment and one that grows at each commit: a
   chain of dependent steps cannot sync less than once a step, so this is
   the most it can reach. Printed: appends/s, and for each sequential run
   its own fdatasyncs a step, their mean time and share of its wall time,
   and its steps/s as a fraction of the ceiling measured around it.
3. **Verify against recording.** One workflow of ``--verify-steps``
   (100,000) steps in ``--verify-tasks`` (100) concurrent child tasks
   (``NewTask`` of a generator of steps; a sequential one would spend the
   whole budget waiting for 100,000 syncs), recorded live, then replayed
   by ``tiffany.durable.verify`` (``tiffany replay RUN --verify``): scan,
   load, re-run against the journal with every dispatch checked. Wall and
   CPU seconds of each, and the ratio (above 1: verify is faster).
4. **A step's cost.** The same chain of ``--cost-steps`` (1,000) calls of
   one trivial function, as a plan of ``python`` steps (each ``after`` the
   previous, the output fed forward) and as a workflow of ``Step`` calls,
   each with the function in the thread pool and ``inline=True``, under
   fsync ``batch`` (the engine's default) and ``off`` (the engine's own
   cost, without the disk's): wall and CPU microseconds a step.

Every run is checked (its result, and part 3's verify report); the figures
are measurements, never assertions. The load average is printed at the
start and the end: on a shared machine, read the ratios, not the rates.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tiffany import workflow  # noqa: E402
from tiffany.agents.tools.python import python_tool  # noqa: E402
from tiffany.config import Settings  # noqa: E402
from tiffany.durable import verify  # noqa: E402
from tiffany.engine import Engine, build, replay_resolvers  # noqa: E402
from tiffany.kernel import NewTask, Step, WaitTask  # noqa: E402
from tiffany.wal import FsyncPolicy, Wal  # noqa: E402

ENV_DIR = ROOT / "bench" / ".envs" / "dbos"
DBOS_SPEC = "dbos==3.4.0"
#: The engine's default fsync policy (``Settings.wal_fsync``), at which parts 1-3 run.
WAL_FSYNC = "batch"
#: The record part 2 appends: about a small step's WAKE record.
CEILING_RECORD_BYTES = 64
CEILING_RTYPE = 3


def trivial(i: int) -> int:
    """The step of every workload: the trivial function."""
    return i + 1


@python_tool("bench_wf_inc", inline=True)
def bench_wf_inc(x: int = 0) -> int:
    """The plan's trivial step (part 4), called on the loop's thread."""
    return x + 1


python_tool("bench_wf_inc_pool")(bench_wf_inc)  # the same function, through the pool


@workflow("bench.sequential")
def sequential(n: int, inline: bool = False):
    """``n`` steps, each after the previous, its result fed forward."""
    total = 0
    for i in range(n):
        total += yield Step(trivial, i, inline=inline)
    return {"total": total}


@workflow("bench.chain")
def chain(n: int, inline: bool = False):
    """Part 4's workflow: the plan chain's calls, ``x = f(x)`` ``n`` times."""
    x = 0
    for _ in range(n):
        x = yield Step(bench_wf_inc, x, inline=inline)
    return {"last": x}


def _steps(n: int):
    total = 0
    for i in range(n):
        total += yield Step(trivial, i)
    return total


@workflow("bench.fanned")
def fanned(tasks: int, per_task: int):
    """``tasks`` child tasks of ``per_task`` sequential steps each, all at once."""
    tids = []
    for t in range(tasks):
        tids.append((yield NewTask(_steps(per_task), name=f"t{t}")))
    total = 0
    for tid in tids:
        total += yield WaitTask(tid)
    return {"total": total}


# -- helpers ---------------------------------------------------------------------------


class Timer:
    """Wall and CPU seconds (the whole process: the thread pool's too) of a block."""

    def __enter__(self) -> Timer:
        gc.collect()
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


@contextlib.contextmanager
def _engine(root: Path, fsync: str = WAL_FSYNC) -> Iterator[tuple[Engine, Settings]]:
    """An engine on a fresh data dir under ``root`` (the python tool enabled)."""
    with tempfile.TemporaryDirectory(dir=root) as d:
        settings = Settings(data_dir=Path(d), wal_fsync=fsync)
        engine = build(settings, enabled_tools=["python"])
        try:
            yield engine, settings
        finally:
            engine.runtime.close()


def _start(engine: Engine, name: str, inputs: dict[str, Any]) -> str:
    entry, run_name = engine.prepare_workflow(name, inputs)
    return engine.start_entry(entry, name=run_name)


def _outputs(engine: Engine, run_id: str) -> dict[str, Any]:
    state = engine.runtime.status(run_id)
    assert state.status == "succeeded", (run_id, state.status, state.error)
    return state.result["outputs"]  # type: ignore[no-any-return]


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


# -- part 1: against DBOS ------------------------------------------------------------


def tiffany_sequential(root: Path, n: int, inline: bool) -> tuple[float, Timed]:
    """Steps/s of one workflow of ``n`` sequential steps, and its WAL's fdatasyncs."""
    with _engine(root) as (engine, _):
        timed = Timed(engine.runtime.wal._fdatasync)  # type: ignore[attr-defined]
        engine.runtime.wal._fdatasync = timed  # type: ignore[attr-defined]
        with Timer() as t:
            run_id = _start(engine, "bench.sequential", {"n": n, "inline": inline})
            engine.runtime.run()
        assert _outputs(engine, run_id) == {"total": n * (n + 1) // 2}
    return n / t.wall, timed


def tiffany_concurrent(root: Path, runs: int, per_run: int, inline: bool) -> float:
    """Steps/s of ``runs`` workflows of ``per_run`` steps, started at once."""
    with _engine(root) as (engine, _), Timer() as t:
        inputs = {"n": per_run, "inline": inline}
        ids = [_start(engine, "bench.sequential", inputs) for _ in range(runs)]
        engine.runtime.run()
    for run_id in ids:
        assert _outputs(engine, run_id) == {"total": per_run * (per_run + 1) // 2}
    return runs * per_run / t.wall


def dbos(root: Path, seq: int, runs: int, per_run: int, warmup: int) -> dict[str, Any] | None:
    """DBOS's figures from ``dbos_driver.py`` in its venv (built on first use)."""
    python = ENV_DIR / "bin" / "python"
    if not python.exists():
        print(f"creating {ENV_DIR} with {DBOS_SPEC} (first run only)...", flush=True)
        venv.create(ENV_DIR, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", DBOS_SPEC], check=True)
    driver = str(ROOT / "bench" / "dbos_driver.py")
    with tempfile.TemporaryDirectory(dir=root) as d:
        proc = subprocess.run(
            [str(python), driver, d, str(seq), str(runs), str(per_run), "sqlite", str(warmup)],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
    if proc.returncode != 0:
        print("DBOS failed:", proc.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- part 2: the fsync ceiling -------------------------------------------------------


class Timed:
    """Counts and times the calls of an ``fdatasync``-like function."""

    def __init__(self, sync: Callable[[int], None] = os.fdatasync) -> None:
        self.sync = sync
        self.n = 0
        self.seconds = 0.0

    def __call__(self, fd: int) -> None:
        t0 = time.perf_counter()
        self.sync(fd)
        self.seconds += time.perf_counter() - t0
        self.n += 1

    @property
    def mean_ms(self) -> float:
        return self.seconds / max(1, self.n) * 1000


def fsync_ceiling(root: Path, seconds: float, *, where: str) -> tuple[float, Timed]:
    """Sequential appends/s, each committed (one ``fdatasync``), for ``seconds``.

    ``where``: ``"ahead"``, a new log's first segment as an engine writes it
    (``preallocate``: it grows, zero-filled ahead of its records; where
    part 1's runs write; no prepared file is made, as none is in a run's
    first MiB); ``"prepared"``, after a warm-up that moves the writer into a
    prepared segment (where a long-running engine writes); ``"grow"``, a
    segment that grows by each commit (no ``preallocate``: the engine's
    first MiB before the fill ahead).
    """
    with tempfile.TemporaryDirectory(dir=root) as d:
        preallocate = where != "grow"
        kw: dict[str, Any] = {}
        if where == "ahead":
            kw["_spawn"] = lambda prepare: None  # no prepared file: stay in the first segment
        wal = Wal.open(Path(d), fsync=FsyncPolicy.BATCH, preallocate=preallocate, **kw)
        payload = os.urandom(CEILING_RECORD_BYTES)
        append, commit = wal.append, wal.commit
        n = 0
        try:
            warm_until = time.perf_counter() + 10.0
            while where == "prepared" and not wal.preallocated:
                append(CEILING_RTYPE, os.urandom(4096))
                commit()
                if time.perf_counter() > warm_until:
                    raise RuntimeError("no prepared segment after 10 s")
            timed = Timed()
            wal._fdatasync = timed
            start = time.perf_counter()
            deadline = start + seconds
            while True:
                append(CEILING_RTYPE, payload)
                commit()
                n += 1
                if n % 16 == 0 and time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - start
        finally:
            wal.close()
    return n / elapsed, timed


# -- part 3: verify against recording -------------------------------------------------


def record_and_verify(root: Path, tasks: int, per_task: int) -> tuple[Timer, Timer, int]:
    """Record one fanned-out workflow, then verify it; return both timers and its records."""
    with tempfile.TemporaryDirectory(dir=root) as d:
        settings = Settings(data_dir=Path(d), wal_fsync=WAL_FSYNC)
        engine = build(settings, enabled_tools=["python"])
        try:
            with Timer() as record:
                run_id = _start(engine, "bench.fanned", {"tasks": tasks, "per_task": per_task})
                engine.runtime.run()
            expect = tasks * (per_task * (per_task + 1) // 2)
            assert _outputs(engine, run_id) == {"total": expect}
        finally:
            engine.runtime.close()
        resolvers = replay_resolvers(settings)
        with Timer() as check:
            report = verify(Path(d), run_id, resolvers=resolvers)
        assert report.ok, report.to_dict()
    return record, check, report.records


# -- part 4: a step's cost -------------------------------------------------------------


def plan_chain(n: int, fn: str) -> dict[str, Any]:
    """A plan of ``n`` python steps calling ``fn``, each fed the previous one's output."""
    steps = [{"id": "s0", "tool": "python", "args": {"function": fn, "kwargs": {"x": 0}}}]
    for i in range(1, n):
        kwargs = {"x": f"${{steps.s{i - 1}.output}}"}
        steps.append(
            {
                "id": f"s{i}",
                "tool": "python",
                "args": {"function": fn, "kwargs": kwargs},
                "after": [f"s{i - 1}"],
            }
        )
    return {"name": "chain", "steps": steps, "outputs": {"last": f"${{steps.s{n - 1}.output}}"}}


def cost(root: Path, kind: str, n: int, inline: bool, fsync: str) -> Timer:
    """Time a chain of ``n`` calls as a plan or a workflow; checks the last value."""
    with _engine(root, fsync) as (engine, _):
        if kind == "plan":
            doc = plan_chain(n, "bench_wf_inc" if inline else "bench_wf_inc_pool")
            with Timer() as t:
                run_id = engine.submit_plan(doc)
                engine.runtime.run()
        else:
            with Timer() as t:
                run_id = _start(engine, "bench.chain", {"n": n, "inline": inline})
                engine.runtime.run()
        assert _outputs(engine, run_id) == {"last": n}
    return t


# -- main -----------------------------------------------------------------------------


def _commit() -> str:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seq", type=int, default=1_000)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--ceiling-s", type=float, default=3.0)
    ap.add_argument("--verify-steps", type=int, default=100_000)
    ap.add_argument("--verify-tasks", type=int, default=100)
    ap.add_argument("--cost-steps", type=int, default=1_000)
    ap.add_argument(
        "--warmup", type=int, default=100, help="steps of the discarded first runs (both sides)"
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--no-dbos", action="store_true")
    ap.add_argument("--dir", type=Path, default=None, help="where the data dirs go")
    args = ap.parse_args()
    if args.quick:
        args.seq, args.runs, args.steps = 200, 10, 20
        args.ceiling_s, args.verify_steps, args.cost_steps = 1.0, 5_000, 200
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-workflows-", dir=ROOT / "bench"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"bench/workflows.py: {started}, commit {_commit()}, load average {_load()}")
    print(f"data dirs under {root}; Tiffany fsync {WAL_FSYNC}", flush=True)
    try:
        _run(args, root)
    finally:
        with contextlib.suppress(OSError):
            root.rmdir()
    ended = time.strftime("%H:%M UTC", time.gmtime())
    print(f"\nended {ended}, load average {_load()}")


def _run(args: argparse.Namespace, root: Path) -> None:
    # Parts 1 and 2. The host's sync latency drifts from minute to minute, so
    # Tiffany's sequential runs go in two rounds, before and after DBOS's, and
    # the ceiling is measured between the runs (a first segment, as a fresh
    # data dir's runs write into).
    def ceiling() -> tuple[float, Timed]:
        return fsync_ceiling(root, args.ceiling_s, where="ahead")

    def seq_round() -> list[tuple[str, float, Timed]]:
        out = []
        for inline in (False, True):
            rate, timed = tiffany_sequential(root, args.seq, inline=inline)
            out.append(("inline" if inline else "Step(fn)", rate, timed))
        return out

    # A discarded warm-up first: the process's first workflow paid for what
    # any first run pays once (the workflow's import and checks, code paths
    # run for the first time) and read 0.68 of the ceiling where the same
    # run a minute later read 0.91. DBOS's driver warms up the same way.
    for inline in (False, True):
        tiffany_sequential(root, args.warmup, inline=inline)
    c0 = ceiling()
    round_a = seq_round()
    c1 = ceiling()
    conc = tiffany_concurrent(root, args.runs, args.steps, inline=False)
    conc_inline = tiffany_concurrent(root, args.runs, args.steps, inline=True)
    c2 = ceiling()
    peer = None if args.no_dbos else dbos(root, args.seq, args.runs, args.steps, args.warmup)
    c3 = ceiling()
    round_b = seq_round()
    c4 = ceiling()
    prealloc, prealloc_syncs = fsync_ceiling(root, args.ceiling_s, where="prepared")
    grow, grow_syncs = fsync_ceiling(root, args.ceiling_s, where="grow")

    nan = float("nan")
    d_seq = peer["sequential_steps_per_s"] if peer else nan
    d_conc = peer["concurrent_steps_per_s"] if peer else nan
    where = f"DBOS {peer['version']} on SQLite {peer['synchronous']}" if peer else "no DBOS"
    print(f"\n1. workflows of trivial steps: Tiffany (file WAL, fsync {WAL_FSYNC}) against {where}")
    print("(Step(fn): fn runs in the thread pool; inline: Step(fn, inline=True), on the loop's")
    print(" thread at the commit point, as a DBOS step runs in its workflow's thread)")
    print(f"{'workload':<54}{'Tiffany steps/s':>16}{'DBOS steps/s':>14}{'ratio':>9}")
    rows = [
        (f"sequential: 1 x {args.seq:,} steps, {label}, {when}", rate, d_seq)
        for when, rnd in (("before DBOS", round_a), ("after DBOS", round_b))
        for label, rate, _ in rnd
    ]
    rows += [
        (f"concurrent: {args.runs} x {args.steps} steps, Step(fn)", conc, d_conc),
        (f"concurrent: {args.runs} x {args.steps} steps, inline", conc_inline, d_conc),
    ]
    for label, mine, theirs in rows:
        print(f"{label:<54}{mine:>16,.0f}{theirs:>14,.0f}{mine / theirs:>8.1f}x")

    print("\n2. the fsync ceiling: one record appended + committed at a time (fsync batch)")
    print(
        "first segment, zero-filled ahead (where part 1's runs write), appends/s "
        "(mean fdatasync ms):"
    )
    for label, (rate, timed) in (
        ("before round 1", c0),
        ("after round 1", c1),
        ("before DBOS", c2),
        ("after DBOS", c3),
        ("after round 2", c4),
    ):
        print(f"  {label:<16}{rate:>8,.0f}  ({timed.mean_ms:.2f} ms)")
    print(
        f"prepared segment (where a long-running engine writes): {prealloc:,.0f} "
        f"({prealloc_syncs.mean_ms:.2f} ms)"
    )
    print(
        f"a segment that grows at each commit (no fill ahead): {grow:,.0f} "
        f"({grow_syncs.mean_ms:.2f} ms)"
    )
    print(
        f"{'sequential workflow':<30}{'fdatasyncs/step':>16}{'mean ms':>9}"
        f"{'share of wall':>15}{'/ ceiling around it':>21}"
    )
    for n, rnd, (before, after) in ((1, round_a, (c0, c1)), (2, round_b, (c3, c4))):
        around = (before[0] + after[0]) / 2
        for label, rate, timed in rnd:
            print(
                f"{f'round {n}, {label}':<30}{timed.n / args.seq:>16.2f}{timed.mean_ms:>9.2f}"
                f"{timed.seconds * rate / args.seq:>15.0%}{rate / around:>21.2f}"
            )

    # Part 4 before part 3: the 100,000-step run leaves the most garbage.
    print(f"\n4. a step's cost: a chain of {args.cost_steps:,} calls of the trivial function")
    print(
        f"{'fsync':<7}{'function':<9}{'plan us/step':>13}{'workflow us/step':>17}"
        f"{'plan cpu us':>12}{'wf cpu us':>10}{'plan / wf':>10}"
    )
    for fsync in (WAL_FSYNC, "off"):
        for inline in (False, True):
            p = cost(root, "plan", args.cost_steps, inline, fsync)
            w = cost(root, "workflow", args.cost_steps, inline, fsync)
            per = 1e6 / args.cost_steps
            print(
                f"{fsync:<7}{'inline' if inline else 'pool':<9}{p.wall * per:>13,.0f}"
                f"{w.wall * per:>17,.0f}{p.cpu * per:>12,.0f}{w.cpu * per:>10,.0f}"
                f"{p.wall / w.wall:>9.1f}x",
                flush=True,
            )

    per_task = max(1, args.verify_steps // args.verify_tasks)
    record, check, records = record_and_verify(root, args.verify_tasks, per_task)
    steps = args.verify_tasks * per_task
    print(
        f"\n3. verify against recording: one workflow of {steps:,} steps "
        f"({args.verify_tasks} tasks x {per_task:,}), {records:,} journal records"
    )
    print(f"{'phase':<34}{'wall s':>8}{'steps/s':>10}{'cpu s':>8}")
    for label, t in (("record (live, fsync batch)", record), ("verify (scan+load+replay)", check)):
        print(f"{label:<34}{t.wall:>8.2f}{steps / t.wall:>10,.0f}{t.cpu:>8.2f}")
    print(
        f"verify speed / record speed: {record.wall / check.wall:.2f} (wall), "
        f"{record.cpu / check.cpu:.2f} (cpu); target >= 1.0"
    )


if __name__ == "__main__":
    main()
