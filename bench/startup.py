"""Start-up time and engine memory with 100,000 finished runs in the history vs none.

Builds a data dir with N finished runs (default 100,000) by journaling them
directly with the durable ``Runtime`` (no HTTP; fsync ``off``), projects them
into the SQLite store (``project_wal``, as ``db rebuild`` would), then times
``tiffany serve`` (a real subprocess on loopback) from its start to the first
``/readyz`` 200, and reads the engine's RSS right then:

* an empty data dir;
* the history under ``TIFFANY_WAL_RETAIN=all`` and ``archive`` (the default).

Each history dir is started once first (with no checkpoint yet: a full scan;
its stop writes the first checkpoint and, under ``archive``, releases the
finished segments), then ``--repeat`` more times: those are the figures that
count ("restart"). Prints a table and the ratios to the empty dir. Not a test:
nothing here asserts on time.

    .venv/bin/python bench/startup.py                # 100,000 runs
    .venv/bin/python bench/startup.py --runs 20000 --repeat 2
    .venv/bin/python bench/startup.py --journal postgres   # journal and store in PostgreSQL

``--journal postgres``: the history is journaled into a PostgreSQL stream and
projected into a store in the same schema (one schema per data dir, created
and dropped by the bench); the columns are the empty database and the
history (a checkpoint row instead of retention: the first start writes it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tiffany.durable.runtime import Runtime
from tiffany.kernel import NewTask, Now, Random, WaitTask
from tiffany.projector.tail import project_wal

#: Longest a start may take before the bench gives up, in seconds.
START_TIMEOUT_S = 300.0
#: Runs journaled per Runtime.run() batch while building.
BUILD_BATCH = 5_000


def _child(i: int) -> Iterator[Any]:
    yield Now()
    return i


def tiny(i: int, pad: str = "") -> Iterator[Any]:
    """A finished run of about a dozen records: a child task, a clock read, a random draw."""
    tid = yield NewTask(_child(i))
    yield Random()
    return (yield WaitTask(tid))


def build(
    data_dir: Path, runs: int, entry_bytes: int, pg_url: str | None = None
) -> tuple[float, float, int]:
    """Journal ``runs`` finished runs and project them; return (journal s, project s, WAL bytes).

    Each run's entry carries ``entry_bytes`` of padding, standing for the plan
    a real run's RUN_START holds.
    """
    pad = "p" * entry_bytes
    t0 = time.perf_counter()
    log = None
    if pg_url is not None:
        from tiffany.wal.pg import PgLog

        log = PgLog.open(pg_url)
    with Runtime(data_dir, fsync="off", log=log) as rt:
        done = 0
        while done < runs:
            ids = [
                rt.submit_entry(
                    {"kind": "callable", "target": "startup:tiny", "args": [i, pad], "kwargs": {}},
                    name="tiny",
                )
                for i in range(done, min(runs, done + BUILD_BATCH))
            ]
            rt.run()
            for run_id in ids:  # a long build keeps nothing of finished runs
                rt.journal.forget_run(run_id)
            done = min(runs, done + BUILD_BATCH)
    t1 = time.perf_counter()
    if pg_url is not None:
        from tiffany.wal.pg import PgStream

        project_wal(pg_url, PgStream(pg_url))
        return t1 - t0, time.perf_counter() - t1, 0
    project_wal(f"sqlite:///{data_dir / 'tiffany.db'}", data_dir / "wal")
    t2 = time.perf_counter()
    size = sum(p.stat().st_size for p in (data_dir / "wal").rglob("*.wal"))
    return t1 - t0, t2 - t1, size


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_once(
    data_dir: Path, retain: str, pg_url: str | None = None
) -> tuple[float, float, float]:
    """Start ``tiffany serve``; return (s to /readyz 200, engine CPU s, engine RSS MB); stop it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.update(TIFFANY_LOG_FORMAT="json", TIFFANY_WAL_RETAIN=retain, TIFFANY_WAL_FSYNC="batch")
    if pg_url is not None:
        env.update(TIFFANY_JOURNAL="postgres", TIFFANY_DATABASE_URL=pg_url)
    (data_dir / "serve.json").unlink(missing_ok=True)
    argv = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir)]
    argv += ["serve", "--host", "127.0.0.1", "--port", "0"]
    log = open(data_dir / "serve.log", "ab")  # noqa: SIM115 - closed below
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        info = _wait_ready(proc, data_dir)
        took = time.perf_counter() - t0
        cpu = _cpu_s(int(info["engine_pid"]))
        rss = _rss_mb(int(info["engine_pid"]))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return took, cpu, rss


