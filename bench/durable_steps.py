"""Durable steps: Tiffany against DBOS Transact, same machine, same run.

    python bench/durable_steps.py [--seq 10000] [--runs 100] [--steps 100] [--quick]
    python bench/durable_steps.py --journal postgres [--pg-url URL]   # both on PostgreSQL

Workloads (a trivial function journaled as a step):

* sequential: one run of ``--seq`` steps, one after the other;
* concurrent: ``--runs`` runs of ``--steps`` steps each, all at once.

Tiffany runs in this process on a fresh WAL (fsync policy ``batch``: one
fdatasync per loop iteration). DBOS 3.4 runs in its own virtual environment
(``bench/.envs/dbos``, created on first use from PyPI) on SQLite, in a
subprocess, so neither library's imports disturb the other. Printed: steps/s
for each and the ratio.

``--journal postgres``: Tiffany journals into a PostgreSQL stream
(``tiffany.wal.pg``: one transaction per group commit), in a schema of its own
created, migrated and dropped by the bench, and DBOS uses the same local
PostgreSQL server for its system database (issue 11's comparison).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import uuid
import venv
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tiffany.durable import Runtime, Step  # noqa: E402

ENV_DIR = ROOT / "bench" / ".envs" / "dbos"
DBOS_SPEC = "dbos==3.4.0"


def trivial(i: int) -> int:
    return i + 1


def sequential(n: int, inline: bool = False) -> object:
    total = 0
    for i in range(n):
        total += yield Step(trivial, i, inline=inline)
    return total


def _log(pg_url: str | None) -> object:
    """A fresh PostgreSQL stream to journal into, or None for the file WAL."""
    if pg_url is None:
        return None
    from tiffany.wal.pg import PgLog

    return PgLog.open(pg_url, f"bench-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def _pg_schema(url: str) -> Iterator[str]:
    """A migrated schema of its own on ``url`` (dropped at the end); yields its URL."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from tiffany.store import make_engine
    from tiffany.store.migrate import upgrade

    schema = f"bench_pgwal_{uuid.uuid4().hex[:8]}"
    admin = make_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    rendered = scoped.render_as_string(hide_password=False)
    engine = make_engine(rendered)
    upgrade(engine)
    engine.dispose()
    try:
        yield rendered
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _tiffany(
    seq: int, runs: int, per_run: int, fsync: str, inline: bool, pg_url: str | None = None
) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d, Runtime(d, fsync=fsync, log=_log(pg_url)) as rt:
        t0 = time.perf_counter()
        run_id = rt.submit("durable_steps:sequential", seq, inline)
        rt.run()
        out["sequential_steps_per_s"] = seq / (time.perf_counter() - t0)
        assert rt.status(run_id).result == sum(range(1, seq + 1))
    with tempfile.TemporaryDirectory() as d, Runtime(d, fsync=fsync, log=_log(pg_url)) as rt:
        t0 = time.perf_counter()
        ids = [rt.submit("durable_steps:sequential", per_run, inline) for _ in range(runs)]
        rt.run()
        elapsed = time.perf_counter() - t0
        assert all(rt.status(i).result == sum(range(1, per_run + 1)) for i in ids)
        out["concurrent_steps_per_s"] = runs * per_run / elapsed
        out["concurrent_runs_per_s"] = runs / elapsed
    return out


def _dbos(seq: int, runs: int, per_run: int, backend: str = "sqlite") -> dict[str, float] | None:
    python = ENV_DIR / "bin" / "python"
    if not python.exists():
        print(f"creating {ENV_DIR} with {DBOS_SPEC} (first run only)...", flush=True)
        venv.create(ENV_DIR, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", DBOS_SPEC], check=True)
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run(
            [
                str(python),
                str(ROOT / "bench" / "dbos_driver.py"),
                d,
                str(seq),
                str(runs),
                str(per_run),
                backend,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        print("DBOS failed:", proc.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seq", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--fsync", default="batch", choices=["always", "batch", "off"])
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--no-dbos", action="store_true")
    ap.add_argument("--journal", default="file", choices=["file", "postgres"])
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    if args.quick:
        args.seq, args.runs, args.steps = 500, 10, 20
    # DBOS is slow: give it the same work but cap its sequential run at 2,000 steps.
    dbos_seq = min(args.seq, 2_000)
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(_pg_schema(args.pg_url)) if args.journal == "postgres" else None
        pooled = _tiffany(args.seq, args.runs, args.steps, args.fsync, inline=False, pg_url=pg)
        inline = _tiffany(args.seq, args.runs, args.steps, args.fsync, inline=True, pg_url=pg)
    backend = "postgres" if args.journal == "postgres" else "sqlite"
    dbos = None if args.no_dbos else _dbos(dbos_seq, args.runs, args.steps, backend)
    where = "a PostgreSQL stream" if pg else f"the file WAL, fsync={args.fsync}"
    print(f"\ndurable steps: trivial function, Tiffany on {where}, DBOS {DBOS_SPEC} on {backend}")
    print("(thread: Step(fn) runs in the pool; inline: Step(fn, inline=True) runs on the loop")
    print(" thread at the commit point, as a DBOS step runs in its workflow's thread)")
    print(
        f"{'workload':<42}{'thread/s':>11}{'inline/s':>11}{'dbos/s':>10}{'thread':>9}{'inline':>9}"
    )
    rows = [
        (f"sequential: 1 run x {args.seq} (dbos {dbos_seq})", "sequential_steps_per_s"),
        (f"concurrent: {args.runs} runs x {args.steps} steps", "concurrent_steps_per_s"),
    ]
    for label, key in rows:
        d = dbos[key] if dbos else float("nan")
        print(
            f"{label:<42}{pooled[key]:>11,.0f}{inline[key]:>11,.0f}{d:>10,.0f}"
            f"{pooled[key] / d:>8.1f}x{inline[key] / d:>8.1f}x"
        )


if __name__ == "__main__":
    main()
