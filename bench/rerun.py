"""Re-run from failure: a 1,000-step plan re-run from its last step vs the original run.

    python bench/rerun.py                 # 1,000 steps, a warm-up and 5 rounds (~40 s)
    python bench/rerun.py --steps 200 --rounds 1 --quick

Starts ``tiffany serve`` on a temporary data dir (127.0.0.1, port 0, WAL
fsync ``batch``; bench/api.py's ``Serve``). Each round submits a plan of
``--steps`` steps in a chain (each ``file.write`` appends its index to a file
of the workspace, after the previous one) and waits until it finished, then
``POST /api/runs/{id}/rerun {"from_step": <last>}`` and waits until the
re-run finished. The re-run reuses the recorded outputs of every step but
the last (no worker, no tool call: the planner settles them from its
RUN_START), copies the workspace in one durable step, and runs the last
step. Time is from the POST to the run shown finished in the store
(``GET /api/runs?limit=1`` every 5 ms: the list's newest run, not the
1,000-step detail, so the polling costs the API little); CPU is the engine's,
the API's and the projector's over the same span. Target: the re-run under
5% of the original run's time. A first round (an original and its re-run)
warms the server up and is not counted: the first run a new server takes
is up to twice as slow as the next ones (imports, caches, the store's pages).

The script stops by itself, talks only to 127.0.0.1, and stops ``serve`` and
removes its temporary dir on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api import Serve, header
from websockets.sync.client import connect as ws_connect

from tiffany.sdk.models import FeedGap
from tiffany.sdk.protocol import FEED_TAIL, Cutoff, feed_url, read_frame

FINISHED = ("succeeded", "failed", "cancelled")
POLL_S = 0.005
#: Times the server cut the bench's feed off as a slow subscriber (printed).
CUTOFFS = [0]


def chain(n: int) -> dict[str, Any]:
    """A plan of ``n`` steps in a chain, each appending a line to ``count.txt``."""
    steps = []
    for i in range(n):
        args = {"path": "count.txt", "content": f"{i}\n", "mode": "a"}
        step: dict[str, Any] = {"id": f"s{i}", "tool": "file.write", "args": args}
        if i:
            step["after"] = [f"s{i - 1}"]
        steps.append(step)
    return {"name": f"chain-{n}", "steps": steps}


def _wait(client: httpx.Client, run_id: str, timeout: float = 600.0) -> str:
    """Poll the runs list every ``POLL_S`` until its newest run is ``run_id``, finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = client.get("api/runs", params={"limit": 1}).json()["runs"]
        if runs and runs[0]["run_id"] == run_id and runs[0]["status"] in FINISHED:
            return str(runs[0]["status"])
        time.sleep(POLL_S)
    raise TimeoutError(f"run {run_id} did not finish in {timeout} s")


def _wait_feed(
    client: httpx.Client, run_id: str, timeout: float = 600.0, ended: list[float] | None = None
) -> str:
    """Follow the run's feed to its ``run.finished``, then read the list at that seq.

    ``GET /api/runs?limit=1&min_seq=S`` answers once the store has passed S
    (the server waits on the projector; nobody polls), so the time is still
    until the store shows the run finished.
    """
    url = feed_url(str(client.base_url), run_id, None, tail=FEED_TAIL)
    deadline = time.monotonic() + timeout
    seq = None
    while seq is None:
        try:
            seq = _finished_seq(url, run_id, deadline, ended)
        except Cutoff:
            # Too slow for the server (both cores busy): follow again from the
            # run's tail, which holds run.finished if it came meanwhile.
            CUTOFFS[0] += 1
    runs = client.get("api/runs", params={"limit": 1, "min_seq": seq}).json()["runs"]
    if not runs or runs[0]["run_id"] != run_id or runs[0]["status"] not in FINISHED:
        raise RuntimeError(f"the store at seq {seq} does not show run {run_id} finished: {runs}")
    return str(runs[0]["status"])


def _finished_seq(url: str, run_id: str, deadline: float, ended: list[float] | None) -> int:
    """Read the feed at ``url`` until the run's ``run.finished``; return its WAL seq."""
    with ws_connect(url, max_size=None, compression=None) as feed:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"run {run_id} did not finish in time")
            frame = feed.recv(timeout=left)
            if "run.finished" not in frame and '"type"' not in frame:
                continue  # only the end (and control frames) decoded: keep up with the feed
            item = read_frame(frame)
            if isinstance(item, FeedGap):
                raise RuntimeError(f"the feed lost events of run {run_id}")
            if item is not None and item.kind == "run.finished" and item.run_id == run_id:
                if ended is not None:
                    ended.append(time.perf_counter())
                return int(item.wal_seq)


