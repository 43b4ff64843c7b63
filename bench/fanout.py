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
   event, in a child process of their own, SCHED_IDLE (they stand for browsers
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


def api_durations_s(log_path: Path) -> list[float]:
    """The ``duration_ms`` of every ``POST /api/runs`` in serve's log, in order, in seconds."""
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        if '"request"' not in line or "/api/runs" not in line:
            continue
        try:
            doc = json.loads(line[line.index("{") :])
        except ValueError:
            continue
        if doc.get("method") == "POST" and doc.get("path") == "/api/runs":
            out.append(float(doc["duration_ms"]) / 1e3)
    return out


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (nan when gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
                    stats["messages"] += 1
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


def _drainers(url: str, n: int, batch: bool) -> None:
    """``--drain``: readers that take the bytes and parse nothing (the server's cost alone)."""
    import selectors
    import socket

    query = "?batch=true" if batch else ""
    socks = []
    for _ in range(n):
        sub = StalledSubscriber(url, query)
        sub.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sub.sock.setblocking(False)
        socks.append(sub.sock)
    sel = selectors.DefaultSelector()
    for sock in socks:
        sel.register(sock, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)
    print("ready", flush=True)
    received = 0
    buf = bytearray(1 << 16)
    done = None
    while done is None or time.monotonic() < done:
        for key, _ in sel.select(0.1):
            if key.fileobj is sys.stdin:
                sys.stdin.readline()
                sel.unregister(sys.stdin)
                done = time.monotonic() + 1.0
                continue
            try:
                got = key.fileobj.recv_into(buf)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            if not got:
                sel.unregister(key.fileobj)
            received += got
    stats = {"connected": n, "events": -1, "messages": -1, "gaps": 0, "cutoffs": 0, "refused": 0}
    stats["bytes"] = received
    print(json.dumps(stats), flush=True)


async def _readers(url: str, n: int, batch: bool) -> None:
    stats = {"connected": 0, "events": 0, "messages": 0, "gaps": 0, "cutoffs": 0, "refused": 0}
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
    ap.add_argument(
        "--drain",
        action="store_true",
        help="readers take the bytes and parse nothing: what the server pays, without"
        " the readers' own CPU on the same cores",
    )
    ap.add_argument("--readers-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.readers_child:
        # The readers stand for browsers on other machines: on this machine they
        # take only CPU nobody else wants (SCHED_IDLE: any server process that
        # wakes preempts them at once; nice 10 still let them delay the API
        # and the engine by a scheduler slice at a time on 2 cores).
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            os.nice(19)
        if args.drain:
            _drainers(args.readers_child, args.readers, args.mode == "batch")
        else:
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
                *(["--drain"] if args.drain else []),
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
        readers_cpu0 = proc_cpu_s(readers.pid)
        loaded = submit(url, args.submissions)
        readers_cpu1 = proc_cpu_s(readers.pid)
        t_done = time.monotonic()
        cpu3 = serve.cpu()
        inside = api_durations_s(serve.log_path)
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
    n = args.submissions
    if len(inside) >= 2 * n:
        api_none, api_loaded = sorted(inside[-2 * n : -n]), sorted(inside[-n:])
        print(
            "inside the API (its request log, from the request to the response):"
            f" none p50 {percentile(api_none, 0.5) * 1e3:.1f} / p99"
            f" {percentile(api_none, 0.99) * 1e3:.1f} ms, loaded p50"
            f" {percentile(api_loaded, 0.5) * 1e3:.1f} / p99"
            f" {percentile(api_loaded, 0.99) * 1e3:.1f} ms"
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
        f"readers: {stats['events']} events in {stats.get('messages', 0)} messages,"
        f" {stats['gaps']} gaps, {stats['cutoffs']} cutoffs"
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
    print(
        f"readers' CPU per submission (their process, SCHED_IDLE): "
        f"{(readers_cpu1 - readers_cpu0) / n * 1e3:.1f} ms"
    )
    print(f"cpu during none: {share(cpu0, cpu1, t1 - t0)}")
    print(f"cpu during loaded: {share(cpu2, cpu3, t_done - t_open)}")
    print(f"machine busy (all processes): {busy:.1f} CPU-s; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
