"""Scale-out figures a 2-core machine can measure: steps per CPU-second, and the journal's floor.

    python bench/scaleout.py [--runs 300] [--steps 25] [--repeat 2] [--appends 2000] [--blocks 20]
    python bench/scaleout.py --no-postgres         # the file WAL only, no part 2
    python bench/scaleout.py --parts 2             # part 2 alone (seconds)

Part 1, steps per CPU-second with 2 engines against 1. On a machine with
two cores, two engines cannot run twice as fast as one (``engines.py``
shows why: one engine with its projector, the API and the client already
fill the cores). What the machine can measure is whether a second engine
wastes work: total plan steps per CPU-second spent by the server's
processes (the engines, their projector processes, the API and, on the
PostgreSQL journal, the database backends serving them), with
``tiffany serve --engines 1`` and ``--engines 2`` in the same run. A ratio
near 1.00 means two engines do the same work per CPU-second as one, so on
a machine with a core for each they would scale out. For each journal (the
file WAL; PostgreSQL in a private schema, as ``bench/_pg.py`` makes them)
and each engine count: a fresh ``serve`` (fsync ``batch``), a warm-up,
then ``--runs`` plans of ``--steps`` independent ``sleep 0`` steps through
``POST /api/runs`` (``engines.py``'s client), timed until the store shows
every run succeeded. The database backends are found by the
``application_name`` the server's URL gives them (sampled at the start and
end of the round; a backend that ends within the round is not counted).
``machine`` is the whole machine's busy CPU over the round from
``/proc/stat``: other work on a shared host is in it.

Part 2, the PostgreSQL journal's sequential rate as a fraction of a
one-row commit, in the same run and on the same server: ``--appends``
calls of each, one at a time, in ``--blocks`` short blocks that alternate
between the statements (the median block is printed, and the spread):
``SELECT 1`` (the round trip), a one-row autocommit ``INSERT`` into a
logged table (the floor of any write-ahead commit), the journal's own
commit of one record (``PgLog.append`` + ``commit``: the fenced head update
and the record in one statement), and sequential durable steps of a trivial
inline function (``Runtime`` on the stream: one commit per step, the
engine's loop included).

Every part is bounded (fixed counts, a timeout on every wait) and the
script stops its servers and drops its schemas on the way out. It prints
figures side by side and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from durable_steps import _pg_schema, sequential  # noqa: E402, F401  (submitted by name)
from engines import _cpu, _measure, _serve  # noqa: E402

PG_URL = os.environ.get("TIFFANY_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
#: How long a round (start, warm-up, measure, stop) may take before the script gives up.
ROUND_TIMEOUT_S = 300.0


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (``/proc/stat``: user, system, interrupts)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _backends(url: str, app: str) -> list[int]:
    """The pids of the PostgreSQL backends whose connections carry ``application_name=app``."""
    import psycopg

    from tiffany.config import conninfo

    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def _cpu_of(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = _cpu(pid)
    return out


def _with_app(url: str, app: str) -> str:
    from sqlalchemy.engine import make_url

    scoped = make_url(url).update_query_dict({"application_name": app})
    return scoped.render_as_string(hide_password=False)


class RoundTimeout(Exception):
    """A round outlived :data:`ROUND_TIMEOUT_S`; its server is stopped on the way out."""


def _alarm(signum: int, frame: object) -> None:
    raise RoundTimeout(f"a round took over {ROUND_TIMEOUT_S:.0f} s")


def _round(journal: str, engines: int, runs: int, steps: int, base: dict[str, str]) -> dict:
    """One measured round on a fresh server: wall, and CPU seconds by part.

    The waits it borrows from ``engines.py`` have no deadline of their own:
    an alarm bounds the whole round, and the exit stack stops the server.
    """
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(ROUND_TIMEOUT_S))
    try:
        return _measured_round(journal, engines, runs, steps, base)
    finally:
        signal.alarm(0)


def _measured_round(
    journal: str, engines: int, runs: int, steps: int, base: dict[str, str]
) -> dict:
    with contextlib.ExitStack() as stack:
        env = dict(base)
        app = ""
        if journal == "PostgreSQL":
            app = f"scaleout_{uuid.uuid4().hex[:8]}"
            url = _with_app(stack.enter_context(_pg_schema(PG_URL)), app)
            env |= {"TIFFANY_DATABASE_URL": url, "TIFFANY_JOURNAL": "postgres"}
        served = stack.enter_context(_serve(engines, env))
        _measure(served.url, max(8, runs // 20), steps, served.homes)  # warm up
        db0 = _cpu_of(_backends(PG_URL, app)) if app else {}
        cpu0, machine0 = served.cpu(), _machine_busy_s()
        _, stored = _measure(served.url, runs, steps, served.homes)
        machine = _machine_busy_s() - machine0
        cpu = {k: v - cpu0[k] for k, v in served.cpu().items()}
        db1 = _cpu_of(_backends(PG_URL, app)) if app else {}
        cpu["database"] = sum(v - db0.get(pid, 0.0) for pid, v in db1.items())
        signal.alarm(0)  # measured: the server's stop below is not cut short
    cpu["server"] = cpu["engines"] + cpu["projectors"] + cpu["api"] + cpu["database"]
    return {"wall": stored, "cpu": cpu, "machine": machine}


def part1(args: argparse.Namespace) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    base |= {"TIFFANY_LOG_LEVEL": "WARNING", "TIFFANY_LOG_FORMAT": "json"}
    journals = ["file WAL"] + ([] if args.no_postgres else ["PostgreSQL"])
    total = args.runs * args.steps
    print(
        f"Part 1: {args.runs} runs x {args.steps} independent steps = {total:,} steps a round, "
        f"{os.cpu_count()} CPUs, rounds interleaved, best of {args.repeat} by steps/server CPU-s"
    )
    head = (
        f"{'journal':<11} {'engines':>7} | {'wall s':>6} {'steps/s':>8} | "
        f"{'CPU s: engines':>14} {'proj':>5} {'api':>5} {'db':>5} {'server':>6} {'client':>6} "
        f"{'machine':>7} | {'steps/server CPU-s':>18} {'x 1':>6} | "
        f"{'steps/machine CPU-s':>19} {'x 1':>6}"
    )
    print(head)
    print("-" * len(head))
    for journal in journals:
        best: dict[int, dict] = {}
        for _ in range(args.repeat):
            for engines in (1, 2):
                r = _round(journal, engines, args.runs, args.steps, base)
                r["per_server"] = total / r["cpu"]["server"]
                r["per_machine"] = total / r["machine"]
                if engines not in best or r["per_server"] > best[engines]["per_server"]:
                    best[engines] = r
        for engines in (1, 2):
            r, c = best[engines], best[engines]["cpu"]
            print(
                f"{journal:<11} {engines:>7} | {r['wall']:>6.2f} {total / r['wall']:>8,.0f} | "
                f"{c['engines']:>14.2f} {c['projectors']:>5.2f} {c['api']:>5.2f} "
                f"{c['database']:>5.2f} {c['server']:>6.2f} {c['client']:>6.2f} "
                f"{r['machine']:>7.2f} | {r['per_server']:>18,.0f} "
                f"{r['per_server'] / best[1]['per_server']:>5.2f}x | "
                f"{r['per_machine']:>19,.0f} {r['per_machine'] / best[1]['per_machine']:>5.2f}x"
            )


def _timed(n: int, fn: Any) -> float:
    """Calls per second of ``fn``, called ``n`` times one after the other."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


