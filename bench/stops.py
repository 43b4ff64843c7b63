"""Stops and fences with hundreds of queued steps: effects started after, steps run twice.

    python bench/stops.py                        # this tree: SIGTERM (file WAL), fence (PostgreSQL)
    python bench/stops.py --before /work/main    # + another tree, side by side
    python bench/stops.py --steps 300 --postgres URL

Each cell starts a real ``tiffany engine`` from its tree (``PYTHONPATH``; a
child process of this script per cell) and submits one plan of ``--steps``
independent python steps. Each step is an effect that takes ``--effect-s``
and appends ``start <step> <time>`` as it begins (a module written next to
the data dir, loaded with ``--import``): with a pool of 8 threads, hundreds
of steps wait in its queue, their STEP_START durable. Once ``--first``
effects have started:

* ``sigterm``: the engine gets SIGTERM (the file WAL), exits, and a second
  engine on the same data dir finishes the run;
* ``fence``: the stream's lease epoch is bumped in ``wal_streams``, as a
  take-over does (the PostgreSQL journal, a schema of its own, dropped
  afterwards); the engine is fenced, exits, and a second engine, the
  stream's next owner once the lease ran out, finishes the run.

Figures per cell: the effects started before the engine exited; those that
started after the signal was sent, or after the engine learnt of the fence
(its ``pgwal.failed`` / ``pgwal.lease_lost`` line) and after the epoch moved
(the engine cannot know before its next commit or heartbeat); then, once the
second engine finished, the steps that ran twice and the steps that never
ran (the target: 0). A step in flight at the stop (a worker thread ran it,
its completion not journaled) may run twice: the pool holds 8.

Nothing here is a test: it prints, and asserts nothing on time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from _pg import drop_pg_schema, pg_schema  # bench/_pg.py: python bench/X.py puts bench/ first

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
STEPS = 300
EFFECT_S = 0.05
FIRST = 40
#: The lease of the fence cell's stream, in seconds: the successor waits it out.
LEASE_S = 2.0
START_TIMEOUT_S = 120.0

EFFECT_MODULE = """
import os, time
from pathlib import Path
from tiffany import python_tool

@python_tool("bench_stop_effect")
def bench_stop_effect(dir: str, step: int, seconds: float) -> int:
    line = f"start {step} {time.time():.6f}\\n".encode()
    fd = os.open(Path(dir) / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    time.sleep(seconds)
    return step
"""


# -- one cell (a child process, with the tree under test on PYTHONPATH) ------------------------


class _Engine:
    """A ``tiffany engine`` of the tree on PYTHONPATH, its log in a file."""

    def __init__(
        self, work: Path, name: str, env: dict[str, str], data: Path | None = None
    ) -> None:
        self.data = data or work / name  # another engine's: a restart on its WAL
        self.data.mkdir(exist_ok=True)
        self.ready = work / f"{name}.json"
        self.log = work / f"{name}.log"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "tiffany", "--data-dir", str(self.data), "engine"),
                    *("--ready-file", str(self.ready), "--import", "bench_stop_effects"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=work,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the engine did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        from tiffany.wire.control import call

        answer: dict[str, Any] = call(self.data, op, **fields)
        return answer

    def wait_finished(self) -> None:
        from tiffany.wire.control import ControlError, ControlUnavailable

        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with contextlib.suppress(ControlError, ControlUnavailable):
                status = self.call("status")
                if status["ready"] and status["runs_active"] == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError("the run did not finish")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def logged_at(self, *events: str) -> float | None:
        times = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError, KeyError):
                    rec = json.loads(line)
                    if rec.get("event") in events:
                        times.append(datetime.fromisoformat(rec["timestamp"]).timestamp())
        return min(times) if times else None


def _epoch_bumper(database_url: str) -> Any:
    """A callable that bumps every stream's epoch at once (its connection opened now)."""
    import psycopg

    from tiffany.config import conninfo

    conn = psycopg.connect(conninfo(database_url), autocommit=True)

    def bump() -> None:
        try:
            conn.execute("UPDATE wal_streams SET epoch = epoch + 1")
        finally:
            conn.close()

    return bump


def _starts(effects: Path) -> list[tuple[int, float]]:
    path = effects / "effects.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        _, step, at = line.split()
        out.append((int(step), float(at)))
    return out


def run_cell(
    kind: str, steps: int, effect_s: float, first: int, database_url: str
) -> dict[str, Any]:
    with TemporaryDirectory(prefix="tiffany-stops-") as tmp:
        work = Path(tmp)
        (work / "bench_stop_effects.py").write_text(EFFECT_MODULE)
        effects = work / "effects"
        effects.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
        env.update(
            PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(work)]),
            TIFFANY_LOG_FORMAT="json",
            TIFFANY_LOG_LEVEL="info",
        )
        if kind == "fence":
            env.update(
                TIFFANY_JOURNAL="postgres",
                TIFFANY_DATABASE_URL=database_url,
                TIFFANY_JOURNAL_LEASE_S=str(LEASE_S),
            )
        else:
            env["TIFFANY_DATABASE_URL"] = f"sqlite:///{work / 'store.db'}"
        plan = {
            "name": "stops",
            "steps": [
                {
                    "id": f"s{i}",
                    "tool": "python",
                    "args": {
                        "function": "bench_stop_effect",
                        "kwargs": {"dir": str(effects), "step": i, "seconds": effect_s},
                    },
                }
                for i in range(steps)
            ],
        }
        eng = _Engine(work, "a", env)
        out: dict[str, Any] = {}
        bump = _epoch_bumper(database_url) if kind == "fence" else None  # connected beforehand
        try:
            eng.call("submit", plan=plan)
            deadline = time.monotonic() + START_TIMEOUT_S
            while len(_starts(effects)) < first and time.monotonic() < deadline:
                time.sleep(0.005)
            stop_at = time.time()  # noqa: TID251 - the effects' clock
            if bump is None:
                eng.proc.send_signal(signal.SIGTERM)
            else:
                bump()  # another engine takes the stream over: the epoch moves on
            out["exit"] = eng.proc.wait(120)
        finally:
            eng.stop()
        starts = _starts(effects)
        out["started"] = len(starts)
        out["after"] = sum(1 for _, at in starts if at > stop_at)
        if kind == "fence":
            fenced = eng.logged_at("pgwal.failed", "pgwal.lease_lost")
            out["after_engine_knew"] = (
                sum(1 for _, at in starts if at > fenced) if fenced is not None else None
            )
        # The fence: the stream's next owner; SIGTERM: a restart on the same WAL.
        second = _Engine(work, "b", env, None if kind == "fence" else eng.data)
        try:
            second.wait_finished()
        finally:
            second.stop()
        counts = Counter(step for step, _ in _starts(effects))
        out["twice"] = sum(1 for n in counts.values() if n > 1)
        out["thrice"] = sum(1 for n in counts.values() if n > 2)
        out["never"] = steps - len(counts)
        out["effects"] = sum(counts.values())
        return out


