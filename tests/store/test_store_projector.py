"""The projector on a real journal, on SQLite and PostgreSQL: rows, idempotency, rebuild."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from sqlalchemy import Engine
from store_support import Journal, dump

from tiffany.cli.db import rebuild_store
from tiffany.projector import Projector
from tiffany.projector.tail import journal_id
from tiffany.store import RecordType, Step, queries, session_factory
from tiffany.wire.records import decode_record


def _project(engine: Engine, journal: Journal) -> Projector:
    projector = Projector(engine)
    report = projector.apply(journal.records)
    assert report.applied == len(journal.records)
    assert report.orphans == 0
    return projector


def _detail(engine: Engine, run_id: str) -> dict[str, Any]:
    with session_factory(engine)() as session:
        run = queries.get_run(session, run_id)
        assert run is not None
        return queries.run_detail(run)


def _by(items: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
    return {item[key]: item for item in items}


def test_callable_runs(store: Engine, journal: Journal):
    _project(store, journal)
    family = _detail(store, journal.run_ids["family"])
    assert family["status"] == "succeeded"
    assert family["kind"] == "callable"
    assert family["outputs"] == {"total": 1002}
    assert family["inputs"] == {"args": [2], "kwargs": {}}
    assert family["error"] is None
    assert family["steps"] == []
    assert family["created_at"] <= family["ended_at"]
    dispatches = [
        f.n
        for _seq, rtype, no, f in journal.records
        if rtype == RecordType.DISPATCH and no == family["run_no"]
    ]
    assert family["dispatches"] == max(dispatches)

    tasks = _by(family["tasks"], "name")
    assert set(tasks) == {"store_workloads:family", "child-0", "child-1", "crasher"}
    root = tasks["store_workloads:family"]
    assert (root["ltid"], root["parent_ltid"], root["kind"]) == (1, None, "task")
    assert root["state"] == "done"
    assert root["result"] == {"total": 1002}
    assert root["ended_at"] == family["ended_at"]
    assert [tasks[f"child-{i}"]["result"] for i in range(2)] == [0, 2]
    assert all(t["parent_ltid"] == 1 and t["blocked_on"] is None for t in family["tasks"][1:])
    crasher = tasks["crasher"]
    assert crasher["state"] == "crashed"
    assert crasher["error"]["type"] == "builtins:ValueError"
    assert crasher["error"]["message"] == "boom"

    failing = _detail(store, journal.run_ids["failing"])
    assert failing["status"] == "failed"
    assert failing["outputs"] is None
    assert failing["error"]["message"] == "root failed"
    assert failing["error"]["args"] == ["root failed", 42]
    assert failing["tasks"][0]["state"] == "crashed"

    sleeper = _detail(store, journal.run_ids["sleeper"])
    assert sleeper["status"] == "cancelled"
    assert sleeper["error"]["type"] == "tiffany.errors:TaskCancelled"
    assert sleeper["tasks"][0]["state"] == "cancelled"


def test_plan_runs(store: Engine, journal: Journal):
    _project(store, journal)
    ok = _detail(store, journal.run_ids["plan_ok"])
    assert ok["status"] == "succeeded"
    assert ok["kind"] == "plan"
    assert ok["inputs"] == {"text": "hi", "unused": 2}  # plan defaults, then the given inputs
    assert ok["outputs"] == {"text": "hi"}
    steps = ok["steps"]
    assert [s["step_id"] for s in steps] == ["write", "read", "nap"]
    assert [s["position"] for s in steps] == [0, 1, 2]
    assert [s["tool"] for s in steps] == ["file.write", "file.read", "sleep"]
    assert {s["status"] for s in steps} == {"succeeded"}
    read = _by(steps, "step_id")["read"]
    assert read["output"]["content"] == "hi"
    assert [a["attempt"] for a in read["attempts"]] == [1]
    assert read["started_at"] <= read["ended_at"]
    write = _by(steps, "step_id")["write"]
    assert write["ended_at"] <= read["started_at"]  # read runs after write

    tasks = ok["tasks"]
    kinds = {(t["kind"], t["step_id"]) for t in tasks}
    assert ("planner", None) in kinds
    assert {("worker", s) for s in ("write", "read", "nap")} <= kinds
    assert {("tool", "write"), ("tool", "read")} <= kinds  # sleep runs inside its worker
    assert tasks[0]["name"] == "write-read"
    assert {t["state"] for t in tasks} == {"done"}
    workers = [t for t in tasks if t["kind"] == "worker"]
    assert all(t["parent_ltid"] == 1 for t in workers)
    tool = next(t for t in tasks if t["name"] == "tool:file.read:read")
    assert tool["parent_ltid"] == next(t["ltid"] for t in workers if t["step_id"] == "read")

    failed = _detail(store, journal.run_ids["plan_fail"])
    assert failed["status"] == "failed"
    assert failed["error"]["type"] == "tiffany.agents.planner:PlanFailed"
    assert failed["error"]["fields"] == {"failed": ["bad"]}  # the step summary is in steps
    bad, after = failed["steps"]
    assert (bad["step_id"], bad["status"]) == ("bad", "failed")
    assert [a["attempt"] for a in bad["attempts"]] == [1, 2]
    assert bad["error"]["code"] == "tool.file.not_found"
    assert (after["status"], after["attempts"]) == ("skipped", [])
    assert after["error"]["upstream"] == "bad"
    tools = [t for t in failed["tasks"] if t["kind"] == "tool"]
    assert [t["state"] for t in tools] == ["crashed", "crashed"]  # one per attempt
    # A tool task ends when its attempt did (its own exit carries no time):
    # on the run's clock it had ended where it started, 0 ms on the timeline.
    assert [t["ended_at"] for t in tools] == [a["ended_at"] for a in bad["attempts"]]
    assert all(t["started_at"] <= t["ended_at"] for t in tools)
    assert tool["ended_at"] == read["ended_at"]

    cancelled = _detail(store, journal.run_ids["plan_cancel"])
    assert cancelled["status"] == "cancelled"
    assert {s["status"] for s in cancelled["steps"]} == {"skipped"}
    assert cancelled["steps"][0]["error"] == {"message": "skipped: the run cancelled"}
    assert {t["state"] for t in cancelled["tasks"]} == {"cancelled"}


def test_states_in_the_middle_of_a_run(store: Engine, journal: Journal):
    """Up to a tool's step start: its task is blocked on the step, its plan step running."""
    run_no = next(
        no
        for _s, rtype, no, f in journal.records
        if rtype == RecordType.RUN_START and f.run_id == journal.run_ids["plan_ok"]
    )
    cut = next(
        i
        for i, (_s, rtype, no, f) in enumerate(journal.records)
        if rtype == RecordType.STEP_START and no == run_no and f.name == "file.write"
    )
    Projector(store).apply(journal.records[: cut + 1])
    run = _detail(store, journal.run_ids["plan_ok"])
    assert run["status"] == "running"
    assert run["ended_at"] is None
    tool = next(t for t in run["tasks"] if t["name"] == "tool:file.write:write")
    assert tool["state"] == "blocked_thread"
    assert tool["blocked_on"] == "step file.write"
    steps = _by(run["steps"], "step_id")
    assert steps["write"]["status"] == "running"
    assert steps["write"]["started_at"] is not None
    assert steps["read"]["status"] == "pending"
    planner = run["tasks"][0]
    assert (planner["state"], planner["blocked_on"]) == ("blocked_sync", "queue_get")
    with session_factory(store)() as session:
        counts = queries.counts_by_status(session)
    assert counts["running"] >= 1


