"""The soak: minutes of mixed load on ``tiffany serve`` under kill -9, SIGTERM and SIGSTOP.

``bench/soak.py`` runs it for minutes and prints its table;
``tests/fault/test_soak_short.py`` runs it for about a minute and asserts
that every count that must be 0 is.

The load (``soak_load.py``): ``in_flight`` runs of eight kinds kept
unfinished (plans, signals, sub-plans, agent steps calling a mock model on
127.0.0.1), each submitted with an Idempotency-Key (its tag) and retried
until acknowledged; signals sent with Idempotency-Keys, retried until 202;
forged ``child:`` signals; three schedules ticking every 1, 3 and 5 s;
websocket subscribers coming and going (some stalled).

The faults (``soak_nodes.py``), one at a time from one thread: a kill -9
of a random process every ``crash_every`` s (0.5 to 1.5 times it), a
SIGTERM restart every ``sigterm_every`` s, and on the PostgreSQL journal one
SIGSTOP of the driving engine past its lease (``sigstop_at``: the fraction
of the load phase when).

The end: schedules deleted, every acknowledged run awaited, every server
stopped (SIGTERM), the journal read cold (``soak_account.read_journal``),
and every finished run in it replay-verified in ``verify_workers``
processes. :meth:`Soak.run` returns the summary; :func:`table` prints it.
Whatever happens, every process the soak started is gone when
:meth:`Soak.run` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random  # noqa: TID251 - the harness picks plans and kill points, not task code
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fault_support import TERMINAL, rss_kb, tools_env
from soak_account import (
    CAUSES,
    FENCE,
    KILL9,
    SIGTERM,
    JournalView,
    Stop,
    classify,
    read_executions,
    read_journal,
)
from soak_load import BURST, KINDS, SCHEDULES, TICK_PLAN, MockModel, Work, make_work
from soak_nodes import (
    ORPHAN_WAIT_S,
    TARGETS,
    Node,
    driving_pid,
    epochs,
    owner_pid,
    pg_stops,
    wait_gone,
    wal_last_seq,
)

HERE = Path(__file__).resolve().parent
#: A run acknowledged this long ago no longer holds a place among the runs in flight, in s
#: (one that never ends is counted at the end; the load goes on).
STUCK_S = 120.0
#: The longest wait between two tries of a request that failed (server down, 503), in s.
RETRY_MAX_S = 1.0


@dataclass
class SoakConfig:
    """The soak's knobs (``bench/soak.py`` takes each as an option)."""

    minutes: float = 10.0
    journal: str = "file"  # or "postgres": two servers on one stream
    pg_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    in_flight: int = 20
    crash_every: float = 20.0  # s between kill -9s (0: none)
    sigterm_every: float = 60.0  # s between SIGTERM restarts (0: none)
    sigstop_at: float = 0.5  # when the SIGSTOP comes, a fraction of the load (<0: none)
    lease_s: float = 3.0
    subscribers: int = 8
    schedules: bool = True
    sample_s: float = 30.0
    seed: int = 1
    finish_timeout_s: float = 300.0
    verify_workers: int = 2
    targets: tuple[str, ...] = TARGETS


