"""Upgrades with runs in flight: a data dir the previous release left mid-run finishes here.

``tests/data/golden/inflight_v1`` was written by main at d869a26 (journal
version 1, before RUN_START carried a version and SPAWN a role) and killed
by SIGKILL with a plan run sleeping in its second step and a callable run
whose root waits on a child in a durable sleep (``tests/data/make_inflight_golden.py``).
``inflight_v2``, the same runs, by main at 235120f (version 2, before the
budget's ledger and the worker's exact outcome record). Every release's
in-flight golden stays here and must keep finishing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import durable_workloads as wl
import pytest

from tiffany.config import Settings
from tiffany.durable import Runtime, scan, verify
from tiffany.durable.runtime import JournalTooNew
from tiffany.engine import build, replay_resolvers
from tiffany.projector.tail import project_wal
from tiffany.store import make_engine, queries, session_factory
from tiffany.wal import Wal
from tiffany.wire.records import JOURNAL_COMPAT, RUN_PREFIX, RunStart, Spawn, encode

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
#: Each release's in-flight golden and the journal version its runs started under.
RELEASES = [("inflight_v1", 1), ("inflight_v2", 2)]
TOOLS = ["file.write", "file.read", "sleep"]


@pytest.mark.parametrize(("release", "compat"), RELEASES)
def test_runs_in_flight_under_the_previous_release_finish_after_the_upgrade(
    tmp_path, release, compat
):
    data = tmp_path / release
    shutil.copytree(GOLDEN / release, data)
    index = scan(data / "wal")
    assert {i.run_id: (i.status, i.compat) for i in index.runs.values()} == {
        "inflight-plan": ("running", compat),
        "inflight-sleeper": ("running", compat),
    }
    settings = Settings(data_dir=data, enabled_tools=TOOLS, _env_file=None)
    engine = build(settings)
    try:
        resumed = engine.runtime.recover()
        assert sorted(resumed) == ["inflight-plan", "inflight-sleeper"]
        engine.runtime.run()
        plan = engine.runtime.status("inflight-plan")
        sleeper = engine.runtime.status("inflight-sleeper")
    finally:
        engine.runtime.close()
    assert (plan.status, sleeper.status) == ("succeeded", "succeeded"), (plan.error, sleeper.error)
    assert plan.result["outputs"] == {"read": "alpha"}
    assert {k: v["status"] for k, v in plan.result["steps"].items()} == dict.fromkeys(
        ["a", "wait", "b", "c"], "succeeded"
    )
    workspace = data / "workspaces" / "inflight-plan"
    assert (workspace / "c.txt").read_text() == "alpha!"
    assert sleeper.result == "slept"
    assert wl.CALLS == []  # nothing was cancelled on the way
    # The whole history, old records and new, replays identically with this code.
    for run_id in resumed:
        report = verify(data, run_id, resolvers=replay_resolvers(settings))
        assert report.ok, report.to_dict()
    # The store reads the old SPAWNs' roles (from their names, in the decoder) and the new ones.
    url = f"sqlite:///{tmp_path / 'store.db'}"
    project_wal(url, data / "wal")
    store = make_engine(url)
    try:
        with session_factory(store)() as session:
            row = queries.get_run(session, "inflight-plan")
            run = queries.run_detail(row) if row is not None else None
    finally:
        store.dispose()
    assert run is not None
    kinds = {(t["name"], t["kind"], t["step_id"]) for t in run["tasks"]}
    assert {
        ("inflight", "planner", None),
        ("worker:a", "worker", "a"),
        ("tool:file.write:a", "tool", "a"),
        ("worker:wait", "worker", "wait"),
        ("worker:b", "worker", "b"),
        ("tool:file.read:b", "tool", "b"),
        ("worker:c", "worker", "c"),
    } <= kinds
    assert {s["step_id"]: s["status"] for s in run["steps"]} == dict.fromkeys(
        ["a", "wait", "b", "c"], "succeeded"
    )


def test_a_new_run_records_this_codes_version(tmp_path):
    with Runtime(tmp_path) as rt:
        run_id = rt.submit("durable_workloads:fan_in", 1)
        rt.run()
    assert scan(tmp_path / "wal").get(run_id).compat == JOURNAL_COMPAT


def test_a_run_started_by_a_newer_engine_is_left_alone(tmp_path):
    wal = Wal.open(tmp_path / "wal")
    prefix = RUN_PREFIX.pack(1)
    entry = {"kind": "callable", "target": "durable_workloads:fan_in", "args": [1], "kwargs": {}}
    future = RunStart("from-the-future", "f", entry, 1.0, JOURNAL_COMPAT + 1)
    wal.append(future.rtype, encode(prefix, future))
    root = Spawn(0, 1, 0, "f", "task")
    wal.append(root.rtype, encode(prefix, root))
    wal.commit()
    wal.close()
    with Runtime(tmp_path) as rt:
        assert rt.recover() == []
        assert [e.fields["run_id"] for e in rt.too_new] == ["from-the-future"]
        with pytest.raises(JournalTooNew, match="upgrade to resume it"):
            rt.recover(["from-the-future"])
    assert scan(tmp_path / "wal").get("from-the-future").status == "running"  # nothing lost
    report = verify(tmp_path, "from-the-future")
    assert not report.ok


def test_runs_waiting_for_the_engines_old_signals_finish_after_the_upgrade(tmp_path):
    """``inflight_signals_v2`` (tests/data/make_signals_golden.py, main at 235120f).

    Killed while a parent waited for its child's end (then a journaled
    ``child:<id>`` signal) and a limited run for its slot (``concurrency.slot``):
    the current code delivers both its own way, and every run replays.
    """
    data = tmp_path / "inflight"
    shutil.copytree(GOLDEN / "inflight_signals_v2", data)
    runs = ["inflight-holder", "inflight-queued", "inflight-parent", "inflight-parent.sub.1"]
    assert {i.run_id: i.status for i in scan(data / "wal").runs.values()} == dict.fromkeys(
        runs, "running"
    )
    settings = Settings(data_dir=data, enabled_tools=[*TOOLS, "plan.run"], _env_file=None)
    engine = build(settings)
    try:
        assert sorted(engine.recover_runs()) == sorted(runs)
        engine.runtime.run()
        ends = {r: engine.runtime.status(r) for r in runs}
    finally:
        engine.runtime.close()
    assert {r: s.status for r, s in ends.items()} == dict.fromkeys(runs, "succeeded"), {
        r: s.error for r, s in ends.items()
    }
    assert ends["inflight-parent"].result["outputs"] == {"who": "kid"}
    for run_id in runs:
        report = verify(data, run_id, resolvers=replay_resolvers(settings))
        assert report.ok, report.to_dict()


def test_a_parent_gets_the_end_its_child_journaled_when_the_engine_stopped_before_telling_it(
    tmp_path,
):
    """The child's RUN_END is durable, the parent's ``child:<id>`` WAKE is not (the next record).

    The recovered parent takes the end from the child's own journal (its
    RUN_END in the start-up index) instead of waiting for ever.
    """
    from walcut import cut_wal

    from tiffany.wal import iter_records
    from tiffany.wire.records import RecordType, run_of

    src = GOLDEN / "signals_v2"
    child, parent = "golden-parent.sub.1", "golden-parent"
    records = list(iter_records(src / "wal"))
    child_no = scan(src / "wal").get(child).run_no
    (end,) = [
        i
        for i, rec in enumerate(records)
        if rec.rtype == RecordType.RUN_END and run_of(bytes(rec.payload)) == child_no
    ]
    data = tmp_path / "cut"
    shutil.copytree(src / "workspaces", data / "workspaces")
    cut_wal(src / "wal", data / "wal", end + 1)  # up to the child's end, without the parent's WAKE
    index = scan(data / "wal")
    assert (index.get(child).status, index.get(parent).status) == ("succeeded", "running")
    settings = Settings(data_dir=data, enabled_tools=[*TOOLS, "plan.run"], _env_file=None)
    engine = build(settings)
    try:
        assert parent in engine.recover_runs()
        engine.runtime.run()
        state = engine.runtime.status(parent)
    finally:
        engine.runtime.close()
    assert state.status == "succeeded", state.error
    assert state.result["outputs"] == {"who": "kid"}
    assert verify(data, parent, resolvers=replay_resolvers(settings)).ok
