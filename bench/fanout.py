"""Fair fan-out: submission latency with 0 subscribers vs 200 stalled + 100 reading.

    python bench/fanout.py                  # 200 stalled + 100 reading, 100 submissions a phase
    python bench/fanout.py --quick          # 50 stalled + 20 reading, 40 submissions
    python bench/fanout.py --stalled 200 --readers 100 --submissions 200 --mode frames

One ``tiffany serve`` (as ``bench/api.py`` starts it), two phases on it:

1. **none**: ``--submissions`` ``POST /api/runs`` of a one-step plan
   (``sleep 0.01``), one after the other on one keep-alive connection;
   each one's latency is recorded.
2. **loaded**: ``--stalled`` raw sockets (4 KiB receive buffer) complete the
   websocket handshake on ``/ws/activity`` (one event a message, the
   costliest mode) and never read again; ``--readers`` websocket clients
   (``batch=true`` as the dashboard reads, or ``--mode frames``) read every
   event, in a child process of their own, niced (they stand for browsers
   on other machines: their CPU must not be taken from the server's).
   Then the same submissions are timed again.

Printed: submit p50/p99/max of each phase and the ratio loaded/none (the
target: p99 within 2x), how many stalled sockets were cut off (a ``cutoff``
frame, a close frame or the connection closed) and when, what the readers
received (events, gaps in the seqs, cutoffs they resumed from), how many
websockets the API refused at its cap, and the API's RSS.

Everything shares the machine (``cpu`` shows what else ran); the figures
of a loaded machine are noisy: run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from api import Serve, machine_busy_s, percentile  # noqa: E402
from feed import StalledSubscriber, missing_before  # noqa: E402

PLAN = {"name": "fanout", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0.01}}]}
TARGET_RATIO = 2.0
REFUSED = "websocket refused: too many subscribers"


def rss_mb(pid: int | None) -> float:
    """Resident memory of ``pid`` in MB (nan when gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return math.nan


def submit(url: str, n: int) -> list[float]:
    """Submit ``n`` runs one after the other; return each latency in seconds."""
    host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = json.dumps({"plan": PLAN}).encode()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("POST", "/api/runs", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        out.append(time.perf_counter() - t0)
        if resp.status != 201:
            raise RuntimeError(f"submission answered {resp.status}: {data[:200]!r}")
    conn.close()
    return out


def figures(lat: list[float]) -> tuple[float, float, float]:
    s = sorted(lat)
    return percentile(s, 0.5), percentile(s, 0.99), s[-1]


# -- the readers (a child process) ------------------------------------------------


async def _reader(url: str, batch: bool, stats: dict[str, int], stop: asyncio.Event) -> None:
    import websockets

    last: int | None = None
    url = "ws://" + url.split("//", 1)[1]
    while not stop.is_set():
        query = "?batch=true" if batch else "?"
        if last is not None:
            query += f"&since={last}"
        try:
            async with websockets.connect(
                url + "ws/activity" + query, compression=None, max_size=None, proxy=None
            ) as ws:
                stats["connected"] += 1
                async for msg in ws:
                    doc = json.loads(msg)
                    for frame in doc if isinstance(doc, list) else [doc]:
                        seq = frame.get("seq")
                        if seq is None:
                            if frame.get("type") == "cutoff":
                                stats["cutoffs"] += 1
                            continue
                        if last is not None and missing_before(last, seq, frame["wal_seq"]):
                            stats["gaps"] += 1
                        last = seq
                        stats["events"] += 1
                    if stop.is_set():
                        return
        except websockets.ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == 1013 and last is None:
                stats["refused"] += 1
                await asyncio.sleep(1)
        except OSError:
            await asyncio.sleep(0.5)


async def _readers(url: str, n: int, batch: bool) -> None:
    stats = {"connected": 0, "events": 0, "gaps": 0, "cutoffs": 0, "refused": 0}
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_reader(url, batch, stats, stop)) for _ in range(n)]
    deadline = time.monotonic() + 60
    while stats["connected"] < n:
        if time.monotonic() > deadline or all(t.done() for t in tasks):
            raise SystemExit(f"only {stats['connected']} of {n} readers connected")
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await asyncio.sleep(1.0)  # the last events
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(stats), flush=True)