def _timed(serve: Serve, client: httpx.Client, post: Any, poll: bool = False) -> dict[str, Any]:
    cpu0 = serve.cpu3()
    t0 = time.perf_counter()
    r = post()
    if r.status_code != 201:
        raise RuntimeError(f"{r.status_code} {r.text}")
    run_id = r.json()["run_id"]
    ended: list[float] = []
    status = _wait(client, run_id) if poll else _wait_feed(client, run_id, ended=ended)
    wall = time.perf_counter() - t0
    cpu = [b - a for a, b in zip(cpu0, serve.cpu3(), strict=True)]
    engine = ended[0] - t0 if ended else None  # the feed's run.finished: the engine is done
    return {"run_id": run_id, "status": status, "wall": wall, "engine": engine, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first, not counted")
    parser.add_argument(
        "--poll", action="store_true", help=f"poll the runs list every {POLL_S * 1000:g} ms instead"
    )
    parser.add_argument("--quick", action="store_true", help="200 steps, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds, args.warmup = 200, 1, 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    header("bench/rerun.py", args.quick)
    plan = chain(args.steps)
    last = f"s{args.steps - 1}"
    originals: list[dict[str, Any]] = []
    reruns: list[dict[str, Any]] = []
    with Serve() as serve, httpx.Client(base_url=serve.url, timeout=60) as client:
        print(f"tiffany serve: {serve.url} (data dir {serve.data_dir}; fsync batch)", flush=True)
        for i in range(args.warmup + args.rounds):
            first = _timed(
                serve, client, lambda: client.post("api/runs", json={"plan": plan}), args.poll
            )
            rerun = _timed(
                serve,
                client,
                lambda first=first: client.post(
                    f"api/runs/{first['run_id']}/rerun", json={"from_step": last}
                ),
                args.poll,
            )
            detail = client.get(f"api/runs/{rerun['run_id']}").json()
            reused = sum(
                1 for s in detail["steps"] if s["attempts"][:1] and "reused" in s["attempts"][0]
            )
            lines = (serve.data_dir / "workspaces" / rerun["run_id"] / "count.txt").read_text()
            if reused != args.steps - 1 or lines.split().count(str(args.steps - 1)) != 2:
                raise RuntimeError(f"the re-run reused {reused} steps; count.txt: {lines[-40:]!r}")
            if i >= args.warmup:
                originals.append(first)
                reruns.append(rerun)
    print(
        f"\n{args.steps}-step chain (file.write appends), {args.rounds} round(s) after "
        f"{args.warmup} warm-up; "
        "s = wall from the POST to the run finished in the store (ended: to the feed's "
        "run.finished); CPU s: engine / API / projector"
    )
    print(f"{'run':<24}{'status':>10}{'ended s':>10}{'wall s':>10}{'CPU s (eng/api/proj)':>26}")
    for name, cell in (("original", originals), ("re-run from the last", reruns)):
        for c in cell:
            cpu = " / ".join(f"{v:.2f}" for v in c["cpu"])
            ended = f"{c['engine']:.3f}" if c["engine"] is not None else "-"
            print(f"{name:<24}{c['status']:>10}{ended:>10}{c['wall']:>10.3f}{cpu:>26}")
    o = statistics.median(c["wall"] for c in originals)
    r = statistics.median(c["wall"] for c in reruns)
    o_cpu = statistics.median(sum(c["cpu"]) for c in originals)
    r_cpu = statistics.median(sum(c["cpu"]) for c in reruns)
    print(
        f"\nmedian: original {o:.3f} s, re-run {r:.3f} s -> re-run / original {r / o:.1%} "
        f"of the wall time to the store, {r_cpu / o_cpu:.1%} of the CPU (target: under 5%: "
        f"{'met' if r / o < 0.05 else 'MISSED'})"
    )
    if not args.poll:
        o_end = statistics.median(c["engine"] for c in originals)
        r_end = statistics.median(c["engine"] for c in reruns)
        print(
            f"to the feed's run.finished: original {o_end:.3f} s, re-run {r_end:.3f} s -> "
            f"{r_end / o_end:.1%}"
        )
        if CUTOFFS[0]:
            print(
                f"the feed cut this script off {CUTOFFS[0]} time(s) as a slow subscriber; it "
                "followed the run's tail again (such a round's times include the reconnect)"
            )


if __name__ == "__main__":
    main()
