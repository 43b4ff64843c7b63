"""Total plan steps/s with 1 and 2 engines (``tiffany serve --engines N``), same run.

    python bench/engines.py [--runs 400] [--steps 25] [--repeat 2] [--no-postgres]

For each journal (the file WAL, and PostgreSQL when reachable at
``TIFFANY_BENCH_PG``, default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``,
in a schema of its own) and each engine count: a fresh data dir, ``tiffany
serve --engines N`` (fsync ``batch``), then ``--runs`` plans of ``--steps``
independent ``sleep 0`` steps submitted through ``POST /api/runs`` by 8
client threads (the API spreads them round robin over the engines), and
the time from the first submission to the moment the store shows every run
succeeded (``GET /api/runs`` counts). Printed: total plan steps/s until
the engines finished every run (their status: no run active) and until the
store shows them, 2 engines / 1 engine in the same run (issue 11's target:
at least 1.7x), and the CPU seconds the engines, their projector processes
and the API spent in the round. The best of ``--repeat`` rounds of each
configuration, interleaved. The client (this script, 8 threads of HTTP)
runs on the same 2 cores.

Everything runs on this machine: with 2 cores, two engines share them with
the API process and the engines' projector processes (one each).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from durable_steps import _pg_schema  # noqa: E402

from tiffany.wire.shards import homes  # noqa: E402

PG_URL = os.environ.get("TIFFANY_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CLIENTS = 8


def _plan(steps: int) -> dict[str, Any]:
    return {
        "name": "fan",
        "steps": [{"id": f"s{i}", "tool": "sleep", "args": {"seconds": 0}} for i in range(steps)],
    }


def _http(url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its waited-for children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (an engine's projector process)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


@dataclass
class Served:
    """A running ``serve``: its URL and its processes by role."""

    url: str
    roles: dict[str, list[int]]
    homes: list[Path]

    def cpu(self) -> dict[str, float]:
        """CPU seconds by role so far (engines, projectors, API, and this client)."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        out: dict[str, float] = {"client": me.ru_utime + me.ru_stime}
        # Looked up at each call: an engine may start its projector after /readyz
        # answers (the PostgreSQL journal's did: its CPU read 0.0).
        self.roles["projectors"] = [p for e in self.roles["engines"] for p in _children(e)]
        for role, pids in self.roles.items():
            total = 0.0
            for pid in pids:
                with contextlib.suppress(OSError):
                    total += _cpu(pid)
            out[role] = total
        return out


@contextlib.contextmanager
def _serve(engines: int, env: dict[str, str]) -> Iterator[Served]:
    with tempfile.TemporaryDirectory(prefix="tiffany-bench-engines-") as tmp:
        data = Path(tmp) / "data"
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data)),
                *("--port", "0", "--engines", str(engines)),
            ],
            stdout=(Path(tmp) / "serve.log").open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            ready = data / "serve.json"
            deadline = time.monotonic() + 120
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((Path(tmp) / "serve.log").read_text()[-2000:])
                time.sleep(0.05)
            info = json.loads(ready.read_text())
            url = str(info["url"])
            while True:
                try:
                    if _http(url + "readyz").get("ready"):
                        break
                except OSError:
                    pass
                time.sleep(0.1)
            engine_pids = [int(p) for p in info["engine_pids"]]
            projectors = [p for e in engine_pids for p in _children(e)]
            yield Served(
                url,
                {"engines": engine_pids, "projectors": projectors, "api": [int(info["api_pid"])]},
                homes(data, engines),
            )
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _engines_idle(homes: list[Path]) -> bool:
    """True when no engine has a run active (every run finished in its journal)."""
    from tiffany.wire.control import call

    return all(call(home, "status")["runs_active"] == 0 for home in homes)


def _measure(url: str, runs: int, steps: int, homes: list[Path]) -> tuple[float, float]:
    """Submit ``runs`` plans; return the seconds until the engines finished them, and
    until the store shows them all succeeded."""
    plan = {"plan": _plan(steps)}
    before = _http(f"{url}api/runs?limit=1")["counts"]
    already = before.get("succeeded", 0) + before.get("failed", 0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda _: _http(url + "api/runs", plan), range(runs)))
    # The newest seq of each engine: the list answers once the store holds them.
    newest: dict[int, int] = {}
    for a in answers:
        seq = int(a["seq"])
        engine = (seq - 1) >> 40
        newest[engine] = max(newest.get(engine, 0), seq)
    while not _engines_idle(homes):
        time.sleep(0.01)
    engines_s = time.perf_counter() - t0
    while True:
        q = "&".join(f"min_seq={s}" for s in newest.values())
        try:
            counts = _http(f"{url}api/runs?limit=1&{q}")["counts"]
        except urllib.error.HTTPError as exc:
            if exc.code != 503:  # 503 store.behind: the bounded wait ended first
                raise
            continue
        done = counts.get("succeeded", 0) + counts.get("failed", 0)
        if done >= already + runs:
            if counts.get("failed"):
                raise SystemExit(f"{counts['failed']} runs failed")
            return engines_s, time.perf_counter() - t0
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()

    base = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    base |= {"TIFFANY_LOG_LEVEL": "WARNING", "TIFFANY_LOG_FORMAT": "json"}
    journals: list[tuple[str, dict[str, str] | None]] = [("file WAL", {})]
    if not args.no_postgres:
        journals.append(("PostgreSQL", None))
    total = args.runs * args.steps
    print(
        f"{args.runs} runs x {args.steps} independent steps = {total:,} steps a round; "
        f"{os.cpu_count()} CPUs; best of {args.repeat}"
    )
    print(
        f"{'journal':<11} {'engines':>7} | {'engines done s':>14} {'steps/s':>8} {'x 1':>6} | "
        f"{'store done s':>12} {'steps/s':>8} {'x 1':>6} | CPU s: engines, projectors, API, client"
    )
    for name, extra in journals:
        best: dict[int, tuple[float, float, dict[str, float]]] = {}
        for _ in range(args.repeat):
            for engines in (1, 2):
                with contextlib.ExitStack() as stack:
                    env = dict(base)
                    if extra is None:
                        url = stack.enter_context(_pg_schema(PG_URL))
                        env |= {"TIFFANY_DATABASE_URL": url, "TIFFANY_JOURNAL": "postgres"}
                    served = stack.enter_context(_serve(engines, env))
                    # Warm up: imports, the first plan's validation, connections.
                    _measure(served.url, max(8, args.runs // 20), args.steps, served.homes)
                    cpu0 = served.cpu()
                    done, stored = _measure(served.url, args.runs, args.steps, served.homes)
                    cpu = {k: v - cpu0[k] for k, v in served.cpu().items()}
                if engines not in best or done < best[engines][0]:
                    best[engines] = (done, stored, cpu)
        for engines in (1, 2):
            done, stored, cpu = best[engines]
            print(
                f"{name:<11} {engines:>7} | {done:>14.2f} {total / done:>8,.0f} "
                f"{best[1][0] / done:>5.2f}x | {stored:>12.2f} {total / stored:>8,.0f} "
                f"{best[1][1] / stored:>5.2f}x | {cpu['engines']:.1f}, {cpu['projectors']:.1f}, "
                f"{cpu['api']:.1f}, {cpu['client']:.1f}"
            )


if __name__ == "__main__":
    main()
