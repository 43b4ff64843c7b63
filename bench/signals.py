"""Signal round trip: ``POST /api/runs/{id}/signals/{name}`` to the waiting step resumed, vs DBOS.

    python bench/signals.py                    # 200 round trips per cell, one in flight (~1 min)
    python bench/signals.py --quick            # 20 (a smoke run)
    python bench/signals.py --runs 500 --concurrency 4 --no-pg-journal

Tiffany (``tiffany serve`` on a temporary data dir, 127.0.0.1, port 0, WAL
fsync ``batch``; ``bench/api.py``'s :class:`Serve` and HTTP client): each
round trip submits a plan whose first step waits in ``signal.wait`` (name
``approve``) and whose second is a ``sleep 0`` after it, opens the run's
activity websocket (``WS /ws/activity?run_id=RUN``), polls ``GET
/api/runs/{id}?min_seq=SEQ`` every 5 ms until the store shows the step
``waiting: "signal approve"``, then sends ``POST .../signals/approve`` and
times

* ``POST``: from sending the request to its 202 (the signal's record is
  durable: fsync ``batch``);
* ``resumed (ws)``: from sending the POST to the arrival on the websocket of
  the waiting worker's first ``step`` event after the signal (same ``ltid``,
  ``wal_seq`` at least the signal's seq). That event is the worker's first
  dispatch after it resumed: the ``signal.wait`` coroutine ran and returned
  the payload (its label is ``return``). The ``woke`` event before it only
  says the task was made runnable, and ``signal`` is published when the
  record is queued; the step's ``step`` event is the first one that proves
  the step's code ran again. The API's feed relay gathers a trickle of events
  for up to 25 ms before it writes them (``tiffany.feed.relay.FLUSH_S``), so
  this figure includes up to 25 ms of batching;
* ``resumed (engine)``: from sending the POST (``time.time()`` here) to that
  same event's ``ts``, the engine's ``time.time()`` when the worker's
  dispatch was published (same machine, same clock): when the step resumed,
  without the relay's batching. This is the figure to hold against DBOS's.

``--pg-journal`` (on by default when PostgreSQL answers): the same against
``serve`` with ``TIFFANY_JOURNAL=postgres`` and the store in a fresh schema
of the local PostgreSQL (dropped afterwards): the signal's record goes
through the database, as DBOS's does.

DBOS (3.4, in ``bench/.envs/dbos``, created on first use from PyPI, as
``durable_steps.py`` does; ``dbos_driver.signals_main``) on the local
PostgreSQL, in a fresh database dropped afterwards: a workflow
``DBOS.recv("approve")``s then runs a trivial step; the driver waits until
DBOS lists the recv's timeout record (it is past its set-up and waits), then
``DBOS.send``s the message from outside any workflow. ``send`` is the call's
latency (an in-process call and a database commit: no HTTP, unlike the
POST); ``resumed`` is from before the send to ``time.perf_counter()`` taken
in the workflow right after recv returned (same process).

Both sides: ``--warmup`` round trips first (not counted), then ``--runs``
round trips, ``--concurrency`` at a time (default 1: one signal in flight).
``runs/s`` is round trips / the loop's wall time, each including the
submission (or workflow start) and the wait until the step waits. ``CPU``
is the machine's CPU milliseconds per round trip (``/proc/stat``: every
process, PostgreSQL included), with Tiffany's processes apart. Ratios are
DBOS / Tiffany: above 1, Tiffany is faster.

Nothing here is a test: it prints, and asserts nothing on time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import venv
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import websockets  # noqa: E402
from api import (  # noqa: E402
    HttpError,
    Pool,
    Serve,
    Table,
    build_request,
    header,
    machine_busy_s,
    ms,
    percentile,
    wait_finished,
)
from durable_steps import DBOS_SPEC, ENV_DIR  # noqa: E402
from read_your_writes import DEFAULT_POSTGRES, _drop, _pg_schema  # noqa: E402

RUNS = 200
QUICK_RUNS = 20
WARMUP = 10
QUICK_WARMUP = 3
#: How often the store is read while the step is not yet waiting, in seconds.
POLL_S = 0.005
#: How long one round trip may take (submission to resumed), in seconds.
ROUND_TRIP_TIMEOUT_S = 60.0
#: How long the DBOS cell may take, in seconds.
DBOS_TIMEOUT_S = 900.0
SIGNAL = "approve"
PLAN = {
    "name": "bench-signal",
    "steps": [
        {"id": "approve", "tool": "signal.wait", "args": {"name": SIGNAL, "timeout_s": 600}},
        {"id": "after", "tool": "sleep", "args": {"seconds": 0}, "after": ["approve"]},
    ],
}
ERRORS = (OSError, asyncio.IncompleteReadError, HttpError, ValueError, KeyError, TimeoutError)


class RoundTripError(Exception):
    """A round trip that did not complete (counted, not timed)."""


# -- Tiffany -------------------------------------------------------------------------------------


def wait_ready(serve: Serve, timeout: float = 60.0) -> None:
    """Wait until ``/readyz`` answers 200 (the engine is up and the store answers)."""
    deadline = time.monotonic() + timeout
    while True:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(serve.url + "readyz", timeout=5) as resp,
        ):
            if resp.status == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"serve not ready:\n{serve.log_tail()}")
        time.sleep(0.1)


async def _post(pool: Pool, path: str, body: bytes, want: int) -> dict[str, Any]:
    status, answer = await pool.request(build_request("POST", pool.hostport, path, body))
    if status != want:
        raise RoundTripError(f"POST {path}: HTTP {status} {answer[:200]!r}")
    return dict(json.loads(answer))


async def round_trip(pool: Pool) -> dict[str, float]:
    """Submit, wait until the step waits, signal it, time the POST and the resume."""
    loop = asyncio.get_running_loop()
    submitted = await _post(pool, "/api/runs", json.dumps({"plan": PLAN}).encode(), 201)
    run_id, seq = submitted["run_id"], submitted["seq"]
    events: list[tuple[float, dict[str, Any]]] = []  # (arrival, event), stamped by the reader
    async with websockets.connect(
        f"ws://{pool.hostport}/ws/activity?run_id={run_id}", max_size=None
    ) as ws:

        async def read() -> None:
            async for message in ws:
                at = time.perf_counter()
                frame = json.loads(message)
                if isinstance(frame, dict) and "kind" in frame:
                    events.append((at, frame))

        reader = asyncio.create_task(read())
        try:
            deadline = loop.time() + ROUND_TRIP_TIMEOUT_S
            ltid = None
            while ltid is None:  # the store shows the step waiting for the signal
                run = await pool.get_json(f"/api/runs/{run_id}?min_seq={seq}")
                step = next(s for s in run["steps"] if s["step_id"] == "approve")
                if step.get("waiting") == f"signal {SIGNAL}":
                    ltid = next(t["ltid"] for t in run["tasks"] if t["step_id"] == "approve")
                    break
                if run["status"] != "running" or loop.time() > deadline:
                    raise RoundTripError(f"{run_id}: the step never waited ({run['status']})")
                await asyncio.sleep(POLL_S)
            sent_wall, sent = time.time(), time.perf_counter()  # noqa: TID251 - vs the event's ts
            answer = await _post(pool, f"/api/runs/{run_id}/signals/{SIGNAL}", b'{"ok":true}', 202)
            acked = time.perf_counter()
            signal_seq = int(answer["seq"])
            while True:
                hit = next(
                    (
                        (at, e)
                        for at, e in events
                        if e.get("ltid") == ltid
                        and e.get("kind") == "step"
                        and int(e.get("wal_seq") or 0) >= signal_seq
                    ),
                    None,
                )
                if hit is not None:
                    break
                if reader.done() or loop.time() > deadline:
                    raise RoundTripError(f"{run_id}: no step event of the worker after the signal")
                # The reader stamps each arrival itself: how soon this loop looks is not timed.
                await asyncio.sleep(0.001)
        finally:
            reader.cancel()
            # asyncio.wait, not `await reader`: a cancellation of this task is never swallowed.
            await asyncio.wait({reader})
    at, event = hit
    return {"post": acked - sent, "ws": at - sent, "engine": float(event["ts"]) - sent_wall}


async def _loop(pool: Pool, count: int, out: dict[str, Any]) -> None:
    for _ in range(count):
        try:
            r = await round_trip(pool)
        except (RoundTripError, *ERRORS, websockets.WebSocketException) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # A Ctrl-C that landed while the websocket closed: websockets may raise
                # ConnectionClosed in its place. Stop, do not count it as an error.
                raise asyncio.CancelledError from exc
            out["errors"][f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
            continue
        for key in ("post", "ws", "engine"):
            out[key].append(r[key])


def shares(total: int, k: int) -> list[int]:
    """``total`` split into ``k`` near-equal parts."""
    return [total // k + (1 if i < total % k else 0) for i in range(k)]


async def tiffany_cell(
    label: str, args: argparse.Namespace, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One ``serve``: warm up, then ``args.runs`` round trips, ``args.concurrency`` at a time."""
    out: dict[str, Any] = {"post": [], "ws": [], "engine": [], "errors": Counter()}
    with Serve(env=env) as serve:
        await asyncio.to_thread(wait_ready, serve)
        print(f"{label}: {serve.url} (data dir {serve.data_dir})", flush=True)
        pool = Pool(serve.url)
        await _loop(pool, args.warmup, {"post": [], "ws": [], "engine": [], "errors": Counter()})
        cpu0, busy0, gen0 = serve.cpu3(), machine_busy_s(), time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(_loop(pool, n, out) for n in shares(args.runs, args.concurrency)))
        wall = time.perf_counter() - t0
        cpu1, busy1, gen1 = serve.cpu3(), machine_busy_s(), time.process_time()
        _, counts = await wait_finished(pool, args.warmup + args.runs)
        pool.close()
    done = len(out["post"])
    out.update(
        runs=done,
        wall_s=wall,
        runs_per_s=done / wall if wall else math.nan,
        cpu_machine_ms=1000 * (busy1 - busy0) / max(done, 1),
        cpu_ms={
            name: 1000 * (c1 - c0) / max(done, 1)
            for name, c0, c1 in zip(
                ("engine", "api", "projector", "client"), (*cpu0, gen0), (*cpu1, gen1), strict=True
            )
        },
        counts=counts,
        errors=dict(out["errors"]),
    )
    return out