# -- main ------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stalled", type=int, default=200)
    ap.add_argument("--readers", type=int, default=100)
    ap.add_argument("--submissions", type=int, default=100)
    ap.add_argument("--mode", choices=["batch", "frames"], default="batch")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--readers-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.readers_child:
        # The readers stand for browsers on other machines: niced, so that on a
        # small machine their CPU is not taken from the server's processes.
        os.nice(10)
        asyncio.run(_readers(args.readers_child, args.readers, args.mode == "batch"))
        return
    if args.quick:
        args.stalled, args.readers, args.submissions = 50, 20, 40
    with Serve() as serve:
        url = serve.url
        print(f"tiffany serve at {url} (api pid {serve.api_pid})")
        submit(url, 10)  # warm-up
        busy0 = machine_busy_s()
        cpu0, t0 = serve.cpu(), time.monotonic()
        none = submit(url, args.submissions)
        cpu1, t1 = serve.cpu(), time.monotonic()
        rss0 = rss_mb(serve.api_pid)

        readers = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--readers-child",
                url,
                "--readers",
                str(args.readers),
                "--mode",
                args.mode,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert readers.stdout is not None
        assert readers.stdin is not None
        if readers.stdout.readline().strip() != "ready":
            raise RuntimeError("the readers did not connect")
        t_open = time.monotonic()
        stalled = [StalledSubscriber(url) for _ in range(args.stalled)]
        cpu2 = serve.cpu()
        loaded = submit(url, args.submissions)
        t_done = time.monotonic()
        cpu3 = serve.cpu()
        rss1 = rss_mb(serve.api_pid)
        # how the stalled ones ended: the API's log says when each was cut off
        cut: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            cut += serve.log_records("websocket cut off", "websocket closed", REFUSED)
            if sum(r.get("event") == "websocket closed" for r in cut) >= args.stalled:
                break
            time.sleep(0.5)
        t_cut = time.monotonic() - t_open
        refused = [r for r in cut if r.get("event") == REFUSED]
        closed = [r for r in cut if r.get("event") == "websocket closed"]
        cut = [r for r in cut if r.get("event") == "websocket cut off"]
        drained = sum("drain" in str(r.get("reason")) for r in cut)
        readers.stdin.write("\n")
        readers.stdin.flush()
        stats = json.loads(readers.stdout.readline())
        readers.wait(30)
        rss2 = rss_mb(serve.api_pid)
        busy = machine_busy_s() - busy0
        for sub in stalled:
            sub.sock.close()

    p50a, p99a, maxa = figures(none)
    p50b, p99b, maxb = figures(loaded)
    print()
    print(f"submissions: {args.submissions} a phase, one after the other")
    print(f"{'phase':<34}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    print(f"{'none':<34}{p50a * 1e3:9.1f}{p99a * 1e3:9.1f}{maxa * 1e3:9.1f}")
    what = f"{args.stalled} stalled + {args.readers} reading ({args.mode})"
    print(f"{what:<34}{p50b * 1e3:9.1f}{p99b * 1e3:9.1f}{maxb * 1e3:9.1f}")
    ratio = p99b / p99a
    verdict = "ok" if ratio <= TARGET_RATIO else "OVER TARGET"
    print(
        f"p99 ratio loaded/none: {ratio:.2f} (target <= {TARGET_RATIO:g}: {verdict});"
        f" p50 ratio {p50b / p50a:.2f}"
    )
    print(f"loaded phase took {t_done - t_open:.1f} s from the stalled sockets' opening")
    tenth = max(1, len(loaded) // 10)
    parts = [loaded[i : i + tenth] for i in range(0, len(loaded), tenth)]
    print(
        "loaded p50 by tenth of the phase (ms): "
        + " ".join(f"{percentile(sorted(p), 0.5) * 1e3:.0f}" for p in parts)
    )
    print(
        f"stalled: {drained}/{args.stalled} cut off by the send deadline;"
        f" {len(closed)} websockets closed by the API {t_cut:.1f} s after the stalled opened"
        f" (the others by uvicorn's 20 s ping timeout); {len(cut)} cut off in all"
    )
    print(
        f"readers: {stats['events']} events, {stats['gaps']} gaps, {stats['cutoffs']} cutoffs"
        f" (resumed with since), {stats['refused']} refused; API refusals logged: {len(refused)}"
    )
    print(f"API RSS: {rss0:.0f} MB before, {rss1:.0f} MB loaded, {rss2:.0f} MB after")

    def share(a: tuple[float, float], b: tuple[float, float], secs: float) -> str:
        return f"engine {(b[0] - a[0]) / secs:.0%}, API {(b[1] - a[1]) / secs:.0%} of a core"

    n = args.submissions
    print(
        "API CPU per submission (what the fan-out costs it, less noisy than latency on a busy"
        f" machine): none {(cpu1[1] - cpu0[1]) / n * 1e3:.1f} ms,"
        f" loaded {(cpu3[1] - cpu2[1]) / n * 1e3:.1f} ms"
    )
    print(f"cpu during none: {share(cpu0, cpu1, t1 - t0)}")
    print(f"cpu during loaded: {share(cpu2, cpu3, t_done - t_open)}")
    print(f"machine busy (all processes): {busy:.1f} CPU-s; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
