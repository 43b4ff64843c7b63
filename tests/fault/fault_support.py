"""The fault suite's harness: a real ``tiffany serve``, killed -9 as a group and restarted.

:class:`Served` starts ``tiffany serve --data-dir D --port 0`` in its own
session (process group), reads the URL from ``<data dir>/serve.json``, and
:meth:`Served.kill9` sends SIGKILL to the whole group (serve, engine,
projector, API) and to any descendant that left it. Every wait has a
timeout; :meth:`Served.close` always leaves no process behind.

The test tools (``fault.effect``, ``fault.flaky`` in ``fault_tools.py``) reach
the engine through a ``tiffany.tools`` entry point: :func:`tools_env` writes a
tiny ``*.dist-info`` into a directory put on ``PYTHONPATH``, so the served
engine loads them exactly as it loads an operator's installed package.

Effects: ``fault.effect`` appends ``"<tag> <step> <pid>"`` to
``effects.log``; :func:`durable_steps` reads which steps' results were in the
WAL at a crash (a worker task's ``step`` wake-up with an ok result), so the
test can tell "a finished step ran again" (a bug) from "a step in flight at
the crash ran once more" (allowed).

Plans: :func:`mixed_plan` builds one of four shapes (fan-out, chain, retry
with a flaky step, sleeps), seeded, whose outputs do not depend on the tag,
so an uncrashed twin of the same plan and inputs must produce equal outputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random  # noqa: TID251 - the harness picks plans and kill points, not task code
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from process_support import alive as _alive

HERE = Path(__file__).resolve().parent
START_TIMEOUT_S = 90.0
TIFFANY = (sys.executable, "-m", "tiffany")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def tools_env(base: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a served instance that can run the ``fault.*`` python tools."""
    ep = base / "entry-points"
    dist = ep / "fault_tools-0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fault-tools\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[tiffany.tools]\nfault.effect = fault_tools:effect\nfault.flaky = fault_tools:flaky\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(ep), str(HERE), os.environ.get("PYTHONPATH", "")]),
            "TIFFANY_LOG_FORMAT": "json",
            "TIFFANY_LOG_LEVEL": "warning",
        }
    )
    env.update(extra or {})
    return env


def _descendants(pid: int) -> list[int]:
    """All descendants of ``pid`` (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_roles(pid: int) -> dict[str, int]:
    """``{"engine": pid, "api": pid, "projector": pid}`` among ``pid``'s descendants."""
    roles: dict[str, int] = {}
    for child in _descendants(pid):
        with contextlib.suppress(OSError):
            argv = (Path(f"/proc/{child}/cmdline").read_bytes()).split(b"\0")
            words = [a.decode(errors="replace") for a in argv]
            for role in ("engine", "api", "projector"):
                if role in words and role not in roles:
                    roles[role] = child
    return roles


class Served:
    """A ``tiffany serve`` process group on ``data_dir``.

    Args:
        data_dir: Its data dir.
        env: Its whole environment (see :func:`tools_env`).
        log_path: Where its output goes (appended).
        port: The API's port (0: any free one; a restarted API may then get
            another, which ``serve.json`` does not follow: the soak passes one).
    """

    def __init__(
        self, data_dir: Path, env: dict[str, str], log_path: Path | None = None, port: int = 0
    ) -> None:
        self.data_dir = data_dir
        self.env = env
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}-serve.log"
        data_dir.mkdir(parents=True, exist_ok=True)
        ready = data_dir / "serve.json"
        ready.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*TIFFANY, "serve", "--data-dir", str(data_dir), "--port", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if ready.exists():
                with contextlib.suppress(ValueError, OSError, KeyError):
                    self.url = str(json.loads(ready.read_text())["url"]).rstrip("/")
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill9()
                raise RuntimeError(f"serve did not start:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        host = self.url.split("://", 1)[1].split(":", 1)[0]
        assert host == "127.0.0.1", self.url

    def roles(self) -> dict[str, int]:
        """The pids of the engine, API and projector processes."""
        return process_roles(self.proc.pid)

    def kill9(self) -> None:
        """SIGKILL the whole group, and any descendant that left it; reap serve."""
        pids = _descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        # The children are reparented (to init or a subreaper): wait until they are gone.
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{p}").exists() and _alive(p) for p in pids):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM serve and wait (SIGKILL the group after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode

    def close(self) -> None:
        """Leave nothing running (idempotent)."""
        if self.proc.poll() is None:
            self.kill9()
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout: float = 60) -> None:
        """Until ``/readyz`` says ready."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = httpx.get(self.url + "/readyz", timeout=5)
                if r.status_code == 200 and r.json().get("ready"):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"serve not ready:\n{self.log()[-4000:]}")
            time.sleep(0.1)


class ServeFactory:
    """Starts :class:`Served` instances on one data dir and closes every one at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data_dir = base / "data"
        self.effects_dir = base / "effects"
        self.effects_dir.mkdir(parents=True, exist_ok=True)
        self.env = tools_env(base)
        self.started: list[Served] = []

    def start(self) -> Served:
        served = Served(self.data_dir, self.env, log_path=self.base / "serve.log")
        self.started.append(served)
        return served

    def close(self) -> None:
        for served in self.started:
            served.close()