def test_applying_twice_changes_nothing(store: Engine, journal: Journal):
    projector = _project(store, journal)
    before = dump(store)
    again = projector.apply(journal.records)
    assert (again.applied, again.skipped) == (0, len(journal.records))
    assert Projector(store).apply(journal.records).applied == 0  # a new projector too
    assert dump(store) == before
    assert before["projector_state"] == [
        {"id": 1, "last_seq": journal.records[-1][0], "journal": None}  # None: the file WAL
    ]


def test_a_prefix_then_everything_equals_everything(
    store: Engine, journal: Journal, make_store: Callable[[], Engine]
):
    half = len(journal.records) // 2
    projector = Projector(store)
    projector.apply(journal.records[:half])
    report = projector.apply(journal.records)  # overlaps the prefix
    assert (report.skipped, report.applied) == (half, len(journal.records) - half)
    other = make_store()
    _project(other, journal)
    assert dump(store) == dump(other)


def test_small_batches_and_restarts_equal_a_rebuild(
    store: Engine, journal: Journal, make_store: Callable[[], Engine]
):
    """Incremental projection, with the projector restarted (caches lost), == rebuild."""
    records = journal.records
    named = journal_id(journal.wal_dir)  # the WAL's name, as the projector process claims it
    projector = Projector(store, named)
    for i, start in enumerate(range(0, len(records), 7)):
        if i % 5 == 4:
            projector = Projector(store, named)  # an engine restart: contexts reload from rows
        projector.apply(records[start : start + 7])
    rebuilt = make_store()
    report = rebuild_store(rebuilt, journal.wal_dir, batch_records=50)
    assert report.records == len(records)
    assert report.runs == len(journal.run_ids)
    assert dump(store) == dump(rebuilt)


