"""Hostile 1 MB bodies against ``tiffany serve``: the API's peak RSS and a neighbour's latency.

    python bench/hostile.py                    # 4 hostile clients, 200 normal submissions
    python bench/hostile.py --clients 8 --normal 400

Starts ``tiffany serve`` (engine + API) on a temporary data dir on
127.0.0.1 (``bench/api.py``'s :class:`Serve`), then:

1. quiet: one client submits ``--normal`` small plans one after another and
   records each latency;
2. hostile: ``--clients`` threads send bodies of about 1 MB in a loop
   (nested 500,000 deep as JSON and as YAML, 260,000-value arrays and
   mappings, a nine-level YAML alias bomb, 4,000-digit integers, a 1 MB
   string in a plan the engine refuses), while the same normal client
   submits ``--normal`` plans again.

It prints, per hostile kind, how it was answered and its median answer
time; then the normal submissions' p50/p99 quiet and under attack with
their ratio, and the API process's peak RSS (``VmHWM`` in
``/proc/PID/status``) before and after. Targets (issue #9): API peak RSS
under 200 MB; normal latency under attack within 2x of quiet.
Not in CI: a benchmark prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import httpx  # noqa: E402
from api import Serve  # noqa: E402

NORMAL_PLAN = {
    "plan": {"name": "nap", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}}]},
    "inputs": {},
}
MB = 1_040_000  # a little under the default 1 MiB cap


def _bomb() -> bytes:
    lines = ["a: &a [" + ",".join(["lol"] * 9) + "]"]
    prev = "a"
    for name in "bcdefghi":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return ("\n".join(lines) + "\n").encode()


def hostile_bodies() -> dict[str, tuple[bytes, str]]:
    """Each hostile kind: (body, content type), about 1 MB each."""
    half = MB // 2
    json_t, yaml_t = "application/json", "application/yaml"
    big = "9" * 4_000
    return {
        "deep json": (b"[" * half + b"]" * half, json_t),
        "deep yaml": (b"[" * half + b"]" * half, yaml_t),
        "wide json": (b"[" + b"0," * (half - 1) + b"0]", json_t),
        "wide yaml": (b"- 0\n" * (MB // 4), yaml_t),
        "many keys": (
            json.dumps({f"k{i}": 0 for i in range(MB // 12)}).encode()[:MB] or b"{}",
            json_t,
        ),
        "alias bomb": (_bomb(), yaml_t),
        "big ints": (("[" + ",".join([big] * (MB // 4_001)) + "]").encode(), json_t),
        "long string": (
            json.dumps(
                {
                    "name": "x",
                    "steps": [{"id": "a", "tool": "nope", "args": {"s": "x" * (MB - 200)}}],
                }
            ).encode(),
            json_t,
        ),
    }


def vm_hwm_mb(pid: int | None) -> float:
    """The process's peak resident set (VmHWM), in MB."""
    if pid is None:
        return float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def vm_rss_mb(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def normal_latencies(url: str, n: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            r = client.post("/api/runs", json=NORMAL_PLAN)
            out.append(time.perf_counter() - t0)
            if r.status_code != 201:
                print(f"  normal submission answered {r.status_code}: {r.text[:200]}")
    return out


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4, help="hostile client threads")
    ap.add_argument("--normal", type=int, default=200, help="normal submissions per phase")
    args = ap.parse_args()
    bodies = hostile_bodies()
    with Serve() as serve:
        url = serve.url.rstrip("/")
        normal_latencies(url, 20)  # warm-up
        rss0 = vm_hwm_mb(serve.api_pid)
        quiet = normal_latencies(url, args.normal)
        rss_quiet = vm_hwm_mb(serve.api_pid)

        stop = threading.Event()
        answers: dict[str, Counter[int]] = defaultdict(Counter)
        times: dict[str, list[float]] = defaultdict(list)
        lock = threading.Lock()

        def attack(offset: int) -> None:
            kinds = list(bodies)
            i = offset
            with httpx.Client(base_url=url, timeout=120) as client:
                while not stop.is_set():
                    kind = kinds[i % len(kinds)]
                    i += 1
                    body, ctype = bodies[kind]
                    t0 = time.perf_counter()
                    try:
                        r = client.post("/api/runs", content=body, headers={"content-type": ctype})
                        status = r.status_code
                    except httpx.HTTPError:
                        status = -1
                    with lock:
                        answers[kind][status] += 1
                        times[kind].append(time.perf_counter() - t0)

        threads = [
            threading.Thread(target=attack, args=(k,), daemon=True) for k in range(args.clients)
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the attack is under way
        attacked = normal_latencies(url, args.normal)
        stop.set()
        for t in threads:
            t.join(120)
        rss_hostile = vm_hwm_mb(serve.api_pid)
        rss_now = vm_rss_mb(serve.api_pid)

    print(f"\nhostile bodies ({args.clients} clients), as answered by the API")
    print(f"{'kind':<12} {'bytes':>9} {'answers':<22} {'median ms':>10}")
    for kind, (body, _ctype) in bodies.items():
        counts = ", ".join(f"{s}x{n}" for s, n in sorted(answers[kind].items()))
        med = statistics.median(times[kind]) * 1000 if times[kind] else float("nan")
        print(f"{kind:<12} {len(body):>9} {counts:<22} {med:>10.1f}")
    q50, q99 = pct(quiet, 50), pct(quiet, 99)
    a50, a99 = pct(attacked, 50), pct(attacked, 99)
    print(f"\nnormal submission latency ({args.normal} each)")
    print(f"{'':<14} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'quiet':<14} {q50:>8.1f} {q99:>8.1f}")
    print(f"{'under attack':<14} {a50:>8.1f} {a99:>8.1f}")
    print(f"{'ratio':<14} {a50 / q50:>8.2f} {a99 / q99:>8.2f}   (target: within 2x)")
    print("\nAPI process peak RSS (VmHWM), MB")
    print(f"after warm-up {rss0:.0f}, after quiet {rss_quiet:.0f}, after attack {rss_hostile:.0f}")
    print(f"(RSS now {rss_now:.0f}; target: peak under 200)")


if __name__ == "__main__":
    main()