def cli(data_dir: Path, env: dict[str, str], *args: str, timeout: float = 120) -> str:
    """Run ``tiffany --data-dir D ARGS``; return stdout (AssertionError on failure)."""
    done = subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"tiffany {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done.stdout


# --- plans -----------------------------------------------------------------------------


def effect_args(eff: Path, step: str, value: Any = 1, sleep: float = 0.0) -> dict[str, Any]:
    """The ``python`` args of a ``fault.effect`` step of the run's ``tag`` (sleeps after it)."""
    kwargs: dict[str, Any] = {"dir": str(eff), "tag": "${inputs.tag}", "step": step}
    kwargs.update({"value": value, "sleep": sleep})
    return {"function": "fault.effect", "kwargs": kwargs}


def mixed_plan(kind: str, rng: random.Random, eff: Path) -> dict[str, Any]:
    """A plan of shape ``kind`` (fanout, chain, retry, sleepy); outputs independent of the tag.

    Every ``fault.effect`` step is an effect the test counts; sleeps and
    fan-out widths are drawn from ``rng`` (so a seed fixes the workload).
    """
    steps: list[dict[str, Any]] = []
    outputs: dict[str, str] = {}
    if kind == "fanout":
        width = rng.randint(3, 6)
        for i in range(width):
            args = effect_args(eff, f"f{i}", i, round(rng.uniform(0.05, 0.4), 3))
            steps.append({"id": f"f{i}", "tool": "python", "args": args})
        steps.append(
            {"id": "nap", "tool": "sleep", "args": {"seconds": round(rng.uniform(0.1, 0.6), 3)}}
        )
        steps.append(
            {
                "id": "join",
                "tool": "python",
                "after": [f"f{i}" for i in range(width)] + ["nap"],
                "args": effect_args(eff, "join", f"${{steps.f{width - 1}.output.value}}"),
            }
        )
        outputs = {"last": "${steps.join.output.value}", "first": "${steps.f0.output.value}"}
    elif kind == "chain":
        length = rng.randint(3, 6)
        prev = None
        for i in range(length):
            value = 1 if prev is None else f"${{steps.{prev}.output.value}}"
            step: dict[str, Any] = {
                "id": f"c{i}",
                "tool": "python",
                "args": effect_args(eff, f"c{i}", value, round(rng.uniform(0.02, 0.25), 3)),
            }
            if prev is not None:
                step["after"] = [prev]
            steps.append(step)
            prev = f"c{i}"
        outputs = {"end": f"${{steps.{prev}.output.value}}"}
    elif kind == "retry":
        steps.append(
            {
                "id": "flaky",
                "tool": "python",
                "retries": 4,
                "backoff": 0.05,
                "args": {
                    "function": "fault.flaky",
                    "kwargs": {"dir": str(eff), "key": "${inputs.tag}", "fail_times": 2},
                },
            }
        )
        steps.append(
            {
                "id": "after",
                "tool": "python",
                "after": ["flaky"],
                "args": effect_args(eff, "after", 5, round(rng.uniform(0.02, 0.2), 3)),
            }
        )
        outputs = {"after": "${steps.after.output.value}"}
    else:  # sleepy
        for i in range(rng.randint(2, 4)):
            secs = round(rng.uniform(0.1, 1.0), 3)
            steps.append({"id": f"s{i}", "tool": "sleep", "args": {"seconds": secs}})
        steps.append(
            {
                "id": "mark",
                "tool": "python",
                "after": [s["id"] for s in steps],
                "args": effect_args(eff, "mark", 7),
            }
        )
        outputs = {"mark": "${steps.mark.output.value}"}
    return {"name": f"fault-{kind}", "inputs": {"tag": ""}, "steps": steps, "outputs": outputs}


PLAN_KINDS = ("fanout", "chain", "retry", "sleepy")


def effect_steps(plan: dict[str, Any]) -> set[str]:
    """The ids of the plan's ``fault.effect`` steps."""
    return {
        s["id"]
        for s in plan["steps"]
        if s["tool"] == "python" and s["args"]["function"] == "fault.effect"
    }


# --- effects and the WAL ---------------------------------------------------------------


def read_effects(eff: Path) -> list[tuple[str, str, int]]:
    """The ``(tag, step, pid)`` lines of ``effects.log``, in order (their times left out)."""
    path = eff / "effects.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        tag, step, pid = line.split()[:3]
        out.append((tag, step, int(pid)))
    return out


#: In :func:`durable_steps`: every step of the run (it finished).
ALL_STEPS = "*"