def _wait_ready(proc: subprocess.Popen[bytes], data_dir: Path) -> dict[str, Any]:
    deadline = time.perf_counter() + START_TIMEOUT_S
    info: dict[str, Any] = {}
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode}; see {data_dir / 'serve.log'}")
        if not info:
            with contextlib.suppress(OSError, ValueError):
                info = json.loads((data_dir / "serve.json").read_text())
        if info:
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(info["url"] + "readyz", timeout=5) as resp,
            ):
                if resp.status == 200 and info.get("engine_pid"):
                    return info
        time.sleep(0.01)
    raise RuntimeError("serve did not get ready in time")


def wal_state(data_dir: Path) -> str:
    wal = data_dir / "wal"
    if not wal.exists():
        return "(journal in PostgreSQL)"
    live = sum(p.stat().st_size for p in wal.glob("*.wal")) / 2**20
    archived = sum(p.stat().st_size for p in (wal / "archive").glob("*.wal")) / 2**20
    return f"live {live:.0f} MiB, archived {archived:.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--entry-bytes", type=int, default=2_000, help="Plan-sized padding a run.")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="Keep the data dirs (printed).")
    ap.add_argument("--journal", default="file", choices=["file", "postgres"])
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the runs' target: startup:tiny
    if args.journal == "postgres":
        postgres_main(args)
        return
    root = Path(tempfile.mkdtemp(prefix="tiffany-startup-"))
    try:
        history = root / "history"
        journal_s, project_s, size = build(history, args.runs, args.entry_bytes)
        print(
            f"built {args.runs:,} finished runs: journal {journal_s:.1f} s, "
            f"store {project_s:.1f} s, WAL {size / 2**20:.0f} MiB"
        )
        dirs = {"empty": root / "empty", "all": root / "all", "archive": root / "archive"}
        dirs["empty"].mkdir()
        first: dict[str, float | None] = {"empty": None}
        for retain in ("all", "archive"):
            shutil.copytree(history, dirs[retain])
            first[retain] = start_once(dirs[retain], retain)[0]  # no checkpoint yet
        start_once(dirs["empty"], "archive")  # the empty dir's first start
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in dirs}
        for _ in range(args.repeat):  # interleaved: a load spike hits every column alike
            for name, data in dirs.items():
                samples[name].append(start_once(data, "archive" if name == "empty" else name))
        report(dirs, first, samples, args.runs)
    finally:
        if args.keep:
            print(f"data dirs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def postgres_main(args: argparse.Namespace) -> None:
    """The same comparison with the journal and the store in PostgreSQL."""
    from durable_steps import _pg_schema

    with (
        tempfile.TemporaryDirectory(prefix="tiffany-startup-") as tmp,
        _pg_schema(args.pg_url) as empty_url,
        _pg_schema(args.pg_url) as history_url,
    ):
        root = Path(tmp)
        journal_s, project_s, _ = build(root / "build", args.runs, args.entry_bytes, history_url)
        print(
            f"built {args.runs:,} finished runs in PostgreSQL: journal {journal_s:.1f} s, "
            f"store {project_s:.1f} s"
        )
        dirs = {"empty": root / "empty", "pg": root / "history"}
        urls = {"empty": empty_url, "pg": history_url}
        for data in dirs.values():
            data.mkdir()
        first: dict[str, float | None] = {
            name: start_once(data, "all", urls[name])[0] for name, data in dirs.items()
        }
        first["empty"] = None
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in dirs}
        for _ in range(args.repeat):
            for name, data in dirs.items():
                samples[name].append(start_once(data, "all", urls[name]))
        report(dirs, first, samples, args.runs)


def report(
    dirs: dict[str, Path],
    first: dict[str, float | None],
    samples: dict[str, list[tuple[float, float, float]]],
    runs: int,
) -> None:
    def med(name: str, i: int) -> float:
        return statistics.median(s[i] for s in samples[name])

    print()
    print(
        f"{'data dir':<24} {'1st start s':>11} {'restart s':>10} {'x empty':>8} "
        f"{'engine CPU s':>13} {'x empty':>8} {'engine RSS MB':>14} {'x empty':>8}  WAL after"
    )
    for name, data in dirs.items():
        label = "empty" if name == "empty" else f"{runs:,} runs, {name}"
        first_s = "-" if first[name] is None else f"{first[name]:.2f}"
        cols = [
            f"{med(name, i):>{w}.2f} {med(name, i) / med('empty', i):>7.2f}x"
            for i, w in ((0, 10), (1, 13), (2, 14))
        ]
        print(f"{label:<24} {first_s:>11} {' '.join(cols)}  {wal_state(data)}")
    print(
        "(medians of the restarts; wall time includes the API process's start, CPU is the engine's)"
    )


if __name__ == "__main__":
    main()