# -- the driver --------------------------------------------------------------------------------


def _cell(tree: Path, kind: str, args: argparse.Namespace, url: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, __file__, "--cell", kind, "--steps", str(args.steps)]
    argv += ["--effect-s", str(args.effect_s), "--first", str(args.first), "--database-url", url]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=tree)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"failed": (proc.stderr or proc.stdout)[-800:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--effect-s", type=float, default=EFFECT_S)
    parser.add_argument("--first", type=int, default=FIRST, help="effects started before the stop")
    parser.add_argument("--before", type=Path, help="another tree to compare (e.g. /work/main)")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("TIFFANY_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
        help="PostgreSQL URL for the fence cells ('' to skip them)",
    )
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        cell = run_cell(args.cell, args.steps, args.effect_s, args.first, args.database_url)
        print(json.dumps(cell))
        return
    trees = [("this", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    rows = []
    for kind in ("sigterm", "fence"):
        for name, tree in trees:
            handle = None
            url = ""
            if kind == "fence":
                made = pg_schema(args.postgres, "bench_stops") if args.postgres else None
                if made is None:
                    continue
                url, handle = made
            try:
                rows.append((kind, name, _cell(tree, kind, args, url)))
            finally:
                if handle is not None:
                    drop_pg_schema(handle)
    print(
        f"\n{args.steps} independent steps of {args.effect_s * 1000:g} ms, 8 pool threads; "
        f"stopped once {args.first} had started\n"
    )
    head = (
        f"{'stop':8} {'tree':7} {'exit':>4} {'started':>8} {'after stop':>11} "
        f"{'after known':>12} {'ran twice':>10} {'never ran':>10} {'effects':>8}"
    )
    print(head)
    print("-" * len(head))
    for kind, name, cell in rows:
        if "failed" in cell:
            print(f"{kind:8} {name:7} failed: {cell['failed'][-300:]}")
            continue
        known = cell.get("after_engine_knew")
        known_s = "-" if kind == "sigterm" else ("?" if known is None else str(known))
        print(
            f"{kind:8} {name:7} {cell['exit']:>4} {cell['started']:>8} {cell['after']:>11} "
            f"{known_s:>12} {cell['twice']:>10} {cell['never']:>10} {cell['effects']:>8}"
        )
    print(
        "\nafter stop: effects started after SIGTERM was sent, or after the epoch moved;"
        "\nafter known: after the engine logged the fence (pgwal.failed / pgwal.lease_lost);"
        "\nran twice: after the restart (the file WAL) or on the stream's next owner."
    )


if __name__ == "__main__":
    main()