def test_a_record_that_fails_is_quarantined_and_the_rest_applied(store: Engine, journal: Journal):
    records = journal.records
    projector = Projector(store)
    projector.apply(records[:10])
    first = records[0]
    assert first[1] == RecordType.RUN_START
    clash = (records[-1][0] + 1, RecordType.RUN_START, 99, first[3])  # same run id
    report = projector.apply([*records[10:], clash])
    assert report.quarantined == [clash[0]]
    assert projector.last_seq == clash[0]
    assert projector.dead_letters == 1
    rows = dump(store)
    assert len(rows["runs"]) == len(journal.run_ids)
    (letter,) = rows["dead_letters"]
    assert letter["seq"] == clash[0]
    assert letter["rtype"] == "RUN_START"
    assert "IntegrityError" in letter["error"]


def test_a_record_too_short_for_its_type_is_quarantined(store: Engine, journal: Journal):
    projector = Projector(store)
    short = (1).to_bytes(4, "little") + msgspec.msgpack.encode([1, 1])  # a DISPATCH of 2 fields
    run_no, record = decode_record(RecordType.DISPATCH, short)
    seq = journal.records[0][0] + 1
    report = projector.apply([journal.records[0], (seq, RecordType.DISPATCH, run_no, record)])
    assert (report.applied, report.quarantined) == (1, [seq])
    assert projector.last_seq == seq
    (letter,) = dump(store)["dead_letters"]
    assert letter["rtype"] == "DISPATCH"
    assert "Expected `array` of at least length 4" in letter["error"]


def test_records_of_unknown_runs_are_counted_not_applied(store: Engine, journal: Journal):
    first_start = next(i for i, r in enumerate(journal.records) if r[1] == RecordType.SPAWN)
    report = Projector(store).apply(journal.records[first_start : first_start + 1])
    assert (report.applied, report.orphans) == (0, 1)
    assert report.last_seq == journal.records[first_start][0]


def test_list_runs_newest_first_with_filter_and_paging(store: Engine, journal: Journal):
    _project(store, journal)
    with session_factory(store)() as session:
        runs = queries.list_runs(session)
        assert len(runs) == len(journal.run_ids)
        keys = [(r.created_at, r.run_no) for r in runs]
        assert keys == sorted(keys, reverse=True)
        assert [r.run_no for r in queries.list_runs(session, limit=2, offset=1)] == [
            r.run_no for r in runs[1:3]
        ]
        failed = queries.list_runs(session, status="failed")
        assert {r.run_id for r in failed} == {
            journal.run_ids["failing"],
            journal.run_ids["plan_fail"],
        }
        assert queries.counts_by_status(session) == {
            "pending": 0,
            "running": 0,
            "waiting": 0,
            "succeeded": 2,
            "failed": 2,
            "cancelled": 2,
        }
        assert queries.get_run(session, "no-such-run") is None
        summary = queries.run_summary(runs[0])
        assert set(summary) >= {"run_id", "name", "status", "created_at", "dispatches"}


def test_a_store_projects_one_journal_and_refuses_another(store: Engine, journal: Journal):
    from tiffany.projector.apply import StoreJournalMismatch

    _project(store, journal)  # the file WAL's (journal None)
    with pytest.raises(StoreJournalMismatch) as refused:
        Projector(store, "postgres:main")  # its seqs name other records: never mixed in
    assert refused.value.fields == {
        "store_journal": None,
        "journal": "postgres:main",
        "mark": journal.records[-1][0],
    }
    assert "tiffany db rebuild" in str(refused.value)
    Projector(store, claim=False).reset("postgres:main")  # what a rebuild from a stream does
    Projector(store, "postgres:main").apply(journal.records)
    with pytest.raises(StoreJournalMismatch):
        Projector(store, "postgres:other")  # another stream
    with pytest.raises(StoreJournalMismatch):
        Projector(store)  # the file WAL again


def _as_engine(journal: Journal, engine: int) -> list[Any]:
    """The journal's records as engine ``engine`` wrote them: its seqs, its own run ids.

    The run numbers stay the same: each engine numbers its runs itself.
    """
    from tiffany.wire.records import RunStart
    from tiffany.wire.shards import seq_base

    base = seq_base(engine)
    out = []
    for seq, rtype, run_no, rec in journal.records:
        if isinstance(rec, RunStart):
            rec = msgspec.structs.replace(rec, run_id=f"{rec.run_id}-e{engine}")
        out.append((seq + base, rtype, run_no, rec))
    return out


