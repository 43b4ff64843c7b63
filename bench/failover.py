"""Failover on the PostgreSQL journal: from kill -9 of an engine to its run going on elsewhere.

    python bench/failover.py [--lease 2 10] [--repeat 2]

For each lease length: an engine (``tiffany engine``, ``TIFFANY_JOURNAL=postgres``,
a fresh stream in a schema the bench creates and drops) runs a plan of
sequential short steps; one second in, it is killed with SIGKILL and a
second engine is started at once on another data dir with the same stream,
as a supervisor (``serve``, systemd, Kubernetes) would restart it. The
second engine waits out the dead one's lease, takes the stream (epoch 2),
replays the run and resumes it. Printed per run: kill -> lease taken, and
kill -> run resumed (the first record the new engine journals for it: the
plan's next dispatch), against issue 11's target of lease + 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from durable_steps import _pg_schema  # noqa: E402

from tiffany.wal.pg import conninfo  # noqa: E402
from tiffany.wire.control import call  # noqa: E402

STEPS = 300
PLAN = {
    "name": "failover",
    "steps": [
        {
            "id": f"s{i}",
            "tool": "sleep",
            "args": {"seconds": 0.02},
            **({"after": [f"s{i - 1}"]} if i else {}),
        }
        for i in range(STEPS)
    ],
}


def _engine(data_dir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    ready = data_dir / "engine.json"
    data_dir.mkdir(parents=True)
    log = (data_dir / "engine.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tiffany",
            "--data-dir",
            str(data_dir),
            "engine",
            "--ready-file",
            str(ready),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def _wait_file(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no {path} after {timeout} s")
        time.sleep(0.01)


def one(url: str, lease: float, work: Path) -> tuple[float, float]:
    """Run one failover; return (kill -> lease taken, kill -> first step resumed) in seconds."""
    stream = f"fo-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env |= {
        "TIFFANY_DATABASE_URL": url,
        "TIFFANY_JOURNAL": "postgres",
        "TIFFANY_JOURNAL_STREAM": stream,
        "TIFFANY_JOURNAL_LEASE_S": str(lease),
        "TIFFANY_LOG_FORMAT": "json",
    }
    first_dir, second_dir = work / f"{stream}-a", work / f"{stream}-b"
    first = _engine(first_dir, env)
    _wait_file(first_dir / "engine.json")
    call(first_dir, "submit", plan=PLAN, inputs={}, key=None)
    time.sleep(1.0)
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        killed_at = time.monotonic()
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = _engine(second_dir, env)
        try:
            dead_head = conn.execute(
                "SELECT head FROM wal_streams WHERE stream = %s", (stream,)
            ).fetchone()[0]  # type: ignore[index]
            taken = resumed = None
            while resumed is None:
                if time.monotonic() - killed_at > lease + 60:
                    log = (second_dir / "engine.log").read_text()[-3000:]
                    raise SystemExit(f"no step resumed a minute past the lease:\n{log}")
                if taken is None:
                    epoch = conn.execute(
                        "SELECT epoch FROM wal_streams WHERE stream = %s", (stream,)
                    ).fetchone()[0]  # type: ignore[index]
                    if epoch > 1:
                        taken = time.monotonic() - killed_at
                row = conn.execute(
                    "SELECT seq FROM wal_records WHERE stream = %s AND seq > %s LIMIT 1",
                    (stream, dead_head),
                ).fetchone()
                if row is not None:
                    resumed = time.monotonic() - killed_at
                    taken = taken if taken is not None else resumed
                time.sleep(0.005)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=30)
    return taken, resumed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--lease", type=float, nargs="+", default=[2.0, 10.0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    rows = []
    with _pg_schema(args.pg_url) as url, tempfile.TemporaryDirectory(dir="/tmp") as work:
        for lease in args.lease:
            for _ in range(args.repeat):
                taken, resumed = one(url, lease, Path(work))
                rows.append((lease, taken, resumed))
    print("\nfailover on the PostgreSQL journal: kill -9, then a new engine on the same stream")
    print(f"{'lease s':>8}{'lease taken s':>15}{'run resumed s':>16}{'target s':>10}{'':>6}")
    for lease, taken, resumed in rows:
        ok = "ok" if resumed < lease + 2 else "MISS"
        print(f"{lease:>8g}{taken:>15.2f}{resumed:>16.2f}{lease + 2:>10g}{ok:>6}")
    print(json.dumps([{"lease_s": r[0], "taken_s": r[1], "resumed_s": r[2]} for r in rows]))


if __name__ == "__main__":
    main()
