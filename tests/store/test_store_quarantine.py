"""Nothing journaled stops the store: failing records are quarantined, transient errors retried.

On the old code a record that failed (RecursionError on deep values, a
constraint, an undecodable payload) was retried forever, on every restart:
the store stopped there and every later run was missing.
"""

from __future__ import annotations

import io
import json
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from store_support import Journal, dump, get_json, serve, wait_for

from tiffany.cli.db import rebuild_store
from tiffany.projector import Projector
from tiffany.projector.apply import is_transient
from tiffany.projector.fold import RowFold
from tiffany.projector.pgflush import MarkMoved
from tiffany.projector.rows import Batch
from tiffany.projector.tail import journal_id
from tiffany.store import RecordType, queries, session_factory
from tiffany.wire.records import RunEnd, RunStart, Spawn, TaskExit


def _fail_at(monkeypatch: pytest.MonkeyPatch, seq: int, exc: Exception) -> None:
    real = RowFold.apply

    def apply(self: RowFold, conn: Any, b: Any, s: int, *rest: Any) -> bool:
        if s == seq:
            raise exc
        return real(self, conn, b, s, *rest)

    monkeypatch.setattr(RowFold, "apply", apply)


def test_a_record_that_fails_is_quarantined_and_the_rest_projected(
    store: Engine, journal: Journal, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    records = journal.records
    bad = next(r for r in records[len(records) // 2 :] if r[1] == RecordType.SPAWN)
    _fail_at(monkeypatch, bad[0], TypeError("a bug in one handler"))
    projector = Projector(store, journal_id(journal.wal_dir))  # as the projector process claims it
    report = projector.apply(records)
    assert report.quarantined == [bad[0]]
    assert projector.last_seq == records[-1][0]
    assert projector.dead_letters == 1
    rows = dump(store)
    assert len(rows["runs"]) == len(journal.run_ids)
    (letter,) = rows["dead_letters"]
    assert (letter["seq"], letter["rtype"]) == (bad[0], "SPAWN")
    assert letter["error"] == "TypeError: a bug in one handler"
    assert letter["run_id"] in journal.run_ids.values()
    assert letter["excerpt"]
    with session_factory(store)() as session:  # later runs finished in the store
        assert {r.status for r in queries.list_runs(session)} >= {"succeeded", "failed"}
    # A rebuild quarantines the same record: the stores are the same row for row.
    report2 = rebuild_store(store, journal.wal_dir, batch_records=13)
    assert report2.quarantined == [bad[0]]
    assert dump(store) == rows


def test_transient_errors_are_retried_and_lose_nothing(
    store: Engine, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiffany.projector import process as projector_proc

    clean = Projector(store)
    clean.apply(journal.records)
    expected = dump(store)
    clean.reset()

    failures = {"left": 3}
    real_flush = Batch.flush

    def flaky(self: Batch, conn: Any, *moved: Any) -> int:
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("INSERT ...", {}, ConnectionResetError("server closed"))
        return real_flush(self, conn, *moved)

    monkeypatch.setattr(Batch, "flush", flaky)
    monkeypatch.setattr(projector_proc, "make_engine", lambda _url, **_kw: store)
    out = io.StringIO()
    applier = projector_proc._Applier("unused", out)
    applier.engine = store
    applier.projector = Projector(store)
    monkeypatch.setattr(store, "dispose", lambda: None)  # the applier drops its engine on errors
    applier.apply(list(journal.records))
    reports = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["consecutive_errors"] for r in reports] == [1, 2, 3, 0]
    assert "OperationalError" in reports[0]["last_error"]
    assert reports[-1]["last_seq"] == journal.records[-1][0]
    assert reports[-1]["dead_letters"] == 0
    assert dump(store) == expected

    # A record that does not decode: quarantined, listed in the progress report,
    # and the engine's link hands it on (the engine publishes store.quarantined).
    from tiffany.projector.link import ProjectorLink
    from tiffany.projector.tail import decode_record

    seq = journal.records[-1][0] + 1
    run_no, fields = decode_record(
        RecordType.DISPATCH, (1).to_bytes(4, "little") + b"\xc1 not msgpack"
    )
    out.truncate(0)
    out.seek(0)
    applier.apply([(seq, RecordType.DISPATCH, run_no, fields)])
    line = out.getvalue().splitlines()[-1]
    assert json.loads(line)["quarantined"] == [seq]
    seen: list[tuple[list[int], int]] = []
    link = ProjectorLink(Path("unused"), {})
    link.on_quarantine = lambda seqs, total: seen.append((seqs, total))
    link._read_reports(io.BytesIO(line.encode() + b"\n"))
    assert seen == [([seq], 1)]
    assert link.health()["dead_letters"] == 1


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_values_sql_cannot_store_are_sanitized_not_fatal(store: Engine, journal: Journal) -> None:
    last = journal.records[-1][0]
    entry = {
        "kind": "plan",
        "plan": {
            "name": "odd\x00name\udc80",
            "steps": [{"id": "s\x00", "tool": "sleep", "args": {"deep": _deep(5000)}}],
        },
        "inputs": {
            "big": 2**100,
            "huge": 10**5000,
            "nul": "a\x00b",
            "lone": "\ud800",
            "nan": 1e999,
        },
    }
    odd = [
        (last + 1, RecordType.RUN_START, 900, RunStart("run-odd", "odd\x00\udc80", entry, 1.0)),
        (last + 2, RecordType.SPAWN, 900, Spawn(1, 1, 0, "planner\x00", "planner")),
        (last + 3, RecordType.TASK_EXIT, 900, TaskExit(2, 1, "done", {"out": _deep(3000)})),
        (last + 4, RecordType.RUN_END, 900, RunEnd("succeeded", {"outputs": {"x": "\udcff"}}, 2.0)),
    ]
    projector = Projector(store)
    report = projector.apply([*journal.records, *odd])
    assert report.quarantined == []
    with session_factory(store)() as session:
        run = queries.get_run(session, "run-odd")
        assert run is not None
        assert run.status == "succeeded"
        assert run.name == "odd\\x00\\udc80"
        assert run.inputs["big"] == str(2**100)
        assert run.inputs["huge"] == "<int of 16610 bits>"
        assert run.inputs["nul"] == "a\\x00b"
        assert run.inputs["nan"] == "inf"
        assert run.steps[0].step_id == "s\\x00"


def test_an_undecodable_record_is_dead_lettered_and_serve_says_so(tmp_path: Path) -> None:
    from tiffany.agents import AgentEnv, plan_entry
    from tiffany.agents.registry import ToolRegistry
    from tiffany.durable import Runtime
    from tiffany.wal import Wal
    from tiffany.workflows import workflow_resolver

    data = tmp_path / "data"
    plan = {"name": "nap", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}
    env = AgentEnv(ToolRegistry.default(enabled=["sleep"]), data / "workspaces")
    with Runtime(data, resolvers={"workflow": workflow_resolver(env)}) as rt:
        before = rt.submit_entry(plan_entry(plan), name="before")
        rt.run()
    wal = Wal.open(data / "wal")
    garbage = wal.append(RecordType.DISPATCH, (1).to_bytes(4, "little") + b"\xc1 not msgpack")
    wal.commit()
    wal.close()

    proc, url = serve(data)
    try:
        body = json.dumps({"plan": {**plan, "name": "after"}})
        req = urllib.request.Request(
            url + "api/runs", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            after = json.loads(resp.read())["run_id"]

        def both_done() -> bool:
            runs = get_json(url + "api/runs")[1]["runs"]
            return {r["run_id"] for r in runs if r["status"] == "succeeded"} == {before, after}

        wait_for(both_done, 60, "both runs in the store")
        status, ready = wait_for(lambda: get_json(url + "readyz"), 30, "readyz")
        assert status == 200, ready
        assert ready["store"]["dead_letters"] == 1
        assert ready["store"]["stalled"] is False
        with urllib.request.urlopen(url + "metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert "tiffany_projector_dead_letters 1.0" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    import sqlite3

    db = sqlite3.connect(data / "tiffany.db")
    rows = db.execute("select seq, run_no, rtype, error from dead_letters").fetchall()
    assert len(rows) == 1
    assert rows[0][:3] == (garbage, 1, "DISPATCH")
    assert "DecodeError" in rows[0][3]


def test_what_is_retried_and_what_is_quarantined() -> None:
    from sqlalchemy.exc import DataError, IntegrityError, InternalError, ProgrammingError

    from tiffany.projector.apply import is_transient

    cause = Exception("x")
    for exc in (
        OperationalError("SELECT", {}, cause),  # connection lost, database locked
        ProgrammingError("SELECT", {}, cause),  # a missing column, permission denied
        InternalError("SELECT", {}, cause),
        ConnectionRefusedError(),
    ):
        assert is_transient(exc), exc
    for exc in (
        IntegrityError("INSERT", {}, cause),
        DataError("INSERT", {}, cause),
        RecursionError(),
        TypeError(),
        ValueError(),
        KeyError("k"),
    ):
        assert not is_transient(exc), exc


def test_a_second_projector_on_the_same_rows_never_applies_a_record_twice(
    store: Engine, journal: Journal
) -> None:
    """Two projectors of one engine's rows: whichever writes second skips what the first wrote.

    On PostgreSQL a batch moves the mark from the value its projector read
    (a compare-and-set in the batch's one statement): a projector whose mark
    is stale writes nothing and fails transiently, then reads the mark again
    and applies only the records after it. On SQLite the mark is read at the
    start of each batch's transaction.
    """
    records = journal.records
    third = len(records) // 3
    first = Projector(store)
    assert first.apply(records[:third]).applied == third
    # A second one (it loads the runs the first projected) moves the mark
    # past what the first believes.
    second = Projector(store)
    assert second.apply(records[: 2 * third]).skipped == third
    assert second.last_seq == records[2 * third - 1][0]
    if store.dialect.name == "postgresql":  # stale: it writes nothing, and says so
        with pytest.raises(MarkMoved) as stale:
            first.apply(records)
        assert is_transient(stale.value)
        assert first.last_seq == second.last_seq  # nothing of the stale batch was kept
    report = first.apply(records)  # PostgreSQL: the retry, with the mark read again
    assert report.skipped == 2 * third
    assert report.applied + report.orphans == len(records) - 2 * third
    assert report.quarantined == []
    assert first.last_seq == second.last_seq == records[-1][0]
    rows = dump(store)
    assert len(rows["journal_records"]) == len(records)
    assert len(rows["runs"]) == len(journal.run_ids)
    # The same rows as one projector that applied the journal once.
    clean = Projector(store)
    clean.reset()
    clean.apply(records)
    assert dump(store) == rows