def durable_steps(wal_dir: Path) -> dict[str, set[str]]:
    """For each run in the WAL: the step ids whose ok result is journaled.

    A worker task is spawned as ``worker:<step id>``; its step's result comes
    back as a ``WAKE`` with cause ``step`` whose value is ``[[ok, output], ...]``.
    Read with the WAL stopped (a torn tail ends the scan quietly). A finished
    run maps to ``{ALL_STEPS}`` (its records are not decoded).
    """
    from tiffany.durable.history import decoded_records, scan
    from tiffany.wire.records import RecordType

    index = scan(wal_dir)
    out: dict[str, set[str]] = {}
    for info in index.runs.values():
        if info.finished:  # every step of a finished run is done: nothing of it may run again
            out[info.run_id] = {ALL_STEPS}
            continue
        ltid_step: dict[int, str] = {}
        done: set[str] = set()
        for _seq, rtype, rec in decoded_records(wal_dir, info):
            if rtype == RecordType.SPAWN and rec.role == "worker":
                ltid_step[rec.ltid] = rec.step_id
            elif rtype == RecordType.WAKE and rec.cause == "step" and rec.ok:
                value = rec.value
                ok = (
                    isinstance(value, list) and value and isinstance(value[0], list) and value[0][0]
                )
                step = ltid_step.get(rec.ltid)
                if ok and step is not None:
                    done.add(step)
        out[info.run_id] = done
    return out


def wal_runs(wal_dir: Path) -> dict[str, str]:
    """``{run_id: status}`` of every run in the WAL."""
    from tiffany.durable.history import scan

    return {info.run_id: info.status for info in scan(wal_dir).runs.values()}


def check_effects(
    effects: list[tuple[str, str, int]],
    crashes: list[tuple[int, dict[str, set[str]]]],
    tag_run: dict[str, str],
    expected_steps: dict[str, set[str]],
) -> list[str]:
    """Problems with the effects of the acknowledged runs (empty: all is well).

    Args:
        effects: Every effect line, in order.
        crashes: For each crash: how many effect lines existed at it, and the
            steps durably finished then (:func:`durable_steps`).
        tag_run: The acknowledged runs: tag -> run id.
        expected_steps: tag -> the effect steps its plan has.

    Each effect step of an acknowledged run ran at least once; a step that ran
    after a crash at which its result was already durable ran twice (a bug);
    a step runs at most once more per crash.
    """
    problems: list[str] = []
    counts = Counter((t, s) for t, s, _ in effects)
    for tag, steps in expected_steps.items():
        if tag not in tag_run:
            continue
        for step in steps:
            if counts[(tag, step)] == 0:
                problems.append(f"{tag_run[tag]} ({tag}) step {step}: never ran")
            if counts[(tag, step)] > 1 + len(crashes):
                problems.append(f"{tag_run[tag]} step {step}: ran {counts[(tag, step)]} times")
    for boundary, done in crashes:
        for tag, step, _pid in effects[boundary:]:
            run_id = tag_run.get(tag)
            finished = done.get(run_id or "", set())
            if run_id is not None and (step in finished or ALL_STEPS in finished):
                problems.append(f"{run_id} ({tag}) step {step}: finished before a crash, ran again")
    return problems


def rerun_count(effects: list[tuple[str, str, int]]) -> int:
    """How many effect executions were re-runs (a second line for the same tag and step)."""
    counts = Counter((t, s) for t, s, _ in effects)
    return sum(c - 1 for c in counts.values() if c > 1)


def store_rows(database_url: str) -> dict[str, dict[str, Any]]:
    """``{run_id: {status, outputs, steps: {id: status}}}`` from a store database."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from tiffany.store import make_engine, queries
    from tiffany.store.models import Run

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            out = {}
            for run in session.scalars(select(Run)):
                detail = queries.run_detail(run)
                out[run.run_id] = {
                    "run_no": detail.get("run_no"),
                    "status": detail["status"],
                    "outputs": detail.get("outputs"),
                    "steps": {s["step_id"]: s["status"] for s in detail.get("steps", [])},
                }
            return out
    finally:
        engine.dispose()


def verify_all(data_dir: Path, env: dict[str, str], run_ids: list[str]) -> dict[str, Any]:
    """``replay --verify`` of every run, in one child process: ``{run_id: problems}``."""
    script = (
        "import json, sys\n"
        "from tiffany.config import Settings\n"
        "from tiffany.durable import verify\n"
        "from tiffany.engine import replay_resolvers\n"
        "s = Settings(data_dir=sys.argv[1])\n"
        "bad = {}\n"
        "for rid in json.loads(sys.stdin.read()):\n"
        "    r = verify(sys.argv[1], rid, resolvers=replay_resolvers(s))\n"
        "    if not r.ok:\n"
        "        bad[rid] = {'problems': r.problems, 'divergence': r.divergence}\n"
        "print(json.dumps(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(data_dir)],
        input=json.dumps(run_ids),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