class Soak:
    """One soak in ``base`` (a fresh directory), with ``config``; ``pg_url``: its schema's URL."""

    def __init__(self, config: SoakConfig, base: Path, pg_url: str | None = None) -> None:
        self.cfg = config
        self.base = base
        self.pg_url = pg_url
        self.rng = random.Random(config.seed)
        self.eff = base / "effects"
        self.eff.mkdir(parents=True, exist_ok=True)
        self.mono_offset = time.time() - time.monotonic()  # noqa: TID251 - the database's clock
        self.works: dict[str, Work] = {}
        self.acked: dict[str, str] = {}  # tag -> run id
        self.acked_at: dict[str, float] = {}
        self.finished: dict[str, str] = {}  # run id -> status (as the API showed it)
        self.signal_acks: list[tuple[str, str, str, Any]] = []  # (tag, run id, key, payload)
        self.signals = Counter[str]()
        self.forged = Counter[str]()
        self.faults = Counter[str]()
        self.stops: dict[int, Stop] = {}
        self.sigterm_codes: list[int | None] = []
        self.api_stop_s: list[float] = []  # SIGTERM to serve -> its API gone
        self.schedule_ids: list[str] = []
        self.rss: list[tuple[float, str, dict[str, int]]] = []
        self.ws = Counter[str]()
        self.submitted = 0
        self.unanswered = 0  # submissions retried until the end without an answer
        self.errors: list[str] = []
        self.nodes: list[Node] = []
        self.model: MockModel | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._halt = threading.Event()
        self._seq_hint = 1
        self._t0 = time.monotonic()
        self._deadline = 0.0
        self._t_end = float("inf")
        self.env: dict[str, str] = {}
        self.client: httpx.AsyncClient | None = None
        self.verified = 0
        self.phases: dict[str, float] = {}
        self.progress: list[tuple[float, int, int, int, int]] = []

    # --- the whole run --------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Load, faults, the end, the books; the summary. Every process is gone after."""
        try:
            self.model = MockModel(self.eff)
            extra = {"TIFFANY_LLM_BASE_URL": self.model.url, "TIFFANY_LLM_MODEL": "soak-mock"}
            if self.cfg.journal == "postgres":
                assert self.pg_url is not None
                extra |= {
                    "TIFFANY_JOURNAL": "postgres",
                    "TIFFANY_DATABASE_URL": self.pg_url,
                    "TIFFANY_JOURNAL_LEASE_S": str(self.cfg.lease_s),
                }
            self.env = tools_env(self.base, extra)
            names = ("a", "b") if self.cfg.journal == "postgres" else ("a",)
            self.nodes = [Node(name, self.base, self.env) for name in names]
            for node in self.nodes:
                node.start()
            self.nodes[0].wait_ready()
            load_s = self.cfg.minutes * 60
            self._t0 = time.monotonic()
            self._deadline = self._t0 + load_s + self.cfg.finish_timeout_s
            asyncio.run(self._load(self._t0 + load_s))
            self.phases["load and the runs' end"] = time.monotonic() - self._t0
            t = time.monotonic()
            self._stop_nodes()
            view = read_journal(self._source())
            self.phases["stop and journal read"] = time.monotonic() - t
            t = time.monotonic()
            bad = self._verify(view)
            self.phases["verify"] = time.monotonic() - t
            return self._summary(view, bad)
        finally:
            self._halt.set()
            for node in self.nodes:
                node.close()
            if self.model is not None:
                self.model.close()

    def _source(self) -> Any:
        if self.cfg.journal == "postgres":
            from tiffany.wal.pg import PgStream

            assert self.pg_url is not None
            return PgStream(self.pg_url, "main")
        return self.nodes[0].data / "wal"

    async def _load(self, stop_at: float) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            self.client = client
            if self.cfg.schedules:
                await self._add_schedules()
            faulter = threading.Thread(target=self._faulter, args=(stop_at,), daemon=True)
            faulter.start()
            try:
                await asyncio.gather(
                    self._submitter(stop_at),
                    self._poller(stop_at),
                    self._sampler(stop_at),
                    *(self._subscriber(stop_at) for _ in range(self.cfg.subscribers)),
                )
            finally:
                self._halt.set()
                await asyncio.to_thread(faulter.join)
            await asyncio.to_thread(self._all_up)
            for sid in self.schedule_ids:
                await self._request("DELETE", f"/api/schedules/{sid}", ok=(204, 404))
            while self._tasks:  # signals still to send, submissions still retried
                await asyncio.gather(*list(self._tasks))
            await self._await_runs()

    # --- load -----------------------------------------------------------------------

    def _url(self) -> str | None:
        up = [n for n in self.nodes if n.up]
        return self.rng.choice(up).url if up else None

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        key: str | None = None,
        ok: tuple[int, ...] = (200, 201, 202),
    ) -> tuple[int, Any]:
        """Send until an answer that is not an outage (``ok``, or a 4xx other than 429).

        Connection errors, 429 and 5xx are retried until the soak's end;
        then ``(0, what the last try got)``.
        """
        headers = {"Idempotency-Key": key} if key else {}
        delay = 0.1
        last: Any = None
        while time.monotonic() < self._deadline:
            url = self._url()
            if url is not None:
                try:
                    assert self.client is not None
                    r = await self.client.request(method, url + path, json=body, headers=headers)
                    if r.status_code in ok or (400 <= r.status_code < 500 and r.status_code != 429):
                        return r.status_code, (r.json() if r.content else None)
                    last = f"{r.status_code} {r.text[:300]}"
                except (httpx.HTTPError, ValueError) as exc:
                    last = f"{type(exc).__name__}: {exc}"[:300]
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
        return 0, last

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _in_flight(self) -> int:
        now = time.monotonic()
        unacked = self.submitted - len(self.acked)
        return unacked + sum(
            1
            for tag, run in self.acked.items()
            if run not in self.finished and now - self.acked_at[tag] < STUCK_S
        )

    async def _submitter(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            if self._in_flight() >= self.cfg.in_flight:
                await asyncio.sleep(0.1)
                continue
            tag = f"t{len(self.works)}"
            work = make_work(self.rng.choice(KINDS), tag, self.rng, self.eff)
            self.works[tag] = work
            self.submitted += 1
            self._spawn(self._submit(work))
            await asyncio.sleep(0)

    async def _submit(self, work: Work) -> None:
        body = {"plan": work.plan, "inputs": {"tag": work.tag}}
        status, answer = await self._request("POST", "/api/runs", body, key=work.tag)
        if status not in (200, 201):
            self.submitted -= 1  # refused (or the soak ended): not in flight
            self.unanswered += status == 0
            self.errors.append(f"submit {work.tag}: {status} {answer}")
            return
        run_id = str(answer["run_id"])
        self.acked[work.tag] = run_id
        self.acked_at[work.tag] = time.monotonic()
        if work.signals:
            self._spawn(self._send_signals(work, run_id))
        if work.forge and work.child_step:
            self._spawn(self._forge(run_id, f"{run_id}.{work.child_step}.1"))

    async def _signal(self, work: Work, run_id: str, key: str, payload: Any) -> None:
        status, answer = await self._request(
            "POST", f"/api/runs/{run_id}/signals/go", payload, key=key
        )
        self.signals["sent"] += 1
        if status == 202:
            self.signal_acks.append((work.tag, run_id, key, payload))
        else:
            self.signals[f"answered {status}"] += 1
            self.errors.append(f"signal {run_id} {key}: {status} {answer}")

    async def _send_signals(self, work: Work, run_id: str) -> None:
        (k1, p1), (k2, p2) = work.signals
        await self._signal(work, run_id, k1, p1)  # early: the wait has not begun
        await self._signal(work, run_id, k1, p1)  # again, same key: journaled once
        await asyncio.sleep(self.rng.uniform(0.3, 3.0))
        await self._signal(work, run_id, k2, p2)

    async def _forge(self, run_id: str, child: str) -> None:
        payload = {"run_id": child, "status": "succeeded", "outputs": {"end": -1}, "error": None}
        status, _ = await self._request(
            "POST", f"/api/runs/{run_id}/signals/child:{child}", payload
        )
        self.forged["accepted" if status == 202 else f"refused {status}"] += 1

    async def _poller(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            url = self._url()
            if url is not None:
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    assert self.client is not None
                    r = await self.client.get(url + "/api/runs", params={"limit": 200})
                    for run in r.json()["runs"]:
                        if run["status"] in TERMINAL:
                            self.finished[run["run_id"]] = run["status"]
            await asyncio.sleep(0.5)

    async def _await_runs(self) -> None:
        """Until every acknowledged run finished (or the soak's deadline)."""
        for run_id in list(self.acked.values()):
            while run_id not in self.finished and time.monotonic() < self._deadline:
                status, answer = await self._request("GET", f"/api/runs/{run_id}")
                if status == 200 and answer["status"] in TERMINAL:
                    self.finished[run_id] = answer["status"]
                else:
                    await asyncio.sleep(0.5)

    async def _add_schedules(self) -> None:
        for cron, catchup in SCHEDULES:
            body = {"plan": TICK_PLAN, "cron": cron, "catchup": catchup}
            status, answer = await self._request("POST", "/api/schedules", body)
            if status == 201:
                self.schedule_ids.append(answer["schedule_id"])
            else:
                self.errors.append(f"schedule {cron}: {status} {answer}")

    async def _subscriber(self, stop_at: float) -> None:
        import websockets

        while time.monotonic() < stop_at:
            url = self._url()
            if url is None:
                await asyncio.sleep(0.5)
                continue
            stalled = self.rng.random() < 0.3
            life = self.rng.uniform(2, 15)
            try:
                ws_url = url.replace("http://", "ws://") + "/ws/activity"
                async with websockets.connect(ws_url, max_queue=1, open_timeout=10) as ws:
                    self.ws["opened"] += 1
                    self.ws["stalled"] += stalled
                    end = time.monotonic() + life
                    if stalled:
                        await asyncio.sleep(life)
                    while not stalled and time.monotonic() < end:
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(ws.recv(), max(0.01, end - time.monotonic()))
                            self.ws["frames"] += 1
            except Exception:
                self.ws["errors"] += 1
                await asyncio.sleep(0.5)

    async def _sampler(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            self.progress.append(
                (
                    round(time.monotonic() - self._t0, 1),
                    self._in_flight(),
                    len(self.acked),
                    len(self.finished),
                    len(self._tasks),
                )
            )
            for node in self.nodes:
                roles = node.roles()
                kb = {k: rss_kb(p) for k, p in roles.items()}
                self.rss.append((time.monotonic() - self._t0, node.name, kb))
            await asyncio.sleep(min(self.cfg.sample_s, max(0.1, stop_at - time.monotonic())))

    # --- faults ---------------------------------------------------------------------

    def _faulter(self, stop_at: float) -> None:
        """Do the faults at their times until ``stop_at`` (one at a time, on this thread)."""
        rng = random.Random(self.cfg.seed + 1)
        cfg = self.cfg
        inf = float("inf")
        start = time.monotonic()
        next_kill = start + rng.uniform(0.5, 1.5) * cfg.crash_every if cfg.crash_every else inf
        next_term = start + cfg.sigterm_every if cfg.sigterm_every else inf
        next_stop = inf
        if cfg.journal == "postgres" and cfg.sigstop_at >= 0:
            next_stop = start + cfg.sigstop_at * (stop_at - start)
        while not self._halt.is_set():
            due = min(next_kill, next_term, next_stop)
            if due >= stop_at or self._halt.wait(max(0.0, due - time.monotonic())):
                return
            try:
                if due == next_stop:
                    next_stop = inf
                    self._sigstop(rng)
                elif due == next_term:
                    self._sigterm(rng)
                    next_term = time.monotonic() + cfg.sigterm_every
                else:
                    self._kill9(rng)
                    next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * cfg.crash_every
            except Exception as exc:
                self.errors.append(f"fault: {type(exc).__name__}: {exc}")
                self.faults["fault errors"] += 1
            self._all_up()

    def _all_up(self) -> None:
        """Start every node that is down (a start that fails is tried again, three times)."""
        for node in self.nodes:
            for _ in range(3):
                if node.up:
                    break
                try:
                    node.close()
                    node.start()
                except Exception as exc:
                    self.errors.append(f"start {node.name}: {exc}"[:2000])
                    self.faults["start failures"] += 1

    def _pick(self, rng: random.Random) -> Node:
        """The node to hit: on PostgreSQL the driving one three times out of four."""
        if len(self.nodes) == 1:
            return self.nodes[0]
        assert self.pg_url is not None
        pid = driving_pid(self.pg_url)
        driving = [n for n in self.nodes if pid is not None and n.roles().get("engine") == pid]
        if driving and rng.random() < 0.75:
            return driving[0]
        return rng.choice(self.nodes)

    def _stopped(self, kind: str, engine: int | None, t_cut: float, node: Node) -> None:
        """Note how engine ``engine`` stopped; on the file WAL with the last seq it wrote."""
        if engine is None:
            return
        seq = None
        if self.cfg.journal != "postgres":
            seq = self._seq_hint = wal_last_seq(node.data / "wal", self._seq_hint)
        self.stops[engine] = Stop(kind, engine, t_cut, seq)

    def _kill9(self, rng: random.Random) -> None:
        node = self._pick(rng)
        target = rng.choice(self.cfg.targets)
        roles = node.roles()
        if target not in roles:
            target = "group"  # what it names is restarting: the whole group then
        self.faults[f"kill -9 {target}"] += 1
        engine = roles.get("engine")
        if target == "group":
            t = node.kill_group()
            self._stopped(KILL9, engine, t, node)
        elif target == "serve":
            os.kill(roles["serve"], signal.SIGKILL)
            children = [roles[k] for k in ("engine", "api", "projector") if k in roles]
            left = wait_gone(children, ORPHAN_WAIT_S)
            self.faults["orphans of a killed serve"] += len(left)
            t = node.kill_group()
            wait_gone(children, 10)
            self._stopped(KILL9, engine, t, node)
        elif target == "engine":
            file_wal = self.cfg.journal != "postgres"
            if file_wal:  # no new engine writes before the last seq is read
                os.kill(roles["serve"], signal.SIGSTOP)
            try:
                os.kill(roles["engine"], signal.SIGKILL)
                t = time.monotonic()  # after: an effect written before is in flight
                wait_gone([roles["engine"]], 10)
                self._stopped(KILL9, engine, t, node)
            finally:
                if file_wal:
                    os.kill(roles["serve"], signal.SIGCONT)
        else:
            os.kill(roles[target], signal.SIGKILL)

    def _burst(self, rng: random.Random) -> int | None:
        """Submit a :data:`~soak_load.BURST` run; once it runs, the pid of the engine running it.

        Its first effect line says that the engine's thread pool is full and
        has jobs queued (32 of 1 s for 8 threads): a stop then finds some.
        """
        tag = f"t{len(self.works)}-burst"
        work = make_work(BURST, tag, rng, self.eff)
        self.works[tag] = work
        body = {"plan": work.plan, "inputs": {"tag": tag}}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and tag not in self.acked:
            url = self._url()
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if url is not None:
                    r = httpx.post(url + "/api/runs", json=body, headers={"Idempotency-Key": tag})
                    if r.status_code in (200, 201):
                        self.acked_at[tag] = time.monotonic()
                        self.acked[tag] = str(r.json()["run_id"])
                        break
            time.sleep(0.2)
        while time.monotonic() < deadline:
            started = [e.pid for e in read_executions(self.eff) if e.tag == tag]
            if started:
                self.faults["bursts"] += 1
                return started[0]
            time.sleep(0.05)
        self.faults["bursts that did not start"] += 1
        return None

    def _sigterm(self, rng: random.Random) -> None:
        pid = self._burst(rng)
        running = [n for n in self.nodes if pid is not None and n.roles().get("engine") == pid]
        node = running[0] if running else self._pick(rng)
        deadline = time.monotonic() + 30
        while "api" not in node.roles() and time.monotonic() < deadline:
            time.sleep(0.1)  # its exit times the engine's stop (Node.sigterm): let it be up
        engine = node.roles().get("engine")
        t_sent = time.monotonic()
        t_cut, code = node.sigterm()
        self.api_stop_s.append(t_cut - t_sent)
        self.faults["SIGTERM restarts"] += 1
        self.sigterm_codes.append(code)
        self._stopped(SIGTERM, engine, t_cut, node)

    def _sigstop(self, rng: random.Random) -> None:
        """SIGSTOP the driving engine until its stream is taken over, then SIGCONT it."""
        assert self.pg_url is not None
        pid = self._burst(rng) or driving_pid(self.pg_url)
        if pid is None:
            self.faults["SIGSTOP: no engine drove the stream"] += 1
            return
        taken = lambda: any(owner_pid(r["old_owner"]) == pid for r in epochs(self.pg_url or ""))  # noqa: E731
        os.kill(pid, signal.SIGSTOP)
        t_cut = time.monotonic()
        self.faults["SIGSTOP"] += 1
        try:
            deadline = t_cut + 4 * self.cfg.lease_s + 30
            while not taken() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # the new engine resumes the runs meanwhile
        finally:
            t_resume = time.monotonic()  # before the signal: the engine's clock reads later
            os.kill(pid, signal.SIGCONT)
        if not taken():
            self.faults["SIGSTOP not taken over"] += 1
            return
        self.faults["SIGSTOP taken over"] += 1
        self.stops[pid] = Stop(FENCE, pid, t_cut, None, t_resume)
        if wait_gone([pid], 60):
            self.faults["fenced engine still running"] += 1

    # --- the end --------------------------------------------------------------------

    def _stop_nodes(self) -> None:
        """SIGTERM every node: standbys first (then none of them takes the stream over)."""
        self._t_end = time.monotonic()  # what the journal's owners do after is not the soak's
        driving = driving_pid(self.pg_url) if self.pg_url is not None else None
        for node in sorted(self.nodes, key=lambda n: n.roles().get("engine") == driving):
            if node.served is not None and node.served.proc.poll() is None:
                _, code = node.sigterm()
                if code != 0:
                    self.errors.append(f"final SIGTERM of {node.name}: exit {code}")

    def _verify(self, view: JournalView) -> dict[str, Any]:
        """``replay --verify`` of every finished run, in ``verify_workers`` processes."""
        ids = [r.run_id for r in view.runs.values() if r.status in TERMINAL]
        workers = max(1, self.cfg.verify_workers)
        procs = []
        for i in range(workers):
            chunk = ids[i::workers]
            todo = self.base / f"verify-{i}.json"
            todo.write_text(json.dumps(chunk))
            errors = (self.base / f"verify-{i}.err").open("w")  # a pipe could fill and block it
            proc = subprocess.Popen(
                [sys.executable, str(HERE / "soak_verify.py"), str(self.nodes[0].data), str(todo)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=self.env,
            )
            errors.close()
            procs.append((proc, chunk))
        bad: dict[str, Any] = {}
        try:
            for i, (proc, chunk) in enumerate(procs):
                out, _ = proc.communicate(timeout=3600)
                if proc.returncode != 0:
                    err = (self.base / f"verify-{i}.err").read_text()[-500:]
                    for rid in chunk:
                        bad[rid] = {"error": f"verifier exited {proc.returncode}: {err}"}
                    continue
                bad.update(json.loads(out.strip().splitlines()[-1]))
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        self.verified = len(ids)
        return bad

    def _summary(self, view: JournalView, bad: dict[str, Any]) -> dict[str, Any]:
        runs = view.runs
        acked = set(self.acked.values())
        lost = sorted(r for r in acked if r not in runs)
        unfinished = sorted(r for r in acked if r in runs and runs[r].status not in TERMINAL)
        by_status = Counter(runs[r].status for r in acked if r in runs)
        all_status = Counter(r.status for r in runs.values())
        not_ok = sorted(r for r in acked if r in runs and runs[r].status in ("failed", "cancelled"))
        wrong = []
        for tag, work in self.works.items():
            run = runs.get(self.acked.get(tag, ""))
            checked = work.outputs is not None and run is not None and run.status == "succeeded"
            if checked and run is not None and run.outputs != work.outputs:
                wrong.append(f"{run.run_id}: {run.outputs!r} != {work.outputs!r}")
        consumed = 0
        journaled = 0
        for tag, run_id, key, payload in self.signal_acks:
            run = runs.get(run_id)
            journaled += (run_id, key) in view.signals
            outputs = run.outputs if run is not None and isinstance(run.outputs, dict) else {}
            slot = "a" if self.works[tag].signals[0][0] == key else "b"
            consumed += outputs.get(slot) == payload
        acked_signals = {(r, k) for _, r, k, _ in self.signal_acks}
        sig_dup = sum(1 for key in acked_signals if view.signals.get(key, [0, 0, 0])[2] > 1)
        ticks = Counter(r.schedule for r in runs.values() if r.schedule is not None)
        stops = self.stops
        if self.cfg.journal == "postgres":
            assert self.pg_url is not None
            stops = pg_stops(self.pg_url, self.stops, self.mono_offset, self._t_end)
        tag_run = view.tag_run()
        executions = read_executions(self.eff)
        verdict = classify(executions, tag_run, view.durable_at, stops)
        ran = Counter((e.tag, e.step) for e in executions)
        effects_lost = []
        for tag, work in self.works.items():
            run = runs.get(self.acked.get(tag, ""))
            if run is None or run.status != "succeeded":
                continue
            for t, steps in work.effects.items():
                child = runs.get(tag_run.get(t, ""))
                if child is not None and child.status != "succeeded":
                    continue  # a child cancelled (its parent ended first): counted by status
                effects_lost += [f"{tag_run.get(t)} ({t}) {s}" for s in steps if not ran[(t, s)]]
        per_pid = Counter(e.pid for e in executions)
        stop_rows = [
            {
                "kind": stop.kind,
                "pid": stop.pid,
                "t_cut": round(stop.t_cut - self._t0, 3),
                "seq": stop.seq,
                "effects": per_pid[stop.pid],
                "after_cut": sum(1 for e in executions if e.pid == stop.pid and e.t >= stop.t_cut),
            }
            for stop in sorted(stops.values(), key=lambda s: s.t_cut)
        ]
        rss: dict[str, list[float]] = {}
        for _t, _node, kb in self.rss:
            for role, value in kb.items():
                if value:
                    rss.setdefault(role, []).append(value / 1024)
        return {
            "journal": self.cfg.journal,
            "minutes": self.cfg.minutes,
            "seed": self.cfg.seed,
            "runs_submitted": len(self.works),
            "runs_acknowledged": len(acked),
            "submissions_never_answered": self.unanswered,
            "runs_by_status": dict(by_status),
            "journal_runs_by_status": dict(all_status),
            "acknowledged_runs_lost": len(lost),
            "acknowledged_runs_unfinished": len(unfinished),
            "acknowledged_runs_not_succeeded": len(not_ok),
            "runs_with_wrong_outputs": len(wrong),
            "signals_sent": self.signals["sent"],
            "signals_acknowledged": len(self.signal_acks),
            "signals_journaled": journaled,
            "signals_lost": len(self.signal_acks) - consumed,
            "signals_duplicated": sig_dup,
            "forged_signals_sent": sum(self.forged.values()),
            "forged_signals_accepted": self.forged["accepted"],
            "schedule_ticks": len(ticks),
            "schedule_ticks_duplicated": sum(c - 1 for c in ticks.values()),
            "effects": verdict.executions,
            "in_flight_reruns": verdict.in_flight_reruns,
            "effects_started_after_stop": dict(verdict.after_cut),
            "effects_duplicated": {cause: verdict.duplicated[cause] for cause in CAUSES},
            "effects_lost": len(effects_lost),
            "runs_verified": self.verified,
            "runs_not_verifying": len(bad),
            "faults": dict(self.faults),
            "engine_stops": dict(Counter(s.kind for s in stops.values())),
            "stops": stop_rows,
            "phases_s": {k: round(v, 1) for k, v in self.phases.items()},
            "sigterm_api_stop_s": [round(x, 3) for x in self.api_stop_s],
            "sigterm_exit_codes": dict(Counter(str(c) for c in self.sigterm_codes)),
            "model_calls": self.model.calls if self.model else 0,
            "websockets": dict(self.ws),
            "rss_mb": {k: (v[0], max(v), v[-1], len(v)) for k, v in rss.items()},
            "rss_samples": self.rss,
            "progress": self.progress,
            "problems": {
                "lost": lost[:10],
                "unfinished": unfinished[:10],
                "not_succeeded": not_ok[:10],
                "wrong_outputs": wrong[:10],
                "duplicated": verdict.problems[:10],
                "effects_lost": effects_lost[:10],
                "not_verifying": dict(list(bad.items())[:5]),
                "errors": self.errors[:10],
            },
        }


#: The summary's counts that must be 0 (the short test asserts them).
MUST_BE_ZERO = (
    "submissions_never_answered",
    "acknowledged_runs_lost",
    "acknowledged_runs_unfinished",
    "acknowledged_runs_not_succeeded",
    "runs_with_wrong_outputs",
    "signals_lost",
    "signals_duplicated",
    "forged_signals_accepted",
    "schedule_ticks_duplicated",
    "effects_lost",
    "runs_not_verifying",
)


def nonzero(summary: dict[str, Any]) -> dict[str, int]:
    """The counts of the summary that must be 0 and are not."""
    out = {k: summary[k] for k in MUST_BE_ZERO if summary[k]}
    out |= {f"effects duplicated ({c})": n for c, n in summary["effects_duplicated"].items() if n}
    return out


def table(s: dict[str, Any]) -> str:
    """The summary as one table (``*``: must be 0)."""

    def slash(d: dict[str, Any], keys: tuple[str, ...]) -> str:
        return " / ".join(str(d.get(k, 0)) for k in keys)

    st = ("succeeded", "failed", "cancelled", "running")
    dup = s["effects_duplicated"]
    after = s["effects_started_after_stop"]
    faults = s["faults"]
    kills = " / ".join(str(faults.get(f"kill -9 {t}", 0)) for t in TARGETS)
    rows: list[tuple[str, Any, str]] = [
        ("runs submitted / acknowledged", f"{s['runs_submitted']} / {s['runs_acknowledged']}", ""),
        ("submissions retried to the end, never answered", s["submissions_never_answered"], "*"),
        (
            "acknowledged: succeeded / failed / cancelled / running",
            slash(s["runs_by_status"], st),
            "",
        ),
        (
            "all runs in the journal (children, ticks): same",
            slash(s["journal_runs_by_status"], st),
            "",
        ),
        ("acknowledged runs lost (not in the journal)", s["acknowledged_runs_lost"], "*"),
        ("acknowledged runs unfinished at the end", s["acknowledged_runs_unfinished"], "*"),
        ("acknowledged runs failed or cancelled", s["acknowledged_runs_not_succeeded"], "*"),
        ("runs with wrong outputs", s["runs_with_wrong_outputs"], "*"),
        (
            "signals sent / acknowledged (202) / journaled",
            f"{s['signals_sent']} / {s['signals_acknowledged']} / {s['signals_journaled']}",
            "",
        ),
        ("signals lost (acknowledged, not consumed)", s["signals_lost"], "*"),
        ("signals duplicated (journaled twice)", s["signals_duplicated"], "*"),
        (
            "forged child: signals sent / accepted",
            f"{s['forged_signals_sent']} / {s['forged_signals_accepted']}",
            "*",
        ),
        (
            "schedule ticks run / duplicated",
            f"{s['schedule_ticks']} / {s['schedule_ticks_duplicated']}",
            "*",
        ),
        (
            "effects run / re-runs of steps in flight at a stop",
            f"{s['effects']} / {s['in_flight_reruns']}",
            "",
        ),
        ("effects duplicated beyond in-flight: kill -9", dup[KILL9], "*"),
        ("                                     SIGTERM", dup[SIGTERM], "*"),
        ("                                     fence", dup[FENCE], "*"),
        (
            "                                     unplanned stop / none",
            f"{dup['unplanned']} / {dup['none']}",
            "*",
        ),
        (
            "effects started after their engine's stop: kill -9 / SIGTERM / fence",
            slash(after, (KILL9, SIGTERM, FENCE)),
            "",
        ),
        ("effects lost (a step of a succeeded run never ran)", s["effects_lost"], "*"),
        ("runs verified / not verifying", f"{s['runs_verified']} / {s['runs_not_verifying']}", "*"),
        (f"kill -9: {' / '.join(TARGETS)}", kills, ""),
        (
            "orphans left by a killed serve (after 5 s)",
            faults.get("orphans of a killed serve", 0),
            "",
        ),
        (
            "SIGTERM restarts (exit codes)",
            f"{faults.get('SIGTERM restarts', 0)} {s['sigterm_exit_codes']}",
            "",
        ),
        (
            "SIGSTOPs / taken over / fenced engine still running 60 s later",
            slash(faults, ("SIGSTOP", "SIGSTOP taken over", "fenced engine still running")),
            "",
        ),
        ("engine stops by kind", s["engine_stops"], ""),
        ("model calls (mock)", s["model_calls"], ""),
        (
            "seconds: load and the runs' end / stop and journal read / verify",
            " / ".join(f"{v:.0f}" for v in s["phases_s"].values()),
            "",
        ),
        (
            "websockets opened / stalled / frames / errors",
            slash(s["websockets"], ("opened", "stalled", "frames", "errors")),
            "",
        ),
    ]
    for role in ("engine", "api", "projector", "serve"):
        if role in s["rss_mb"]:
            first, peak, last, n = s["rss_mb"][role]
            rows.append(
                (
                    f"RSS MB {role}: first / max / last ({n} samples)",
                    f"{first:.0f} / {peak:.0f} / {last:.0f}",
                    "",
                )
            )
    width = max(len(r[0]) for r in rows)
    head = f"soak: {s['minutes']:g} min, {s['journal']} journal, seed {s['seed']}"
    lines = [head, f"{'':{width}}  {'count':>22}  must be 0"]
    lines += [f"{name:{width}}  {value!s:>22}  {mark}" for name, value, mark in rows]
    return "\n".join(lines)