def test_engines_project_into_one_store_each_with_its_seqs_and_mark(
    store: Engine, journal: Journal
):
    """``serve --engines N``: the engines' projectors share a store (tiffany/wire/shards.py)."""
    from tiffany.wire.shards import seq_base

    one = _as_engine(journal, 1)
    _project(store, journal)
    second = Projector(store, shard=1)
    assert second.last_seq == seq_base(1)  # nothing of engine 1 yet
    report = second.apply(one)
    assert (report.applied, report.orphans) == (len(one), 0)
    with session_factory(store)() as session:
        assert queries.watermark(session) == journal.records[-1][0]
        assert queries.watermark(session, 1) == one[-1][0]
    # Same run numbers in both journals, yet each run shows its own records only.
    rid = journal.run_ids["plan_ok"]
    with session_factory(store)() as session:
        mine = queries.run_records(session, rid, 0, 10_000)
        theirs = queries.run_records(session, f"{rid}-e1", 0, 10_000)
    assert mine is not None
    assert theirs is not None
    assert [r["seq"] + seq_base(1) for r in mine["records"]] == [
        r["seq"] for r in theirs["records"]
    ]
    assert _detail(store, f"{rid}-e1")["status"] == _detail(store, rid)["status"]
    # Rebuilding one engine's share leaves the other's rows alone.
    before = dump(store)
    rebuild_of_one = Projector(store, claim=False, shard=1)
    rebuild_of_one.reset()
    assert _detail(store, rid)["status"] == "succeeded"
    with session_factory(store)() as session:
        assert queries.get_run(session, f"{rid}-e1") is None
        assert queries.watermark(session, 1) == seq_base(1)
    rebuild_of_one.apply(one)
    assert dump(store) == before


def _raw(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row as the database holds it: each column cast to text (JSON as stored)."""
    from sqlalchemy import text

    from tiffany.store import Base

    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            columns = ", ".join(f"CAST({c.name} AS TEXT)" for c in table.columns)
            order = ", ".join(c.name for c in table.primary_key.columns)
            rows = conn.execute(text(f"SELECT {columns} FROM {table.name} ORDER BY {order}"))
            out[table.name] = [tuple(r) for r in rows]
    return out


def test_driver_parameters_store_what_sqlalchemy_binds_would(
    store: Engine,
    journal: Journal,
    make_store: Callable[[], Engine],
    monkeypatch: pytest.MonkeyPatch,
):
    """The projector's own statements and parameters (JSON as text) == SQLAlchemy's binds.

    SQLite: its executemany; PostgreSQL: its one statement per batch
    (``pgflush``). Byte for byte, JSON ``null`` for None included: the other store is
    projected with the fast path off (a driver whose paramstyle it does not
    know), in the same small batches, so updates take both paths too.
    """
    from tiffany.projector import rows as rows_module

    def project(engine: Engine) -> None:
        projector = Projector(engine)
        for start in range(0, len(journal.records), 5):
            projector.apply(journal.records[start : start + 5])

    project(store)
    bound = make_store()
    with monkeypatch.context() as patch:
        patch.setattr(rows_module, "_MARKERS", {})
        project(bound)
    fast, slow = _raw(store), _raw(bound)
    assert fast["steps"]
    assert fast["journal_records"]
    error = [c.name for c in Step.__table__.columns].index("error")
    assert "null" in {row[error] for row in fast["steps"]}  # None as JSON null, not NULL
    assert fast == slow


def test_an_idle_projector_checkpoints_a_sqlite_store(
    store: Engine, journal: Journal, monkeypatch: pytest.MonkeyPatch
):
    """After applying, idle() copies the store's WAL into the database file once.

    So the commit that would have crossed SQLite's 1,000-page threshold
    does not copy and sync megabytes while a ``min_seq`` read waits on it.
    """
    import io

    from tiffany.projector import process as projector_proc
    from tiffany.store.session import checkpoint

    copied: list[int] = []
    monkeypatch.setattr(projector_proc, "checkpoint", lambda e: copied.append(checkpoint(e)))
    applier = projector_proc._Applier("unused", io.StringIO())
    applier.engine, applier.projector = store, Projector(store)
    applier.idle()
    assert copied == []  # nothing applied yet: nothing to do
    applier.apply(list(journal.records))
    applier.idle()
    applier.idle()  # nothing new since
    if store.dialect.name == "sqlite":
        assert len(copied) == 1
        assert copied[0] > 0
    else:
        assert copied == [0]  # PostgreSQL: nothing to do


def test_a_run_read_for_the_api_is_the_run_the_orm_loads(store: Engine, journal: Journal):
    """``run_detail_of`` (the API's read: three SELECTs, pipelined on PostgreSQL) and the ORM agree.

    On PostgreSQL the three statements go through psycopg's pipeline on the
    driver's cursors, with the engine's JSON loader: the same values, JSON
    columns and floats included, as SQLAlchemy's own reading of the rows.
    """
    _project(store, journal)
    with session_factory(store)() as session:
        for run_id in journal.run_ids.values():
            fast = queries.run_detail_of(session, run_id)
            assert fast is not None
            assert fast == _detail(store, run_id)
            assert fast["tasks"]  # every run here has its root at least
        assert queries.run_detail_of(session, "run-nobody-started") is None
