"""Read-your-writes: ``POST /api/runs`` then at once ``GET /api/runs/{id}?min_seq=SEQ``.

    python bench/read_your_writes.py                       # this tree, SQLite and PostgreSQL
    python bench/read_your_writes.py --before ../main      # + another tree, side by side
    python bench/read_your_writes.py --rate 200 --seconds 20 --postgres URL

For each tree and each store (SQLite under the data dir; PostgreSQL in a
schema of its own, dropped afterwards; and PostgreSQL holding the journal
too, ``pg journal``: submissions, the feed and the store's marks through the
database) it starts ``tiffany serve`` from that
tree (``PYTHONPATH``; a child process of this script per cell) and drives an
**open-loop** load (``bench/api.py``'s generator: operation i is due at
``t0 + i / rate``): each operation submits a small plan and, as soon as the
201 arrives, reads the run back with the ``seq`` the submission answered
(``min_seq``; a tree whose submission answers no seq is read without it).
A 404 is counted, and the read is repeated every 5 ms until the run is
there, to time when it became visible.

Figures per cell: operations, the host's speed just before the load
(``cpu probe ms``: bench/api.py's ``cpu_probe``, a fixed Python loop; it
doubled at times on an idle 2-vCPU machine), 404s (the target: 0), other errors, the
submission's p50/p99 (from the due time), the read's p50/p99 (from the 201;
the target: p99 < 20 ms at 200 req/s), and the time from the 201 to the
first read that found the run, p50/p99/max. The cells are printed side by
side, with this tree's figures over the other's.

Nothing here is a test: it prints, and asserts nothing on time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _pg import drop_pg_schema, pg_schema  # bench/_pg.py: python bench/X.py puts bench/ first

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: The local PostgreSQL the tests use (``TIFFANY_TEST_POSTGRES_URL`` overrides it).
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
RATE = 200.0
SECONDS = 20.0
#: How often a read that found nothing is repeated (only to time visibility), in seconds.
RETRY_S = 0.005
#: The read latency target at ``RATE``.
TARGET_P99_MS = 20.0
PLAN = {"name": "ryw", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.05}}]}


# -- one cell (a child process, with the tree under test on PYTHONPATH) ------------------------


async def _operation(pool: Any, api: Any, due: float, out: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    raw = api.build_request("POST", pool.hostport, "/api/runs", json.dumps({"plan": PLAN}).encode())
    try:
        status, body = await pool.request(raw)
    except (OSError, asyncio.IncompleteReadError, api.HttpError, ValueError) as exc:
        out["errors"][f"POST {type(exc).__name__}"] += 1
        return
    acked = loop.time()
    out["post"].append(acked - due)
    if status != 201:
        out["errors"][f"POST {status}"] += 1
        return
    answer = json.loads(body)
    path = f"/api/runs/{answer['run_id']}"
    if "seq" in answer:
        path += f"?min_seq={answer['seq']}"
    first = True
    while True:
        sent = loop.time()
        try:
            status, _ = await pool.request(api.build_request("GET", pool.hostport, path))
        except (OSError, asyncio.IncompleteReadError, api.HttpError, ValueError) as exc:
            out["errors"][f"GET {type(exc).__name__}"] += 1
            return
        if first:
            took = loop.time() - sent
            out["get"].append(took)
            out["get_split"].append((took * 1000, pool.timing))
            first = False
        if status == 200:
            out["visible"].append(loop.time() - acked)
            return
        if status == 404:
            out["not_found"] += 1
        else:
            out["errors"][f"GET {status}"] += 1
        if loop.time() - acked > 30:
            out["errors"]["never visible"] += 1
            return
        await asyncio.sleep(RETRY_S)


async def _load(api: Any, url: str, rate: float, seconds: float) -> dict[str, Any]:
    pool = api.Pool(url)
    out: dict[str, Any] = {"post": [], "get": [], "get_split": [], "visible": [], "not_found": 0}
    out["errors"] = Counter()
    loop = asyncio.get_running_loop()
    n = max(1, round(rate * seconds))
    tasks = set()
    t0 = loop.time() + 0.2
    for i in range(n):
        due = t0 + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(_operation(pool, api, due, out))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks)
    pool.close()
    out["operations"] = n
    out["errors"] = dict(out["errors"])
    return out


def run_cell(
    database_url: str | None, rate: float, seconds: float, journal: str = "file"
) -> dict[str, Any]:
    """Start serve from the tree on ``sys.path`` and drive the load; return the raw figures."""
    sys.path.insert(0, str(HERE))
    import api  # bench/api.py: Serve, Pool, build_request (after the tree is on sys.path)

    env = {"TIFFANY_DATABASE_URL": database_url} if database_url else {}
    if journal == "postgres":  # requests, feed and marks through the database
        env["TIFFANY_JOURNAL"] = "postgres"
    with api.Serve(env=env) as serve:
        deadline = time.monotonic() + 60
        while True:  # ready: the engine is up and the store answers
            with contextlib.suppress(OSError):
                import urllib.request

                with urllib.request.urlopen(serve.url + "readyz", timeout=5) as resp:
                    if resp.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve not ready:\n{serve.log_tail()}")
            time.sleep(0.1)
        probe = api.cpu_probe()  # the host's speed now (bench/api.py)
        out: dict[str, Any] = asyncio.run(_load(api, serve.url, rate, seconds))
        out["cpu_probe_ms"] = probe
        return out


# -- the parent: cells side by side ---------------------------------------------------------------


def _cell(
    tree: Path, database_url: str | None, args: argparse.Namespace, journal: str = "file"
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, __file__, "--cell", "--rate", str(args.rate)]
    argv += ["--seconds", str(args.seconds), "--journal", journal]
    if database_url:
        argv += ["--database-url", database_url]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=tree)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"failed": (proc.stderr or proc.stdout)[-800:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] * 1000


def _rows(cell: dict[str, Any]) -> dict[str, str]:
    if "failed" in cell:
        return {"operations": "failed"}
    return {
        "operations": str(cell["operations"]),
        "cpu probe ms": f"{cell.get('cpu_probe_ms', float('nan')):.0f}",
        "404s": str(cell["not_found"]),
        "other errors": str(sum(cell["errors"].values()) if cell["errors"] else 0),
        "POST p50 ms": f"{_pct(cell['post'], 0.5):.1f}",
        "POST p99 ms": f"{_pct(cell['post'], 0.99):.1f}",
        "GET p50 ms": f"{_pct(cell['get'], 0.5):.1f}",
        "GET p99 ms": f"{_pct(cell['get'], 0.99):.1f}",
        "201->visible p50 ms": f"{_pct(cell['visible'], 0.5):.1f}",
        "201->visible p99 ms": f"{_pct(cell['visible'], 0.99):.1f}",
        "201->visible max ms": f"{_pct(cell['visible'], 1.0):.1f}",
        **_tail_split(cell.get("get_split", [])),
    }


def _tail_split(split: list[tuple[float, dict[str, float]]]) -> dict[str, str]:
    """Where the slowest 1% of GETs spent their time, mean ms (from ``Server-Timing``).

    ``outside``: the GET's time not inside the app (the client's loop, the
    sockets, uvicorn's parsing and the API's event loop queue).
    """
    timed = [(took, parts) for took, parts in split if parts]
    if not timed:
        return {}
    timed.sort(key=lambda pair: pair[0])
    tail = timed[min(len(timed) - 1, round(0.99 * len(timed)) - 1) :]
    rows = {}
    for part in ("projected", "queue", "store", "app"):
        mean = sum(parts.get(part, 0.0) for _, parts in tail) / len(tail)
        rows[f"GET top 1%: {part} ms"] = f"{mean:.1f}"
    outside = sum(took - parts.get("app", 0.0) for took, parts in tail) / len(tail)
    rows["GET top 1%: outside ms"] = f"{outside:.1f}"
    return rows


def _ratio(this: dict[str, Any], other: dict[str, Any], key: str) -> str:
    if "failed" in this or "failed" in other:
        return "-"
    a, b = _pct(this[key], 0.99), _pct(other[key], 0.99)
    return f"{a / b:.2f}x" if b else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=RATE)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--before", type=Path, help="another tree to compare (e.g. main)")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("TIFFANY_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
        help="PostgreSQL URL ('' to skip)",
    )
    parser.add_argument(
        "--stores",
        default="sqlite,postgres,pg journal",
        help="comma-separated cells to run (sqlite, postgres, pg journal)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat the cells, the trees' order swapped each round (a table per round)",
    )
    parser.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--journal", default="file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(run_cell(args.database_url, args.rate, args.seconds, args.journal)))
        return
    trees = [("this", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    for ordinal in range(args.rounds):
        if args.rounds > 1:
            print(f"\nround {ordinal + 1} of {args.rounds}: {', '.join(n for n, _ in trees)}")
        _print(_round(trees, stores, args), args)
        trees.reverse()  # the other tree first next time: neither always runs on a warmer machine


def _round(
    trees: list[tuple[str, Path]], stores: list[str], args: argparse.Namespace
) -> dict[tuple[str, str], dict[str, Any]]:
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for store in stores:
        for name, tree in trees:
            handle = None
            url = None
            if store != "sqlite":
                if not args.postgres:
                    continue
                made = pg_schema(args.postgres, "bench_ryw")
                if made is None:
                    continue
                url, handle = made
            try:
                journal = "postgres" if store == "pg journal" else "file"
                cells[(store, name)] = _cell(tree, url, args, journal)
            finally:
                if handle is not None:
                    drop_pg_schema(handle)
    return cells


def _print(cells: dict[tuple[str, str], dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nread-your-writes: POST then GET ?min_seq at {args.rate:g} req/s for {args.seconds:g} s"
        f" (open loop; target: 0 404s, GET p99 < {TARGET_P99_MS:g} ms)\n"
    )
    keys = list(cells)
    width = 22
    print("".ljust(width) + "".join(f"{s} {n}".rjust(18) for s, n in keys))
    labels = list(_rows(next(iter(cells.values()))).keys()) if cells else []
    for label in labels:
        row = label.ljust(width)
        for key in keys:
            row += _rows(cells[key]).get(label, "-").rjust(18)
        print(row)
    for store in ("sqlite", "postgres", "pg journal"):
        this, other = cells.get((store, "this")), cells.get((store, "before"))
        if this is not None and other is not None:
            print(
                f"{store}: GET p99 this/before {_ratio(this, other, 'get')}, "
                f"201->visible p99 this/before {_ratio(this, other, 'visible')}"
            )
    for key, cell in cells.items():
        if "failed" in cell:
            print(f"{key}: failed: {cell['failed']}")
        elif cell["errors"]:
            print(f"{key}: errors {cell['errors']}")


if __name__ == "__main__":
    main()
