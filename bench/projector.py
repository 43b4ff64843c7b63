"""The projector alone: a real journal applied to a fresh store, batch by batch.

    python bench/projector.py                          # this tree, SQLite and PostgreSQL
    python bench/projector.py --before ../main         # + another tree, side by side
    python bench/projector.py --batches 22,200 --postgres ''

First it makes a journal the way users do: ``tiffany serve`` under
``bench/api.py``'s open-loop load (its small plan: two sleeps in parallel,
then a ``file.write``) at 200 submissions a second for 10 s, about 2,000
runs and 70,000 records. Then, for each tree, store and batch size, a child
process (that tree on ``PYTHONPATH``) reads the records and applies them to
a fresh store (SQLite under a temporary dir; PostgreSQL in a database of its
own, dropped afterwards) with ``Projector.apply``, one batch at a time, as
the projector process does. A batch of 22 records is what one group commit
held at 200 submissions a second; at 500 a second, batches were 80 to 200
records.

Figures per cell: the projector's CPU per run and per record (its process's
``process_time``), the wall time, and, on PostgreSQL, the whole machine's
busy CPU seconds over the cell (the server's backends work there too).
Each child also prints a CPU-speed probe (``bench/api.py``'s ``cpu_probe``):
this host's speed moved by a factor of two from minute to minute.

Nothing here is a test: it prints, and asserts nothing on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _busy_jiffies() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(f) for f in fields[:3]) + sum(int(f) for f in fields[5:8])


def make_journal(where: Path, rate: float, seconds: float) -> Path:
    """Run serve under the open-loop load; return its WAL directory (the data dir is kept)."""
    sys.path.insert(0, str(HERE))
    import api

    async def load(url: str) -> None:
        pool = api.Pool(url)
        body = json.dumps({"plan": api.small_plan(), "inputs": {}}).encode()
        raw = api.build_request("POST", pool.hostport, "/api/runs", body)
        await api.open_loop(pool, raw, rate, seconds)
        await api.wait_finished(pool, 0)

    os.environ["TMPDIR"] = str(where)
    tempfile.tempdir = None
    with api.Serve(keep=True) as serve:
        asyncio.run(load(serve.url))
        return Path(serve.data_dir) / "wal"


def run_cell(wal: Path, url: str | None, batch: int) -> dict[str, Any]:
    """Apply ``wal`` to a fresh store at ``url`` (None: SQLite) in batches of ``batch``."""
    # The tree under test first (PYTHONPATH): bench/api.py puts this script's
    # tree at the front of sys.path when it is imported.
    from tiffany.errors import WalCorruptionError
    from tiffany.projector.apply import Projector
    from tiffany.projector.tail import WalTail
    from tiffany.store.migrate import upgrade
    from tiffany.store.session import make_engine

    sys.path.insert(0, str(HERE))
    import api

    source = WalTail(wal)
    records: list[Any] = []
    limit = 5_000
    while True:
        try:
            got = source.read(records[-1][0] if records else 0, 2**62, limit)
        except WalCorruptionError:  # the end of what serve wrote (a read past it raises)
            if limit == 1:
                break
            limit = 1  # the records before the end, one at a time
            continue
        if not got:
            break
        records.extend(got)
    runs = sum(1 for r in records if r[1] == 1)
    with tempfile.TemporaryDirectory(dir=wal.parent) as tmp:
        engine = make_engine(url or f"sqlite:///{tmp}/store.db", pool_pre_ping=False)
        upgrade(engine)
        projector = Projector(engine)
        probe = api.cpu_probe()
        batches = [records[i : i + batch] for i in range(0, len(records), batch)]
        busy, cpu, wall = _busy_jiffies(), time.process_time(), time.perf_counter()
        for chunk in batches:
            projector.apply(chunk)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        busy = (_busy_jiffies() - busy) / os.sysconf("SC_CLK_TCK")
        engine.dispose()
    import tiffany

    return {
        "tree": str(Path(tiffany.__file__).parent.parent),
        "records": len(records),
        "runs": runs,
        "cpu_s": cpu,
        "wall_s": wall,
        "machine_s": busy,
        "probe_ms": probe,
    }


def _database(url: str) -> tuple[str, str] | None:
    """A fresh database on ``url``'s server: (its URL, its name), or None if unreachable."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"bench_projector_{uuid.uuid4().hex[:8]}"
    try:
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
    except Exception as exc:  # reported; the PostgreSQL cells are skipped
        print(f"PostgreSQL not usable at {url}: {exc}")
        return None
    return make_url(url).set(database=name).render_as_string(hide_password=False), name


def _drop(url: str, name: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _cell(tree: Path, wal: Path, url: str | None, batch: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, __file__, "--cell", str(wal), "--batches", str(batch)]
    argv += ["--postgres", url or ""]  # "": SQLite (never the default server's database)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=tree)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"failed": (proc.stderr or proc.stdout)[-800:]}
    result: dict[str, Any] = json.loads(lines[-1])
    if Path(result["tree"]).resolve() != tree.resolve():
        return {"failed": f"the cell ran {result['tree']}, not {tree}"}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="another tree to compare (e.g. main)")
    parser.add_argument("--batches", default="22,200", help="comma-separated batch sizes")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("TIFFANY_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
        help="PostgreSQL URL ('' to skip)",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="the journal's load, req/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="the journal's load, s")
    parser.add_argument("--cell", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if args.cell is not None:
        print(json.dumps(run_cell(args.cell, args.postgres or None, batches[0])))
        return
    trees = [("this", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    where = Path(tempfile.mkdtemp(prefix="tiffany-bench-projector-"))
    wal = make_journal(where, args.rate, args.seconds)
    print(f"journal: {wal} ({args.rate:g} req/s for {args.seconds:g} s of bench/api.py's plan)")
    print(
        f"\n{'store':<10} {'batch':>5} {'tree':<7} {'probe ms':>8} {'records':>7} "
        f"{'CPU ms/run':>10} {'us/record':>9} {'wall s':>7} {'machine CPU s':>13}"
    )
    for store in ("sqlite", "postgres"):
        if store == "postgres" and not args.postgres:
            continue
        for batch in batches:
            for name, tree in trees:
                made = _database(args.postgres) if store == "postgres" else None
                if store == "postgres" and made is None:
                    continue
                try:
                    cell = _cell(tree, wal, made[0] if made else None, batch)
                finally:
                    if made is not None:
                        _drop(args.postgres, made[1])
                if "failed" in cell:
                    print(f"{store:<10} {batch:>5} {name:<7} failed: {cell['failed']}")
                    continue
                print(
                    f"{store:<10} {batch:>5} {name:<7} {cell['probe_ms']:>8.0f} "
                    f"{cell['records']:>7} {1000 * cell['cpu_s'] / cell['runs']:>10.3f} "
                    f"{1e6 * cell['cpu_s'] / cell['records']:>9.1f} {cell['wall_s']:>7.2f} "
                    f"{cell['machine_s']:>13.2f}",
                    flush=True,
                )
    print(f"\n(the journal's data dir is kept: {where})")


if __name__ == "__main__":
    main()
