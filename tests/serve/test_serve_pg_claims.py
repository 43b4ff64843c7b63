"""Submissions around a SIGSTOP of the engine, on the PostgreSQL journal: answered once, run once.

Real processes on loopback and the local PostgreSQL (``pg_migrated_url``),
``tiffany serve`` with a 2 s lease, submissions over HTTP with an
``Idempotency-Key`` (retried with it, as the SDK and the soak do):

* The engine paused while no engine can take a submission: the API
  withdraws it after 10 s (503, nothing started). Retried with its key once
  the engine is back, it is submitted again and answered: the key was a
  dead end before (every retry found the withdrawn row: 503 for the rest
  of the idempotency window; the soak's "no answer in 300 s of retries").
* The engine paused with a claim of the submission in flight (its claim
  statement waits on a lock the test holds; the claim commits while the
  engine is stopped), past its lease, then continued: it answers it.
* The engine paused with the submission's RUN_START commit in flight, past
  its lease, while a second server is started: its engine takes the
  stream over and answers the submission from the journal; the paused
  engine, continued, is fenced and restarted.

Each ends with the key retried once more (the first run, ``created:
false``) and one RUN_START in the journal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from process_support import alive, serve_json, terminate, wait_for

from tiffany.config import conninfo

PLAN = {"name": "claimed", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}
KEY = "claimed-1"
LEASE_S = 2
#: The API's wait for an engine to take a submission, but in the withdrawal's
#: own test (10 s, the default): a pause test takes its lock, waits for the
#: engine's statement to block on it and stops the engine while the API
#: holds the submission, which on a loaded CI host took longer than 10 s;
#: the API then withdrew the row, and the claim it was pausing found nothing.
ENGINE_WAIT_S = 300.0
_NOW = "extract(epoch from clock_timestamp())"


class _Servers:
    """A test's ``tiffany serve`` processes on one PostgreSQL journal, all stopped at its end."""

    def __init__(self, base: Path, url: str) -> None:
        self.base, self.url, self.dsn = base, url, conninfo(url)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: list[int] = []

    def start(self, name: str, engine_wait_s: float = ENGINE_WAIT_S) -> str:
        """Start a server; its URL once ``serve.json`` is there (the API is up).

        ``engine_wait_s``: how long its API lets a submission wait for an
        engine before withdrawing it (``TIFFANY_ENGINE_WAIT_S``).
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
        env |= {
            "TIFFANY_LOG_FORMAT": "json",
            "TIFFANY_DATABASE_URL": self.url,
            "TIFFANY_JOURNAL": "postgres",
            "TIFFANY_JOURNAL_LEASE_S": str(LEASE_S),
            "TIFFANY_ENGINE_WAIT_S": str(engine_wait_s),
        }
        data = self.base / name
        data.mkdir(parents=True)
        with (self.base / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data), "--port", "0"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.procs[name] = proc

        def up() -> str | None:
            assert proc.poll() is None, f"serve exited {proc.returncode}: {self.log(name)}"
            doc = serve_json(data)
            return str(doc["url"]) if doc else None

        return str(wait_for(up, 120, f"the {name} server"))

    def engine(self, name: str) -> int:
        doc = serve_json(self.base / name)
        assert doc is not None
        return int(doc["engine_pid"])

    def pause(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.paused.append(pid)

    def resume(self, pid: int) -> None:
        os.kill(pid, signal.SIGCONT)
        self.paused.remove(pid)

    def log(self, name: str) -> str:
        return (self.base / f"{name}.log").read_text()[-3000:]

    def stop(self) -> None:
        for pid in self.paused:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
        for proc in self.procs.values():
            terminate(proc)


@pytest.fixture
def servers(tmp_path: Path, pg_migrated_url: str) -> Iterator[_Servers]:
    group = _Servers(tmp_path, pg_migrated_url)
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture
def db(pg_migrated_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(conninfo(pg_migrated_url), autocommit=True) as conn:
        yield conn


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "readyz", timeout=10) as resp:
            return bool(json.loads(resp.read())["ready"])
    except (OSError, ValueError):
        return False


def _submit(url: str, timeout: float = 120) -> tuple[int, Any]:
    """``POST /api/runs`` with the test's key: ``(status, body)``."""
    req = urllib.request.Request(
        url + "api/runs",
        data=json.dumps(PLAN).encode(),
        headers={"content-type": "application/json", "Idempotency-Key": KEY},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _one(db: psycopg.Connection[Any], sql: str, *args: Any) -> Any:
    row = db.execute(sql, args).fetchone()
    return None if row is None else row[0]


def _submitted_in_background(url: str) -> tuple[threading.Thread, list[tuple[int, Any]]]:
    answers: list[tuple[int, Any]] = []
    thread = threading.Thread(target=lambda: answers.append(_submit(url, 300)), daemon=True)
    thread.start()
    return thread, answers


def _pause_at(
    servers: _Servers, db: psycopg.Connection[Any], name: str, table: str, statement: str
) -> tuple[threading.Thread, list[tuple[int, Any]]]:
    """Submit, and pause the engine of ``name`` with its ``statement`` in flight.

    The statement waits on a lock of ``table`` the test holds; the engine is
    stopped, then the lock let go: the statement completes in the database
    while the engine is paused, and the engine has not read its outcome.
    """
    url = str((serve_json(servers.base / name) or {})["url"])
    engine = servers.engine(name)
    with psycopg.connect(servers.dsn) as lock:
        lock.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        posted = _submitted_in_background(url)
        # The request's row first: the claimer's poll runs every second, and a
        # poll that met the lock before the API committed the row would wake
        # to find nothing to claim (the engine paused, the claim never comes).
        # A statement's snapshot is taken once it has its locks, so a waiting
        # poll sees a row committed before the lock is let go.
        wait_for(lambda: _one(db, "SELECT count(*) FROM engine_requests"), 60, "the request's row")
        # Blocked by this lock, not another test's (the database is shared).
        wait_for(
            lambda: _one(
                db,
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE %s = ANY(pg_blocking_pids(pid)) AND query LIKE %s",
                lock.info.backend_pid,
                f"%{statement}%",
            ),
            60,
            f"the engine's {statement!r} to wait on the lock",
        )
        servers.pause(engine)
        lock.rollback()
    return posted


def _answered_once(url: str, db: psycopg.Connection[Any], first: tuple[int, Any]) -> None:
    """The first answer is the run; the key again names it; one RUN_START in the journal."""
    status, answer = first
    assert status == 201, answer
    assert answer["created"] is True
    again = _submit(url)
    assert again == (200, {**answer, "created": False}), again
    assert _one(db, "SELECT count(*) FROM wal_records WHERE rtype = 1") == 1  # RUN_START
    assert _one(db, "SELECT count(*) FROM engine_requests") == 1
    wait_for(
        lambda: _one(db, "SELECT count(*) FROM runs WHERE run_id = %s", answer["run_id"]) == 1,
        60,
        "the run in the store",
    )


def test_a_withdrawn_submission_is_taken_again_when_retried_with_its_key(
    servers: _Servers, db: psycopg.Connection[Any]
) -> None:
    url = servers.start("first", engine_wait_s=10.0)  # the default
    wait_for(lambda: _ready(url), 120, "the engine")
    engine = servers.engine("first")
    servers.pause(engine)
    status, answer = _submit(url)
    assert status == 503, answer  # no engine took it in 10 s: withdrawn, nothing started
    assert _one(db, "SELECT state FROM engine_requests") == "withdrawn"
    servers.resume(engine)
    _answered_once(url, db, _submit(url))


def test_a_claim_in_flight_at_a_pause_past_the_lease_is_answered_once_continued(
    servers: _Servers, db: psycopg.Connection[Any]
) -> None:
    url = servers.start("first")
    wait_for(lambda: _ready(url), 120, "the engine")
    engine = servers.engine("first")
    poster, answers = _pause_at(servers, db, "first", "wal_streams", "SET state = 'claimed'")
    wait_for(lambda: _one(db, "SELECT state FROM engine_requests") == "claimed", 30, "the claim")
    wait_for(
        lambda: _one(db, f"SELECT lease_until < {_NOW} FROM wal_streams"), 30, "the lease to lapse"
    )
    servers.resume(engine)
    poster.join(300)
    _answered_once(url, db, answers[0])
    assert servers.engine("first") == engine  # no one took the stream: it went on


def test_a_commit_in_flight_at_a_pause_is_answered_once_by_the_engine_that_takes_over(
    servers: _Servers, db: psycopg.Connection[Any]
) -> None:
    url = servers.start("first")
    wait_for(lambda: _ready(url), 120, "the engine")
    engine = servers.engine("first")
    poster, answers = _pause_at(servers, db, "first", "wal_records", "INSERT INTO wal_records")
    wait_for(
        lambda: _one(db, "SELECT count(*) FROM wal_records WHERE rtype = 1"), 30, "the RUN_START"
    )
    assert _one(db, "SELECT state FROM engine_requests") == "claimed"
    servers.start("second")  # a standby: its engine takes the lapsed lease
    wait_for(lambda: _one(db, "SELECT epoch FROM wal_streams") > 1, 120, "the takeover")
    poster.join(300)
    servers.resume(engine)
    wait_for(lambda: not alive(engine), 60, "the fenced engine to step down")
    _answered_once(url, db, answers[0])
