"""The engine's idle cost with 0, 1,000 and 20,000 idle schedules, and what it costs submissions.

For each count, a fresh data dir gets that many schedules that tick once a
year (``0 0 1 1 *``: idle), written straight into the store, then
``tiffany serve`` starts (a real subprocess on loopback). Once ready and
settled (``--settle``: the runner's first look at every row is done), the
bench reads the engine's CPU time over ``--seconds`` of idleness, then
times ``--submits`` sequential ``POST /api/runs`` of a one-step plan, and
reads the size of ``GET /api/schedules`` (before paging: every schedule in
one answer). Prints a table. Not a test: nothing here asserts on time.

    .venv/bin/python bench/schedules.py                       # 0, 1000, 20000
    .venv/bin/python bench/schedules.py --counts 0,20000 --seconds 20

It runs against the ``tiffany`` it imports, so the same file measures
another checkout: ``cd /work/main && .venv/bin/python <this file>``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from tiffany.store import make_engine
from tiffany.store.migrate import upgrade_url
from tiffany.store.models import Schedule

#: Longest a start may take before the bench gives up, in seconds.
START_TIMEOUT_S = 300.0
#: Rows inserted per statement while building.
BUILD_BATCH = 2_000
#: A cron expression that ticks once a year: the schedules stay idle.
YEARLY = "0 0 1 1 *"
PLAN = {"name": "bench", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}


def build(data_dir: Path, count: int) -> None:
    """Write ``count`` idle schedules into the data dir's store (migrated first)."""
    url = f"sqlite:///{data_dir / 'tiffany.db'}"
    upgrade_url(url)
    engine = make_engine(url)
    now = time.time()  # noqa: TID251 - a schedule's creation is a wall-clock time
    try:
        with engine.begin() as conn:
            for start in range(0, count, BUILD_BATCH):
                rows = [
                    {
                        "id": f"sched-{uuid.uuid4().hex[:12]}",
                        "name": "bench",
                        "plan": PLAN,
                        "inputs": {},
                        "cron": YEARLY,
                        "timezone": "UTC",
                        "catchup": "skip",
                        "paused": False,
                        "created_at": now + i * 1e-6,
                    }
                    for i in range(start, min(count, start + BUILD_BATCH))
                ]
                conn.execute(insert(Schedule), rows)
    finally:
        engine.dispose()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_ready(proc: subprocess.Popen[bytes], data_dir: Path) -> dict[str, Any]:
    deadline = time.perf_counter() + START_TIMEOUT_S
    info: dict[str, Any] = {}
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode}; see {data_dir / 'serve.log'}")
        if not info:
            with contextlib.suppress(OSError, ValueError):
                info = json.loads((data_dir / "serve.json").read_text())
        if info:
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(info["url"] + "readyz", timeout=5) as resp,
            ):
                if resp.status == 200 and info.get("engine_pid"):
                    return info
        time.sleep(0.05)
    raise RuntimeError("serve did not get ready in time")


def _submit_ms(base: str) -> float:
    body = json.dumps({"plan": PLAN, "inputs": {}}).encode()
    request = urllib.request.Request(
        base + "api/runs", data=body, headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()
    return (time.perf_counter() - t0) * 1000


def _list_bytes(base: str) -> int:
    with urllib.request.urlopen(base + "api/schedules", timeout=300) as resp:
        return len(resp.read())


def measure(count: int, seconds: float, settle: float, submits: int) -> dict[str, Any]:
    """Build, serve, and measure one count; return its row of the table."""
    data_dir = Path(tempfile.mkdtemp(prefix="tfbs-", dir="/tmp"))
    try:
        build(data_dir, count)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
        env.update(TIFFANY_LOG_FORMAT="json", TIFFANY_MAX_SCHEDULES=str(max(count, 1) * 2))
        argv = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir)]
        argv += ["serve", "--host", "127.0.0.1", "--port", "0"]
        with (data_dir / "serve.log").open("ab") as log:
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                info = _wait_ready(proc, data_dir)
                ready_s = time.perf_counter() - t0
                pid = int(info["engine_pid"])
                time.sleep(settle)  # the runner's first look at every row
                cpu0, wall0 = _cpu_s(pid), time.perf_counter()
                time.sleep(seconds)
                idle = (_cpu_s(pid) - cpu0) / (time.perf_counter() - wall0)
                latencies = [_submit_ms(info["url"]) for _ in range(submits)]
                listed = _list_bytes(info["url"])
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return {
            "schedules": count,
            "idle_cpu_pct": 100 * idle,
            "submit_p50_ms": statistics.median(latencies),
            "list_bytes": listed,
            "ready_s": ready_s,
        }
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    """Measure each count and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--counts", default="0,1000,20000", help="comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="idle window measured")
    parser.add_argument("--settle", type=float, default=10.0, help="wait after ready first")
    parser.add_argument("--submits", type=int, default=50)
    args = parser.parse_args()
    import tiffany

    print(f"tiffany from {Path(tiffany.__file__).parent.parent}")
    print("load average at start: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    print(
        "| schedules | engine CPU idle (% of a core) | submit p50 (ms) "
        "| GET /api/schedules (bytes) | start to ready (s) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for count in (int(c) for c in args.counts.split(",")):
        row = measure(count, args.seconds, args.settle, args.submits)
        print(
            f"| {row['schedules']:,} | {row['idle_cpu_pct']:.1f} | {row['submit_p50_ms']:.1f} "
            f"| {row['list_bytes']:,} | {row['ready_s']:.1f} |",
            flush=True,
        )
    print("load average at end: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
