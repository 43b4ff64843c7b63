"""Requests through the database (``TIFFANY_JOURNAL=postgres``): API replicas with no engine socket.

Real processes on loopback and the local PostgreSQL: one engine on a data
dir of its own, two API processes on two other data dirs (no engine, no
socket to reach one). Submissions with idempotency keys go to both
replicas at once while one replica is killed with SIGKILL and started
again; every key ends as exactly one run, every run succeeds, a repeated
key answers the first run from either replica and a changed body is
refused. A run is cancelled through the replica that did not submit it.
The replica with no engine is ready and shows the engine's live feed and
its own reads at ``min_seq`` through the database. In-process: a
submission no engine takes is withdrawn (503, nothing starts later), and
an engine that died between its commit and its answer has its rows
settled by the next holder of its stream.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from api_support import LONG_PLAN, clean_env, short_dir, start_engine
from process_support import terminate, wait_for
from websockets.sync.client import connect

from tiffany.errors import EngineUnavailable
from tiffany.wal.pg import conninfo

PLAN = {"name": "keyed", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.05}}]}


def _api(data_dir: Path, url: str) -> tuple[subprocess.Popen[bytes], str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    ready = data_dir / "api.json"
    ready.unlink(missing_ok=True)
    env = clean_env() | {
        "TIFFANY_DATA_DIR": str(data_dir),
        "TIFFANY_DATABASE_URL": url,
        "TIFFANY_JOURNAL": "postgres",
        "TIFFANY_PORT": "0",
        "TIFFANY_LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiffany", "api", "--ready-file", str(ready)],
        stdout=(data_dir / "api.log").open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    wait_for(ready.exists, 60, f"{ready}")
    return proc, str(json.loads(ready.read_text())["url"])


def _post(url: str, body: Any, key: str | None = None) -> tuple[int, Any]:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def test_two_api_replicas_without_an_engine_socket_lose_and_duplicate_nothing(
    pg_schema_url: str,
) -> None:
    engine_dir, a_dir, b_dir = short_dir("tfq-e-"), short_dir("tfq-a-"), short_dir("tfq-b-")
    env = {"TIFFANY_DATABASE_URL": pg_schema_url, "TIFFANY_JOURNAL": "postgres"}
    engine = start_engine(engine_dir, env_extra=env)
    a, a_url = _api(a_dir, pg_schema_url)
    b, b_url = _api(b_dir, pg_schema_url)
    urls = {"a": a_url, "b": b_url}
    answers: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def submit_all(keys: list[str], first: str) -> None:
        for i, key in enumerate(keys):
            order = [first, "b" if first == "a" else "a"] if i % 2 == 0 else [first]
            while True:  # a client retries with the same key until one replica answers
                for name in order:
                    try:
                        status, body = _post(urls[name] + "api/runs", {"plan": PLAN}, key)
                    except (OSError, http.client.HTTPException):
                        # That replica is down (killed, restarting), or died
                        # mid-answer (IncompleteRead): retry with the same key.
                        continue
                    if status in (200, 201):
                        with lock:
                            answers[key] = body
                        break
                    assert status == 503, body
                else:
                    time.sleep(0.05)
                    continue
                break

    try:
        keys = [f"key-{i}" for i in range(60)]
        threads = [
            threading.Thread(target=submit_all, args=(keys[0::2], "a")),
            threading.Thread(target=submit_all, args=(keys[1::2], "b")),
        ]
        for t in threads:
            t.start()
        wait_for(lambda: len(answers) >= 15, 60, "the first answers")
        a.send_signal(signal.SIGKILL)  # replica a dies mid-stream
        a.wait()
        a, urls["a"] = _api(a_dir, pg_schema_url)  # ... and comes back on another port
        for t in threads:
            t.join(120)
        assert set(answers) == set(keys)
        run_ids = {body["run_id"] for body in answers.values()}
        assert len(run_ids) == len(keys)  # one run a key: none lost, none twice
        # The engine started exactly these runs, each once.
        wait_for(
            lambda: _get(f"{urls['b']}api/runs?limit=500")["counts"]["succeeded"] >= len(keys),
            60,
            "every run to succeed",
        )
        with psycopg.connect(conninfo(pg_schema_url)) as conn:
            started = conn.execute(
                "SELECT count(*), count(DISTINCT run_id) FROM runs WHERE name = 'keyed'"
            ).fetchone()
        assert started == (len(keys), len(keys))
        # A repeated key answers the first run, from either replica; another body is refused.
        again = _post(urls["a"] + "api/runs", {"plan": PLAN}, "key-7")
        assert again[0] == 200
        assert again[1]["run_id"] == answers["key-7"]["run_id"]
        assert again[1]["created"] is False
        other = _post(urls["b"] + "api/runs", {"plan": {**PLAN, "name": "other"}}, "key-7")
        assert other[0] == 409, other
        # A run's command reaches its engine from a replica that never saw the run.
        status, long = _post(urls["a"] + "api/runs", {"plan": LONG_PLAN})
        assert status == 201, long
        wait_for(
            lambda: (
                _get(f"{urls['b']}api/runs/{long['run_id']}?min_seq={long['seq']}")["status"]
                == "running"
            ),
            30,
            "the long run to run",
        )
        status, cancelled = _post(f"{urls['b']}api/runs/{long['run_id']}/cancel", {})
        assert status == 202, cancelled
        wait_for(
            lambda: _get(f"{urls['a']}api/runs/{long['run_id']}")["status"] == "cancelled",
            30,
            "the cancel",
        )
        unknown = _post(f"{urls['b']}api/runs/run-nope/cancel", {})
        assert unknown[0] == 404
        # Its export too: the engine reads its journal, the answer rides the request row.
        from tiffany.durable.export import parse_export

        export_url = f"{urls['b']}api/runs/{long['run_id']}/export"
        with urllib.request.urlopen(export_url, timeout=30) as resp:
            exported = parse_export(resp.read())
        assert exported.meta.run_id == long["run_id"]
        assert exported.meta.status == "cancelled"
        assert exported.meta.journal == "postgres:main"
        # A replica with no engine beside it: ready, its feed shows the engine's
        # events, and its min_seq reads wait for the store's notified mark.
        assert _get(urls["b"] + "readyz")["reason"] == "1 engine(s) elsewhere"
        with connect(urls["b"].replace("http", "ws", 1) + "ws/activity") as ws:
            status, watched = _post(urls["a"] + "api/runs", {"plan": PLAN})
            assert status == 201, watched
            run = _get(f"{urls['b']}api/runs/{watched['run_id']}?min_seq={watched['seq']}")
            assert run["run_id"] == watched["run_id"]
            kinds: list[str] = []
            deadline = time.monotonic() + 30
            while "run.finished" not in kinds and time.monotonic() < deadline:
                try:
                    frame = json.loads(ws.recv(timeout=1))
                except TimeoutError:
                    continue
                for event in frame if isinstance(frame, list) else [frame]:
                    if event.get("run_id") == watched["run_id"]:
                        kinds.append(event["kind"])
            assert kinds[0] == "run.started"
            assert kinds[-1] == "run.finished"
    finally:
        for proc in (a, b):
            terminate(proc)
        engine.stop()


def test_a_submission_no_engine_takes_is_withdrawn(pg_migrated_url: str) -> None:
    from tiffany.ports.commands_pg import DbRequests

    async def main() -> float:
        db = DbRequests(pg_migrated_url, submit_wait_s=0.3)
        db.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(EngineUnavailable, match="withdrawn: nothing started"):
                await db.submit(PLAN, {}, "lonely")
        finally:
            await db.close()
        return time.monotonic() - t0

    assert asyncio.run(main()) < 5
    with psycopg.connect(conninfo(pg_migrated_url)) as conn:
        rows = conn.execute("SELECT state FROM engine_requests").fetchall()
    assert rows == [("withdrawn",)]  # no engine claims it later (claims take 'pending' only)


def test_rows_an_engine_claimed_and_never_answered_are_settled(pg_migrated_url: str) -> None:
    from tiffany.engine.db_requests import RequestClaimer

    with psycopg.connect(conninfo(pg_migrated_url), autocommit=True) as conn:
        for run_id in ("run-journaled", "run-lost"):
            conn.execute(
                "INSERT INTO engine_requests (op, engine, run_id, body, state, created_at) "
                "VALUES ('submit', 0, %s, '{}', 'claimed', 0)",
                (run_id,),
            )
    claimer = RequestClaimer(pg_migrated_url, 0, lambda: ("main", 1), lambda r: {})
    assert claimer.settle({"run-journaled": 42}) == 2
    with psycopg.connect(conninfo(pg_migrated_url)) as conn:
        rows = dict(conn.execute("SELECT run_id, state FROM engine_requests").fetchall())
        answer = conn.execute(
            "SELECT answer FROM engine_requests WHERE run_id = 'run-journaled'"
        ).fetchone()
    assert rows == {"run-journaled": "done", "run-lost": "pending"}
    assert answer is not None
    value = json.loads(answer[0]) if isinstance(answer[0], str) else answer[0]
    assert value == {"run_id": "run-journaled", "created": True, "seq": 42}


def test_an_engine_of_the_apis_own_data_dir_is_not_an_engine_elsewhere(
    pg_migrated_url: str,
) -> None:
    """A lease held by this data dir's engine (noted there) does not make its API ready.

    That engine has taken its stream but does not listen yet (the window of
    a ``serve`` start): counted as an engine elsewhere, the API said ready
    and its first submissions waited for an engine still starting.
    """
    from tiffany.wal.pg import PgLog, new_owner
    from tiffany.wire.shards import note_owner, owners_here

    here, there = short_dir("tfq-h-"), short_dir("tfq-t-")
    owner = new_owner()
    note = note_owner(here, owner)
    assert owners_here(here) == [owner]
    stream = PgLog.open(pg_migrated_url, "main", lease_s=5.0, owner=owner)
    apis = []
    try:
        here_api, here_url = _api(here, pg_migrated_url)
        apis.append(here_api)
        there_api, there_url = _api(there, pg_migrated_url)
        apis.append(there_api)
        with psycopg.connect(conninfo(pg_migrated_url)) as conn:
            held = conn.execute("SELECT owner FROM wal_streams WHERE stream = 'main'").fetchone()
        assert held == (owner,)

        def readiness(url: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(url + "readyz", timeout=10) as resp:
                    return resp.status, json.loads(resp.read())["reason"]
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())["reason"]

        # The other data dir's API: an engine elsewhere holds its stream.
        wait_for(lambda: readiness(there_url) == (200, "1 engine(s) elsewhere"), 30, "ready")
        # Its own: the engine is here, and not answering.
        assert readiness(here_url) == (503, "engine unreachable")
        note.unlink()  # an engine of another data dir on this host, say
        assert readiness(here_url) == (200, "1 engine(s) elsewhere")
    finally:
        for proc in apis:
            terminate(proc)
        stream.close()
