"""Soak: mixed plans on ``tiffany serve`` for minutes, random kill -9 of the group, subscribers.

    python bench/soak.py                     # 10 minutes
    python bench/soak.py --minutes 2 --crash-every 15

Not a test (nothing asserts; it prints). One data dir; a ``tiffany serve``
(127.0.0.1, port 0) runs the fault suite's mixed plans (fan-out, chain,
retry with a flaky step, sleeps; ``tests/fault/fault_support.py``), kept at
``--in-flight`` unfinished runs. At random moments (exponential, mean
``--crash-every`` s) the whole serve process group gets SIGKILL and is
started again; the WAL is read cold at each crash (acknowledged runs present?
which steps' results are durable?). Websocket subscribers to
``/ws/activity`` come and go (each lives 2-15 s): most read, some are
stalled (``max_queue=1`` and never read, so the server's sends back up).

Printed at the end: runs submitted / acknowledged / completed, crashes
survived, the RSS of the engine, API and projector processes sampled every
``--sample`` s, and lost or duplicated effects (both must be 0): lost = an
acknowledged run missing from the WAL, unfinished or not succeeded, or an
effect step that never ran; duplicated = a step whose result was durable at
a crash that ran again after it (a step in flight at a crash may run once
more; those re-runs are counted apart).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random  # noqa: TID251 - the harness picks plans and kill points, not task code
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

# fault_support, and the process_support it imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fault"))

from fault_support import (
    PLAN_KINDS,
    TERMINAL,
    Served,
    check_effects,
    durable_steps,
    effect_steps,
    mixed_plan,
    read_effects,
    rerun_count,
    rss_kb,
    tools_env,
    wal_runs,
)


class Soak:
    def __init__(self, args: argparse.Namespace, base: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.base = base
        self.data = base / "data"
        self.eff = base / "effects"
        self.eff.mkdir(parents=True)
        self.env = tools_env(base)
        self.served: Served | None = None
        self.plans: dict[str, dict[str, Any]] = {}
        self.tag_run: dict[str, str] = {}
        self.finished: dict[str, str] = {}  # run id -> status
        self.crashes: list[tuple[int, dict[str, set[str]]]] = []
        self.lost_at_crash: list[str] = []
        self.rss: list[tuple[float, dict[str, int]]] = []
        self.ws = {"opened": 0, "stalled": 0, "frames": 0, "errors": 0}
        self.up = asyncio.Event()
        self.started = time.monotonic()

    def start(self) -> None:
        self.served = Served(self.data, self.env, log_path=self.base / "serve.log")
        self.up.set()

    def crash(self) -> None:
        assert self.served is not None
        self.up.clear()
        self.served.kill9()
        self.crashes.append((len(read_effects(self.eff)), durable_steps(self.data / "wal")))
        in_wal = wal_runs(self.data / "wal")
        self.lost_at_crash += [r for r in self.tag_run.values() if r not in in_wal]
        self.start()

    async def submitter(self, stop: float) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while time.monotonic() < stop:
                await self.up.wait()
                assert self.served is not None
                url = self.served.url
                pending = [r for r in self.tag_run.values() if r not in self.finished]
                if len(pending) >= self.args.in_flight:
                    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                        page = (await client.get(url + "/api/runs", params={"limit": 500})).json()
                        for run in page["runs"]:
                            if run["status"] in TERMINAL:
                                self.finished[run["run_id"]] = run["status"]
                    await asyncio.sleep(0.2)
                    continue
                tag = f"t{len(self.plans)}"
                self.plans[tag] = mixed_plan(self.rng.choice(PLAN_KINDS), self.rng, self.eff)
                body = {"plan": self.plans[tag], "inputs": {"tag": tag}}
                with contextlib.suppress(httpx.HTTPError):
                    r = await client.post(url + "/api/runs", json=body)
                    if r.status_code == 201:
                        self.tag_run[tag] = r.json()["run_id"]

    async def subscriber(self, stop: float) -> None:
        import websockets

        while time.monotonic() < stop:
            await self.up.wait()
            assert self.served is not None
            url = self.served.url.replace("http://", "ws://") + "/ws/activity"
            stalled = self.rng.random() < 0.3
            life = self.rng.uniform(2, 15)
            try:
                async with websockets.connect(url, max_queue=1, open_timeout=10) as ws:
                    self.ws["opened"] += 1
                    self.ws["stalled"] += stalled
                    end = time.monotonic() + life
                    if stalled:
                        await asyncio.sleep(life)
                    while not stalled and time.monotonic() < end:
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(ws.recv(), max(0.01, end - time.monotonic()))
                            self.ws["frames"] += 1
            except Exception:  # the server was killed under it, or refused it
                self.ws["errors"] += 1
                await asyncio.sleep(0.5)

    async def crasher(self, stop: float) -> None:
        while True:
            wait = self.rng.expovariate(1 / self.args.crash_every)
            if time.monotonic() + wait >= stop:
                return
            await asyncio.sleep(wait)
            await asyncio.to_thread(self.crash)

    async def sampler(self, stop: float) -> None:
        while time.monotonic() < stop:
            if self.served is not None:
                roles = self.served.roles()
                self.rss.append(
                    (time.monotonic() - self.started, {k: rss_kb(p) for k, p in roles.items()})
                )
            await asyncio.sleep(self.args.sample)

    async def run(self) -> None:
        await asyncio.to_thread(self.start)
        stop = time.monotonic() + self.args.minutes * 60
        await asyncio.gather(
            self.submitter(stop),
            self.crasher(stop),
            self.sampler(stop),
            *(self.subscriber(stop) for _ in range(self.args.subscribers)),
        )

    def finish(self) -> dict[str, Any]:
        """Wait (up to 5 min) for every acknowledged run; stop serve; count."""
        assert self.served is not None
        self.served.wait_ready()
        deadline = time.monotonic() + 300
        with httpx.Client(timeout=30) as client:
            for run_id in self.tag_run.values():
                while run_id not in self.finished and time.monotonic() < deadline:
                    r = client.get(self.served.url + f"/api/runs/{run_id}")
                    if r.status_code == 200 and r.json()["status"] in TERMINAL:
                        self.finished[run_id] = r.json()["status"]
                    else:
                        time.sleep(0.2)
        code = self.served.stop()
        effects = read_effects(self.eff)
        expected = {tag: effect_steps(self.plans[tag]) for tag in self.tag_run}
        problems = check_effects(effects, self.crashes, self.tag_run, expected)
        not_ok = [r for r in self.tag_run.values() if self.finished.get(r) != "succeeded"]
        lost = sorted(set(self.lost_at_crash)) + [p for p in problems if "never ran" in p]
        dup = [p for p in problems if "never ran" not in p]
        return {
            "minutes": self.args.minutes,
            "runs_submitted": len(self.plans),
            "runs_acknowledged": len(self.tag_run),
            "runs_completed": sum(1 for s in self.finished.values() if s == "succeeded"),
            "runs_not_succeeded": not_ok[:20],
            "crashes_survived": len(self.crashes),
            "serve_exit_code": code,
            "websockets": self.ws,
            "effects": len(effects),
            "reruns_of_in_flight_steps": rerun_count([e for e in effects if e[0] in self.tag_run]),
            "lost_effects": len(lost),
            "duplicated_effects": len(dup),
            "problems": (lost + dup)[:20],
        }


def _table(rss: list[tuple[float, dict[str, int]]]) -> str:
    lines = [f"{'t (s)':>7} {'engine MB':>10} {'api MB':>8} {'projector MB':>13}"]
    for t, roles in rss:
        cells = [
            f"{roles[k] / 1024:.0f}" if roles.get(k) else "-"  # "-": restarting after a crash
            for k in ("engine", "api", "projector")
        ]
        lines.append(f"{t:7.0f} {cells[0]:>10} {cells[1]:>8} {cells[2]:>13}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=20)
    parser.add_argument("--crash-every", type=float, default=20.0, help="mean seconds")
    parser.add_argument("--subscribers", type=int, default=8)
    parser.add_argument("--sample", type=float, default=30.0, help="RSS sample period (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tiffany-soak-"))
    soak = Soak(args, base)
    try:
        asyncio.run(soak.run())
        summary = soak.finish()
    finally:
        if soak.served is not None:
            soak.served.close()
    print("RSS over time (engine, API, projector; the processes restart at each crash)")
    print(_table(soak.rss))
    print(json.dumps(summary, indent=2))
    if args.keep:
        print(f"data dir kept: {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if summary["lost_effects"] == 0 and summary["duplicated_effects"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