@contextlib.contextmanager
def _journal_stream(url: str) -> Iterator[Any]:
    from tiffany.wal.pg import PgLog

    log = PgLog.open(url, f"scaleout-{uuid.uuid4().hex[:8]}")
    try:
        yield log
    finally:
        log.close()


def _blocks(conn: Any, url: str, n: int, blocks: int) -> dict[str, list[float]]:
    """Part 2's calls per second, each statement ``n // blocks`` times a block, blocks alternating.

    On a shared machine the disk's sync time moves from second to second;
    alternating short blocks spreads that drift over every statement alike,
    where one long round each would hand it to whichever ran at a bad time.
    """
    from tiffany.durable import Runtime

    k = max(1, n // blocks)
    payload = b"x" * 100
    ids = itertools.count()
    rates: dict[str, list[float]] = {}
    with _journal_stream(url) as log:

        def append() -> None:
            log.append(1, payload)
            log.commit()

        calls = {
            "SELECT 1": lambda: conn.execute("SELECT 1").fetchone(),
            "one-row INSERT": lambda: conn.execute(
                "INSERT INTO scaleout_one VALUES (%s, %s)", (next(ids), payload)
            ),
            "journal: append + commit, 1 record": append,
        }
        for _ in range(blocks):
            for name, fn in calls.items():
                rates.setdefault(name, []).append(_timed(k, fn))
            with (
                tempfile.TemporaryDirectory() as d,
                _journal_stream(url) as steps_log,
                Runtime(d, fsync="batch", log=steps_log) as rt,
            ):
                rt.submit("durable_steps:sequential", k, True)
                t0 = time.perf_counter()
                rt.run()
                rate = k / (time.perf_counter() - t0)
            rates.setdefault("journal: sequential durable steps (inline)", []).append(rate)
    return rates


def part2(args: argparse.Namespace) -> None:
    import psycopg

    from tiffany.config import conninfo
    from tiffany.log import configure_logging

    configure_logging(log_level="WARNING")  # the stream's open and close lines, not figures
    n, blocks = args.appends, max(1, args.blocks)
    with _pg_schema(PG_URL) as url, psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute("CREATE TABLE scaleout_one (id bigint, payload bytea)")
        rates = _blocks(conn, url, n, blocks)
    med = {name: statistics.median(r) for name, r in rates.items()}
    floor = med["one-row INSERT"]
    print(
        f"\nPart 2: the PostgreSQL journal, one at a time: {blocks} blocks of "
        f"{max(1, n // blocks):,} calls of each, alternating; the median block "
        "(synchronous commits on the same server, same run)"
    )
    head = (
        f"{'statement':<44} {'ms':>7} {'per second':>11} {'min-max per second':>19} "
        f"{'x one-row INSERT':>17}"
    )
    print(head)
    print("-" * len(head))
    for name, v in med.items():
        ratio = "-" if name == "SELECT 1" else f"{v / floor:.2f}"
        spread = f"{min(rates[name]):,.0f}-{max(rates[name]):,.0f}"
        print(f"{name:<44} {1000 / v:>7.3f} {v:>11,.0f} {spread:>19} {ratio:>17}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--appends", type=int, default=2000, help="calls of each in part 2")
    parser.add_argument("--blocks", type=int, default=20, help="part 2's alternating blocks")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--parts", default="1,2", help="which parts to run: 1, 2 or 1,2")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if not parts or parts - {"1", "2"}:
        parser.error(f"--parts: 1, 2 or 1,2, not {args.parts!r}")
    for name in ("runs", "steps", "repeat", "appends", "blocks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if "1" in parts:
        part1(args)
    if "2" in parts and not args.no_postgres:
        part2(args)


if __name__ == "__main__":
    main()
