"""Two ``tiffany serve`` on one PostgreSQL journal: one drives it, one waits; kill -9, failover.

Real processes on loopback and the local PostgreSQL (``pg_schema_url``):
the second server's engine waits for the stream's lease, while its API
serves through the database (a submission there is run by the first
server's engine); the first one's whole process group is
killed with SIGKILL mid-run; the second takes the stream over after the
lease, replays the run, finishes it, and it verifies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from process_support import wait_for

NAPS = {
    "name": "naps",
    "steps": [
        {"id": "first", "tool": "sleep", "args": {"seconds": 1.5}},
        {"id": "second", "tool": "sleep", "args": {"seconds": 0.5}, "after": ["first"]},
    ],
}


def _http(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _readiness(url: str) -> tuple[int, str | None]:
    try:
        with urllib.request.urlopen(url + "readyz", timeout=10) as resp:
            return int(resp.status), json.loads(resp.read())["reason"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["reason"]


def _serve(data_dir: Path, url: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env |= {
        "TIFFANY_LOG_FORMAT": "json",
        "TIFFANY_DATABASE_URL": url,
        "TIFFANY_JOURNAL": "postgres",
        "TIFFANY_JOURNAL_LEASE_S": "2",
    }
    data_dir.mkdir(parents=True)
    return subprocess.Popen(
        [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data_dir), "--port", "0"],
        stdout=(data_dir.parent / f"{data_dir.name}.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: killed whole below
    )


def _url(data_dir: Path, timeout: float) -> str:
    ready = data_dir / "serve.json"
    wait_for(ready.exists, timeout, f"{ready}")
    return str(json.loads(ready.read_text())["url"])


def test_a_standby_server_takes_the_journal_over_when_the_active_one_is_killed(
    tmp_path: Path, pg_schema_url: str
) -> None:
    active = _serve(tmp_path / "active", pg_schema_url)
    standby = None
    try:
        active_url = _url(tmp_path / "active", 60)
        standby = _serve(tmp_path / "standby", pg_schema_url)
        standby_url = _url(tmp_path / "standby", 60)  # its API is up at once
        time.sleep(3)  # longer than the lease: the active one keeps renewing it
        assert standby.poll() is None
        assert _http(standby_url + "healthz")["ok"] is True  # alive...
        # ...not driving the journal, yet its API serves: requests, the feed
        # and the store's marks go through the database to the active engine.
        assert _readiness(standby_url) == (200, "1 engine(s) elsewhere")
        assert _readiness(active_url) == (200, None)
        log = (tmp_path / "standby.log").read_text()
        assert "pgwal.waiting" in log
        answer = _http(standby_url + "api/runs", {"plan": NAPS})  # run by the active engine
        run_id = answer["run_id"]
        _http(active_url + f"api/runs/{run_id}?min_seq={answer['seq']}")
        time.sleep(0.5)  # the first nap is under way
        os.killpg(active.pid, signal.SIGKILL)
        active.wait(timeout=10)
        # The lease, then the engine's start and replay: about 3 s on an idle
        # machine (how soon is a figure for bench/, not an assertion here).
        wait_for(
            lambda: _readiness(standby_url) == (200, None), 60, "the standby's own engine ready"
        )

        def finished() -> bool:
            return _http(standby_url + f"api/runs/{run_id}")["status"] == "succeeded"

        wait_for(finished, 30, "the run to finish on the standby")
        report = _http(standby_url + f"api/runs/{run_id}/verify", {})
        assert report["identical"] is True, report
    finally:
        if active.poll() is None:
            os.killpg(active.pid, signal.SIGKILL)
        if standby is not None and standby.poll() is None:
            standby.send_signal(signal.SIGTERM)
            assert standby.wait(timeout=60) == 0