# -- DBOS ----------------------------------------------------------------------------------------


def dbos_python() -> Path:
    """The DBOS environment's python (created on first use, as ``durable_steps.py`` does)."""
    python = ENV_DIR / "bin" / "python"
    if not python.exists():
        print(f"creating {ENV_DIR} with {DBOS_SPEC} (first run only)...", flush=True)
        venv.create(ENV_DIR, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", DBOS_SPEC], check=True)
    return python


def dbos_cell(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``dbos_driver.signals_main`` on a fresh database of the local PostgreSQL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(args.postgres)
    database = f"bench_signals_{uuid.uuid4().hex[:10]}"
    url = base.set(drivername="postgresql", database=database).render_as_string(hide_password=False)
    admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import dbos_driver; "
    code += "dbos_driver.signals_main()"
    argv = [str(dbos_python()), "-c", code, url, str(args.runs), str(args.concurrency)]
    argv.append(str(args.warmup))
    proc: subprocess.Popen[str] | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="tiffany-bench-dbos-") as cwd:
            # A session of its own: a Ctrl-C reaches this script, which stops the driver.
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                stdout, stderr = proc.communicate(timeout=DBOS_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return {"failed": f"no answer within {DBOS_TIMEOUT_S:g} s"}
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(Exception), admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"failed": (stderr or stdout)[-1500:]}
    raw = json.loads(lines[-1])
    done = int(raw["runs"])
    return {
        "post": raw["send"],
        "engine": raw["roundtrip"],
        "ws": [],
        "runs": done,
        "wall_s": raw["wall_s"],
        "runs_per_s": done / raw["wall_s"] if raw["wall_s"] else math.nan,
        "cpu_machine_ms": 1000 * raw["cpu_machine_s"] / max(done, 1),
        "cpu_ms": {"process": 1000 * raw["cpu_process_s"] / max(done, 1)},
        "errors": {},
    }


def postgres_ok(url: str) -> str | None:
    """None if the PostgreSQL at ``url`` answers, else why not."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    if make_url(url).host != "127.0.0.1":
        return f"{url}: this bench only uses 127.0.0.1"
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # reported, and the PostgreSQL cells skipped
        return f"PostgreSQL not usable at {url}: {str(exc).splitlines()[0]}"
    finally:
        engine.dispose()
    return None


# -- the tables ----------------------------------------------------------------------------------


def q(values: list[float], p: float) -> float:
    return percentile(sorted(values), p)


def print_results(cells: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nsignal round trip, {args.runs} runs per cell, {args.concurrency} in flight "
        f"(after {args.warmup} warm-up runs); ms"
    )
    names = list(cells)
    table = Table(["", *names], widths=[36, *(max(12, len(n)) for n in names)])

    def row(label: str, fn: Any) -> None:
        cells_text = []
        for name in names:
            c = cells[name]
            cells_text.append("failed" if "failed" in c else fn(c))
        table.row([label, *cells_text])

    row("round trips", lambda c: str(c["runs"]))
    row("errors", lambda c: str(sum(c["errors"].values())))
    for what, key in (
        ("POST->202 | DBOS.send", "post"),
        ("resumed, in engine | workflow", "engine"),
        ("resumed, seen on the ws", "ws"),
    ):
        for label, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)):
            row(f"{what} {label}", lambda c, k=key, p=p: ms(q(c[k], p)) if c[k] else "-")
    row("runs/s", lambda c: f"{c['runs_per_s']:.1f}")
    row("CPU ms / round trip (machine)", lambda c: f"{c['cpu_machine_ms']:.1f}")
    print(
        "  from before the POST | send to: its answer; the step resumed (Tiffany: the engine's "
        "ts of the waiting worker's first dispatch after the signal; DBOS: perf_counter right "
        "after recv returned); that event's arrival on the run's websocket (with the API "
        "relay's batching of up to 25 ms)"
    )
    for name, c in cells.items():
        if "failed" in c:
            print(f"  {name}: FAILED: {c['failed']}")
            continue
        split = " / ".join(f"{k} {v:.2f}" for k, v in c["cpu_ms"].items())
        print(f"  {name}: CPU ms per round trip by process: {split}")
        if c["errors"]:
            print(f"  {name}: errors: {c['errors']}")
        if "counts" in c:
            print(f"  {name}: store at the end: {c['counts']}")
    dbos = cells.get("dbos")
    if dbos is None or "failed" in dbos:
        return
    print("\nDBOS / Tiffany (above 1: Tiffany faster)")
    ratios = Table(["tiffany cell", "figure", "p50", "p99"], widths=[12, 36, 7, 7])
    for name, c in cells.items():
        if name == "dbos" or "failed" in c or not c["engine"]:
            continue
        for label, d_key, t_key in (
            ("POST 202 vs DBOS.send", "post", "post"),
            ("resumed, in engine vs workflow", "engine", "engine"),
            ("resumed, seen on ws vs in workflow", "engine", "ws"),
        ):
            ratios.row(
                [
                    name,
                    label,
                    *(f"{q(dbos[d_key], p) / q(c[t_key], p):.2f}" for p in (0.5, 0.99)),
                ]
            )


async def tiffany_cells(args: argparse.Namespace, pg: bool) -> dict[str, dict[str, Any]]:
    """Tiffany on the file WAL, then (``pg``) on the PostgreSQL journal."""
    cells: dict[str, dict[str, Any]] = {}
    cells["tiffany"] = await tiffany_cell("tiffany (file WAL)", args)
    if pg and args.pg_journal:
        made = await asyncio.to_thread(_pg_schema, args.postgres)
        if made is not None:
            url, handle = made
            try:
                env = {"TIFFANY_DATABASE_URL": url, "TIFFANY_JOURNAL": "postgres"}
                cells["tiffany pg"] = await tiffany_cell("tiffany (pg journal)", args, env)
            finally:
                await asyncio.to_thread(_drop, handle)
    return cells


def run_cells(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every cell, one after the other (DBOS's in this thread, so a signal stops its driver)."""
    pg_problem = postgres_ok(args.postgres) if args.postgres else "no --postgres URL"
    if pg_problem:
        print(f"{pg_problem}: the PostgreSQL cells (Tiffany pg journal, DBOS) are skipped")
    cells = asyncio.run(tiffany_cells(args, pg=pg_problem is None))
    if pg_problem is None and not args.no_dbos:
        print(f"dbos: {DBOS_SPEC} on PostgreSQL (a fresh database)", flush=True)
        cells["dbos"] = dbos_cell(args)
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs per cell")
    ap.add_argument("--runs", type=int, help=f"round trips per cell (default {RUNS})")
    ap.add_argument("--warmup", type=int, help=f"uncounted round trips first (default {WARMUP})")
    ap.add_argument("--concurrency", type=int, default=1, help="round trips in flight")
    ap.add_argument(
        "--postgres",
        default=os.environ.get("TIFFANY_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
        help="the local PostgreSQL ('' to skip the PostgreSQL cells)",
    )
    ap.add_argument(
        "--pg-journal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run Tiffany on the PostgreSQL journal",
    )
    ap.add_argument("--no-dbos", action="store_true", help="skip the DBOS cell")
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    if args.runs is None:
        args.runs = QUICK_RUNS if args.quick else RUNS
    if args.warmup is None:
        args.warmup = QUICK_WARMUP if args.quick else WARMUP
    args.concurrency = max(1, min(args.concurrency, args.runs))
    # SIGTERM unwinds like Ctrl-C: serve stopped, the driver stopped, temp dirs and DBs dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    header("bench/signals.py", args.quick)
    started = time.monotonic()
    try:
        cells = run_cells(args)
    except KeyboardInterrupt:
        sys.exit("interrupted (servers stopped, temp dirs and databases removed)")
    print_results(cells, args)
    print(f"\n(wall time {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(cells, indent=2, default=str))
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
