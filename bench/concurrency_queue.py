"""Concurrency limits: 1,000 runs queued on one key drain at the engine's full speed.

    python bench/concurrency_queue.py                 # 1,000 runs a cell (~1 min)
    python bench/concurrency_queue.py --runs 200      # smaller

Starts ``tiffany serve`` (bench/api.py's ``Serve``: 127.0.0.1, port 0, WAL
fsync ``batch``) once per cell and submits ``--runs`` runs of a one-step plan
(a ``file.write``) as fast as the API takes them (4 client threads), then
waits until the store shows them all finished. Cells, side by side in one
run: no limit (every run admitted at once: the engine's full speed), and
``concurrency: {key: "one", limit: L}`` for L = 1, 2 and 8 (every run on one
key: all but L queue, FIFO, and start as slots free up). Reported: runs/s
from the first submission to the last run finished in the store, and the
engine's, the API's and the projector's CPU per run. A queue that drains at
full speed shows a limited cell's runs/s near the unlimited one (the runs are
short: the limit is not what bounds them) and little extra CPU per run (the
slot is one journaled signal a run).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api import Serve, header

FINISHED = ("succeeded", "failed", "cancelled")
#: Client threads submitting (each with one keep-alive connection).
THREADS = 4


def plan(limit: int | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "queued",
        "steps": [{"id": "w", "tool": "file.write", "args": {"path": "w.txt", "content": "w"}}],
    }
    if limit is not None:
        doc["concurrency"] = {"key": "one", "limit": limit}
    return doc


def cell(limit: int | None, runs: int) -> dict[str, Any]:
    body = {"plan": plan(limit)}
    with Serve() as serve, httpx.Client(base_url=serve.url, timeout=60) as client:
        client.post("api/runs", json=body).raise_for_status()  # warm up
        time.sleep(0.5)
        cpu0 = serve.cpu3()
        t0 = time.perf_counter()

        local = threading.local()
        raw = json.dumps(body).encode()
        headers = {"content-type": "application/json"}

        def submit(_: int) -> None:
            c = getattr(local, "client", None)
            if c is None:  # one keep-alive connection a thread
                c = local.client = httpx.Client(base_url=serve.url, timeout=60)
            c.post("api/runs", content=raw, headers=headers).raise_for_status()

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(submit, range(runs)))
        submitted = time.perf_counter() - t0
        most_running = 0
        while True:
            counts = client.get("api/runs", params={"limit": 1}).json()["counts"]
            done = sum(counts.get(s, 0) for s in FINISHED)
            most_running = max(most_running, counts.get("running", 0))
            if done >= runs + 1:
                break
            time.sleep(0.01)
        wall = time.perf_counter() - t0
        cpu = [b - a for a, b in zip(cpu0, serve.cpu3(), strict=True)]
        failed = counts.get("failed", 0) + counts.get("cancelled", 0)
    return {
        "limit": limit,
        "wall": wall,
        "submitted": submitted,
        "rate": runs / wall,
        "cpu_ms": [1000 * c / runs for c in cpu],
        "failed": failed,
        "most_running": most_running,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    header("bench/concurrency_queue.py", False)
    cells = [cell(limit, args.runs) for limit in (None, 1, 2, 8)]
    base = cells[0]["rate"]
    print(f"\n{args.runs} runs of a one-step plan, submitted by 4 client threads; runs/s from the")
    print("first submission to the last run finished in the store; CPU ms a run: eng/api/proj")
    print(
        f"{'limit':<10}{'runs/s':>9}{'x none':>8}{'submit s':>10}{'max running':>13}{'CPU ms':>22}"
    )
    for c in cells:
        name = "none" if c["limit"] is None else str(c["limit"])
        cpu = " / ".join(f"{v:.2f}" for v in c["cpu_ms"])
        print(
            f"{name:<10}{c['rate']:>9.0f}{c['rate'] / base:>8.2f}{c['submitted']:>10.2f}"
            f"{c['most_running']:>13}{cpu:>22}"
            + (f"  ({c['failed']} failed!)" if c["failed"] else "")
        )
    print("max running: the most runs the store showed running at once (sampled every 10 ms)")


if __name__ == "__main__":
    main()
