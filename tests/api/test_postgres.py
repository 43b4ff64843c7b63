"""The API over a PostgreSQL store (the engine projects into it, the API reads it).

Skipped unless PostgreSQL is reachable (``TIFFANY_TEST_POSTGRES_URL``);
``TIFFANY_REQUIRE_SERVICES=1`` makes it mandatory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from api_support import (
    SLEEP_PLAN,
    make_settings,
    read_your_writes,
    short_dir,
    start_engine,
    wait_until,
)
from fastapi.testclient import TestClient
from sqlalchemy import text

from tiffany.api import create_app
from tiffany.store import make_engine


@contextlib.contextmanager
def _served(pg_schema_url: str) -> Iterator[tuple[TestClient, Path]]:
    """An engine projecting into ``pg_schema_url`` and a client of an API reading it."""
    data_dir = short_dir("tfp-")
    engine = start_engine(data_dir, env_extra={"TIFFANY_DATABASE_URL": pg_schema_url})
    try:
        app = create_app(make_settings(data_dir, database_url=pg_schema_url))
        with TestClient(app) as client:
            yield client, data_dir
    finally:
        engine.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_runs_through_postgres(pg_schema_url: str) -> None:
    with _served(pg_schema_url) as (client, data_dir):
        r = client.post("/api/runs", json={"plan": SLEEP_PLAN})
        assert r.status_code == 201, r.text
        run_id, seq = r.json()["run_id"], r.json()["seq"]
        at_once = client.get(f"/api/runs/{run_id}", params={"min_seq": seq})
        assert at_once.status_code == 200, at_once.text  # no retry: the seq says when
        wait_until(
            lambda: client.get(f"/api/runs/{run_id}").json()["status"] == "succeeded",
            timeout=30,
        )
        listed = client.get("/api/runs").json()
        assert [x["run_id"] for x in listed["runs"]] == [run_id]
        assert listed["counts"]["succeeded"] == 1
        events = client.get(f"/api/runs/{run_id}/events").json()
        assert events["records"][0]["type"] == "RUN_START"
        assert 'tiffany_runs{status="succeeded"} 1.0' in client.get("/metrics").text
        assert not (data_dir / "tiffany.db").exists()  # nothing fell back to SQLite


def test_reads_with_min_seq_never_404_through_postgres(pg_schema_url: str) -> None:
    """200 submissions, each read back at once with its seq, through PostgreSQL."""
    with _served(pg_schema_url) as (client, _):
        assert read_your_writes(client, 200) == [200] * 200


def test_reads_go_on_when_the_server_drops_the_connections(pg_schema_url: str) -> None:
    """The API and the projector use no ping per checkout: a dropped connection is retried.

    The sessions dropped are this test's only (its ``application_name``):
    others may run beside it on the same database (pytest-xdist).
    """
    name = f"tiffany-test-{uuid.uuid4().hex[:12]}"
    url = f"{pg_schema_url}&application_name={name}"
    mine = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = :name AND pid <> pg_backend_pid()"
    )
    admin = make_engine(pg_schema_url)
    try:
        with _served(url) as (client, _):
            r = client.post("/api/runs", json={"plan": SLEEP_PLAN})
            run_id, seq = r.json()["run_id"], r.json()["seq"]
            assert client.get(f"/api/runs/{run_id}", params={"min_seq": seq}).status_code == 200
            # As a server restart or an idle timeout would: every session of the
            # API's and the projector's (the projector reconnects: no ping, its retry).
            for _round in range(2):
                with admin.connect() as conn:
                    dropped = conn.execute(text(mine), {"name": name}).scalar()
                assert dropped >= 1
                for _ in range(3):
                    again = client.get(f"/api/runs/{run_id}")
                    assert again.status_code == 200, again.text
                    assert again.json()["run_id"] == run_id
                r = client.post("/api/runs", json={"plan": SLEEP_PLAN})
                assert r.status_code == 201, r.text
                later = client.get(r.headers["location"])
                assert later.status_code == 200, later.text
    finally:
        admin.dispose()


def test_serves_runs_from_the_postgres_journal_across_a_restart(pg_schema_url: str) -> None:
    """TIFFANY_JOURNAL=postgres: the engine journals into the database, no WAL file."""
    data_dir = short_dir("tfj-")
    env = {"TIFFANY_DATABASE_URL": pg_schema_url, "TIFFANY_JOURNAL": "postgres"}
    engine = start_engine(data_dir, env_extra=env)
    try:
        app = create_app(make_settings(data_dir, database_url=pg_schema_url))
        with TestClient(app) as client:
            r = client.post("/api/runs", json={"plan": SLEEP_PLAN})
            assert r.status_code == 201, r.text
            first, seq = r.json()["run_id"], r.json()["seq"]
            assert client.get(f"/api/runs/{first}", params={"min_seq": seq}).status_code == 200
            wait_until(
                lambda: client.get(f"/api/runs/{first}").json()["status"] == "succeeded",
                timeout=30,
            )
            verified = client.post(f"/api/runs/{first}/verify")
            assert verified.status_code == 200, verified.text
            assert verified.json()["ok"] is True
        engine.stop()  # a clean stop gives the stream's lease back: the restart takes it at once
        engine = start_engine(data_dir, env_extra=env)
        journal = engine.call("status")["journal"]
        assert (journal["backend"], journal["stream"], journal["epoch"]) == ("postgres", "main", 2)
        assert journal["fenced"] is False
        with TestClient(app) as client:
            r = client.post("/api/runs", json={"plan": SLEEP_PLAN})
            assert r.status_code == 201, r.text
            second, seq2 = r.json()["run_id"], r.json()["seq"]
            assert seq2 > seq  # the stream's seq goes on from its head
            assert client.get(f"/api/runs/{second}", params={"min_seq": seq2}).status_code == 200
            wait_until(
                lambda: client.get(f"/api/runs/{second}").json()["status"] == "succeeded",
                timeout=30,
            )
            listed = {x["run_id"] for x in client.get("/api/runs").json()["runs"]}
            assert listed == {first, second}
    finally:
        engine.stop()
        assert not list((data_dir / "wal").glob("*.wal"))  # nothing fell back to the file WAL
        shutil.rmtree(data_dir, ignore_errors=True)
    store = make_engine(pg_schema_url)
    with store.connect() as conn:
        head, epoch = conn.execute(text("SELECT head, epoch FROM wal_streams")).one()
        records = conn.execute(text("SELECT count(*) FROM wal_records")).scalar()
    store.dispose()
    assert (epoch, records) == (2, head)
    assert head >= seq2


TWO_NAPS = {
    "name": "two-naps",
    "steps": [
        {"id": "first", "tool": "sleep", "args": {"seconds": 1.0}},
        {"id": "second", "tool": "sleep", "args": {"seconds": 0.5}, "after": ["first"]},
    ],
}


def _run_status(url: str, run_id: str) -> str | None:
    store = make_engine(url)
    try:
        with store.connect() as conn:
            return conn.execute(
                text("SELECT status FROM runs WHERE run_id = :r"), {"r": run_id}
            ).scalar()
    finally:
        store.dispose()


def test_a_paused_engine_is_fenced_and_steps_down_when_another_takes_its_stream(
    pg_schema_url: str,
) -> None:
    """SIGSTOP past the lease, a second engine takes the stream over, SIGCONT: the fence holds."""
    env = {
        "TIFFANY_DATABASE_URL": pg_schema_url,
        "TIFFANY_JOURNAL": "postgres",
        "TIFFANY_JOURNAL_LEASE_S": "2",
    }
    first_dir, second_dir = short_dir("tfa-"), short_dir("tfb-")
    first = start_engine(first_dir, env_extra=env)
    second = None
    try:
        run_id = first.call("submit", plan=TWO_NAPS, inputs={}, key=None)["run_id"]
        time.sleep(0.4)  # the first nap is under way
        os.kill(first.proc.pid, signal.SIGSTOP)
        try:
            # It waits out the paused engine's lease, then replays and finishes the run.
            second = start_engine(second_dir, env_extra=env)
            wait_until(lambda: _run_status(pg_schema_url, run_id) == "succeeded", timeout=30)
        finally:
            os.kill(first.proc.pid, signal.SIGCONT)
        code = first.proc.wait(timeout=30)  # it finds its lease gone and steps down
        log_text = first.log()
        # Its next commit was fenced, or its heartbeat found the lease gone first.
        assert '"reason": "fenced"' in log_text or "engine.lease_lost" in log_text, log_text[-3000:]
        assert code == 1  # stepped down: not a clean stop
        report = second.call("verify", run_id=run_id)
        assert report["identical"] is True, report
    finally:
        if second is not None:
            second.stop()
        if first.proc.poll() is None:
            first.stop()
        shutil.rmtree(first_dir, ignore_errors=True)
        shutil.rmtree(second_dir, ignore_errors=True)
    store = make_engine(pg_schema_url)
    with store.connect() as conn:
        head, epoch = conn.execute(text("SELECT head, epoch FROM wal_streams")).one()
        seqs = [r[0] for r in conn.execute(text("SELECT seq FROM wal_records ORDER BY seq"))]
    store.dispose()
    assert epoch == 2  # taken over once; the paused engine never took it back
    assert seqs == list(range(1, head + 1))  # one writer at a time: gapless, no seq twice


#: A plan whose rows hold JSON in the detail's columns: the run's entry, inputs
#: and outputs, a step's output and attempts, a task's result.
JSON_PLAN = {
    "name": "shapes",
    "inputs": {"who": "world", "n": 3},
    "steps": [
        {"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}},
        {
            "id": "note",
            "tool": "file.write",
            "after": ["nap"],
            "args": {"path": "out.txt", "content": "hello ${inputs.who}"},
        },
    ],
}


def test_the_loops_read_of_a_run_is_the_threads_read(pg_schema_url: str) -> None:
    """``GET /api/runs/{id}`` on PostgreSQL reads on the event loop: the same detail as a thread."""
    import asyncio

    from sqlalchemy.orm import Session

    from tiffany.ports.reads import PgReads
    from tiffany.store import queries

    store = make_engine(pg_schema_url)
    try:
        with _served(pg_schema_url) as (client, _):
            assert isinstance(client.app.state.tiffany.reads, PgReads)  # the route's: the loop's
            r = client.post("/api/runs", json={"plan": JSON_PLAN, "inputs": {"n": 4}})
            assert r.status_code == 201, r.text
            run_id, seq = r.json()["run_id"], r.json()["seq"]
            detail = f"/api/runs/{run_id}"
            served = wait_until(  # with min_seq: never a 404 for the run just submitted
                lambda: (
                    (d := client.get(detail, params={"min_seq": seq}).json())["status"]
                    == "succeeded"
                    and d
                ),
                timeout=30,
            )
            missing = client.get("/api/runs/run-000000000000")
            assert missing.status_code == 404, missing.text

            served_lean = client.get(detail, params={"outputs": "false"}).json()

        with Session(store) as session:
            threaded = queries.run_detail_of(session, run_id)
            threaded_lean = queries.run_detail_of(session, run_id, outputs=False)

        async def on_the_loop() -> tuple[object, object, object]:
            reads = PgReads(pg_schema_url)  # the port's read, outside the app
            try:
                found = await reads.run_detail(run_id)
                lean = await reads.run_detail(run_id, outputs=False)
                none = await reads.run_detail("run-nope")
            finally:
                await reads.close()
            return found, lean, none

        looped, looped_lean, nothing = asyncio.run(on_the_loop())
        assert threaded is not None
        assert looped == threaded
        assert nothing is None
        assert served == threaded
        # Without outputs, on every path: the values left out, their sizes there.
        assert looped_lean == threaded_lean == served_lean
        assert threaded_lean is not None
        lean_steps = {s["step_id"]: s for s in threaded_lean["steps"]}
        assert lean_steps["note"]["output"] is None
        assert lean_steps["note"]["output_size"] > 0
        assert all(t["result"] is None for t in threaded_lean["tasks"])
        steps = {s["step_id"]: s for s in threaded["steps"]}
        assert steps["note"]["status"] == "succeeded"
        assert isinstance(steps["note"]["attempts"], list)
        assert len(steps["note"]["attempts"]) == 1
        assert threaded["inputs"] == {"who": "world", "n": 4}
    finally:
        store.dispose()


def test_a_store_the_loop_cannot_reach_answers_503(tmp_path: object) -> None:
    """A PostgreSQL store that refuses connections: the read is a 503 naming the store."""
    from api_support import free_port

    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere"
    app = create_app(make_settings(short_dir("tfp-"), database_url=url))
    with TestClient(app) as client:
        r = client.get("/api/runs/run-000000000000")
    assert r.status_code == 503, r.text
    assert r.json()["message"] == "the store cannot be read"
    # the driver's words (the server's host, port, user) stay in the API's log
    assert "127.0.0.1" not in r.text
    assert "postgres" not in r.text
