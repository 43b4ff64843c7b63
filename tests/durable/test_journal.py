"""The journal and replay: record, replay identically, recover from any cut."""

from __future__ import annotations

from pathlib import Path

import durable_workloads as wl
import pytest
from walcut import cut_wal

from tiffany.durable import RecordType, Runtime, load, scan, verify
from tiffany.durable.history import decoded_records
from tiffany.errors import NondeterminismError
from tiffany.wal import iter_records


def _run(data_dir: Path, target: str, *args):
    with Runtime(data_dir) as rt:
        run_id = rt.submit(target, *args)
        rt.run()
        state = rt.status(run_id)
        return run_id, state.status, state.result


def test_a_finished_run_replays_identically_without_side_effects(tmp_path):
    run_id, status, result = _run(tmp_path, "durable_workloads:fan_in", 5)
    assert status == "succeeded"
    assert result[0] == sum(i * 10 for i in range(5))
    assert sorted(wl.CALLS) == list(range(5))
    wl.CALLS.clear()
    report = verify(tmp_path, run_id)
    assert report.ok, report.to_dict()
    assert report.dispatches > 20
    assert wl.CALLS == []  # no step ran again


def test_every_dispatch_is_journaled_with_its_outcomes(tmp_path):
    run_id, _, _ = _run(tmp_path, "durable_workloads:fan_in", 3)
    info = scan(tmp_path / "wal").get(run_id)
    kinds: dict[int, int] = {}
    explicit = set()
    explicit_returns = 0
    for _seq, rtype, fields in decoded_records(tmp_path / "wal", info):
        kinds[rtype] = kinds.get(rtype, 0) + 1
        if rtype == RecordType.DISPATCH:
            explicit.add(fields.kind)
            explicit_returns += fields.kind == "return"
    # A NewTask, Now(), Random(), Step or a task's final return (but the root's)
    # is journaled by the record it causes.
    assert not explicit & {"new_task", "now", "random", "step"}
    assert explicit_returns == 1
    cursor = load(tmp_path / "wal", info)
    ns = [rec.n for rec in cursor.dispatches]
    assert ns == list(range(1, len(ns) + 1))  # one record per dispatch, none missing
    dispatch_kinds = {rec.kind for rec in cursor.dispatches}
    assert {
        "new_task",
        "queue_get",
        "wait_task",
        "sleep",
        "step",
        "now",
        "random",
        "return",
    } <= dispatch_kinds
    assert kinds[RecordType.SPAWN] == 4
    assert kinds[RecordType.OUTCOME] >= 6  # 3 Now + 3 Random (+ sleeps)
    assert kinds[RecordType.TASK_EXIT] == 4
    assert kinds[RecordType.RUN_END] == 1
    steps = kinds[RecordType.STEP_START]
    assert steps == 3


def test_a_changed_program_raises_nondeterminism_with_details(tmp_path):
    run_id, _, _ = _run(tmp_path, "durable_workloads:moody", 5)
    assert verify(tmp_path, run_id).ok
    wl.MODE["value"] = "b"
    report = verify(tmp_path, run_id)
    assert not report.ok
    d = report.divergence
    assert d is not None
    assert d["run_id"] == run_id
    assert d["code"] == "replay.nondeterminism"
    assert d["expected"][2] == "sleep"
    assert d["actual"][2] == "yield"
    assert d["task"] == 1
    assert any("moody" in frame for frame in d["stack"])


def test_a_divergence_at_a_task_exit_names_the_seq_of_its_record(tmp_path):
    """It named "WAL seq -1": the exit records' seqs were not kept."""
    run_id, _, _ = _run(tmp_path, "durable_workloads:changed_result")
    info = scan(tmp_path / "wal").get(run_id)
    [child_exit] = [
        seq
        for seq, rtype, rec in decoded_records(tmp_path / "wal", info)
        if rtype == RecordType.TASK_EXIT and rec.ltid == 2
    ]
    wl.MODE["value"] = "b"
    report = verify(tmp_path, run_id)
    assert not report.ok
    d = report.divergence
    assert d is not None
    assert (d["what"], d["task"], d["actual"][3]) == ("task exit", 2, 2)
    assert d["seq"] == child_exit


def test_runtime_replay_raises_nondeterminism_error(tmp_path):
    with Runtime(tmp_path) as rt:
        run_id = rt.submit("durable_workloads:moody", 4)
        rt.run()
    wal = tmp_path / "wal"
    cut = tmp_path / "cut"
    n = sum(1 for _ in iter_records(wal))
    cut_wal(wal, cut / "wal", n - 6)
    wl.MODE["value"] = "b"
    with Runtime(cut) as rt:
        rt.recover()
        with pytest.raises(NondeterminismError) as info:
            rt.run()
    assert info.value.fields["run_id"] == run_id


@pytest.mark.parametrize(
    ("target", "args"), [("durable_workloads:fan_in", (4,)), ("durable_workloads:killer", ())]
)
def test_recovery_from_every_record_prefix(tmp_path, target, args):
    run_id, status, expected = _run(tmp_path / "full", target, *args)
    records = list(iter_records(tmp_path / "full" / "wal"))
    completed_total = len(wl.CALLS)
    for keep in range(1, len(records)):
        wl.CALLS.clear()
        d = tmp_path / f"cut{keep}"
        cut_wal(tmp_path / "full" / "wal", d / "wal", keep)
        done_steps = sum(
            1 for r in records[:keep] if r.rtype == RecordType.WAKE and b"step" in bytes(r.payload)
        )
        with Runtime(d) as rt:
            resumed = rt.recover()
            assert resumed == [run_id]
            rt.run()
            state = rt.status(run_id)
        assert (state.status, state.result) == (status, expected), keep
        # completed steps are not re-run; the others run exactly once more
        assert len(wl.CALLS) == completed_total - done_steps, keep
        assert verify(d, run_id).ok, keep


def test_timers_resume_with_their_remaining_time(tmp_path):
    # The first run sleeps its 3 s through; the recovered one finds the timer's
    # deadline passed and wakes at once. Redoing the sleep cannot take less than
    # 3 s however fast the machine, and the recovery itself, even on a loaded
    # one, takes well under that.
    nap = 3.0
    with Runtime(tmp_path / "a") as rt:
        rt.submit("durable_workloads:cancellable", nap)
        rt.run()
    records = list(iter_records(tmp_path / "a" / "wal"))
    # keep everything up to (not including) the sleeper's wake-up
    wake = next(i for i, r in enumerate(records) if r.rtype == RecordType.WAKE)
    cut_wal(tmp_path / "a" / "wal", tmp_path / "b" / "wal", wake)
    import time

    start = time.monotonic()
    with Runtime(tmp_path / "b") as rt:
        (run_id,) = rt.recover()
        rt.run()
        assert rt.status(run_id).result == "slept"
    assert time.monotonic() - start < nap  # the remaining time, not the full sleep again


def test_cancel_a_run_kills_its_tasks_and_replays(tmp_path):
    with Runtime(tmp_path) as rt:
        run_id = rt.submit("durable_workloads:cancellable", 30.0)
        from tiffany.kernel import Instrument

        class CancelSoon(Instrument):
            def after_wait(self, events):
                rt.journal.request_cancel(run_id, "test")

        rt.sched.add_instrument(CancelSoon())
        rt.run()
        state = rt.status(run_id)
    assert state.status == "cancelled"
    assert sorted(wl.CALLS) == [("cancelled", "root"), ("cancelled", "sleeper")]
    assert verify(tmp_path, run_id).ok


def test_generator_steps_run_as_tasks_and_replay_from_the_journal(tmp_path):
    target = tmp_path / "f.txt"
    run_id, status, result = _run(tmp_path, "durable_workloads:generator_steps", str(target))
    assert (status, result) == ("succeeded", [6, 3])
    target.write_text("changed to something longer\n")  # a re-run would see this
    report = verify(tmp_path, run_id)
    assert report.ok, report.to_dict()


def test_several_runs_share_one_wal_and_replay_alone(tmp_path):
    with Runtime(tmp_path) as rt:
        ids = [rt.submit("durable_workloads:fan_in", n) for n in (2, 3, 4)]
        ids.append(rt.submit("durable_workloads:killer"))
        rt.run()
        results = {i: rt.status(i).result for i in ids}
    index = scan(tmp_path / "wal")
    assert [index.get(i).status for i in ids] == ["succeeded"] * 4
    for i in ids:
        assert verify(tmp_path, i).ok
    assert results[ids[0]][0] == 10


def test_an_fsync_error_stops_the_engine_and_no_effect_follows(tmp_path):
    import errno
    import os

    from tiffany.errors import InstrumentFailure, WalFailedError

    syncs = {"n": 0}

    def flaky(fd: int) -> None:
        syncs["n"] += 1
        if syncs["n"] == 3:
            raise OSError(errno.EIO, "injected EIO")
        os.fdatasync(fd)

    with Runtime(tmp_path) as rt:
        rt.wal._fdatasync = flaky  # the WAL's injectable sync
        rt.submit("durable_workloads:appenders", str(tmp_path / "out.txt"), 1, 6)
        with pytest.raises(InstrumentFailure) as info:
            rt.run()
        assert isinstance(info.value.__cause__, WalFailedError)
        durable = rt.wal.durable_seq
        assert rt.wal.failed
    # only the steps whose start record was durable ran; nothing after the failure
    out = tmp_path / "out.txt"
    lines = out.read_text().splitlines() if out.exists() else []
    # sync 1 made the run's start durable, sync 2 the first step's: one step ran
    assert len(lines) == syncs["n"] - 2
    records = list(iter_records(tmp_path / "wal"))
    assert records[-1].seq >= durable  # what was acknowledged is on disk


@pytest.mark.parametrize("inline", [True, False])
def test_a_wide_fan_out_syncs_once_for_many_passes_and_no_step_starts_early(
    tmp_path, monkeypatch, inline
):
    """Steps started over many passes share one fdatasync; none runs before its record."""
    from tiffany.durable import recorder

    monkeypatch.setattr(recorder, "GROUP_COMMIT_MAX_S", 3600.0)  # only run-dry commits
    n = 450  # five passes of the root (MAX_IMMEDIATE_RESUMES spawns per turn)
    with Runtime(tmp_path) as rt:
        wal = rt.wal
        append, commit = wal.append, wal.commit
        commits = []

        def watching_append(rtype, payload):
            seq = append(rtype, payload)
            if rtype == RecordType.STEP_START:
                wl.WATCH["last_start"] = seq
            return seq

        def counting_commit():
            commits.append(wal.next_seq)
            return commit()

        monkeypatch.setattr(wal, "append", watching_append)
        monkeypatch.setattr(wal, "commit", counting_commit)
        wl.WATCH.update(wal=wal, last_start=0)
        try:
            run_id = rt.submit("durable_workloads:wide", n, inline)
            rt.run()
        finally:
            wl.WATCH.clear()
        assert rt.status(run_id).result == sum(range(n))
    assert sorted(i for i, _ in wl.CALLS) == list(range(n))
    if inline:  # an inline step runs at the commit point: every start before it is durable
        assert all(durable for _, durable in wl.CALLS)
        # run start and the steps of five passes at once; their wake-ups and the run's end
        # (with the pool, thread completions arrive when they do: the loop commits
        # whenever it is about to block for them)
        assert len(commits) <= 4, commits
    wl.CALLS.clear()
    assert verify(tmp_path, run_id).ok
    assert wl.CALLS == []


def test_a_generator_step_starts_only_after_its_record_is_durable(tmp_path, monkeypatch):
    """The kernel cannot hold a generator step (it runs as a task): no deferred commit."""
    with Runtime(tmp_path) as rt:
        wal = rt.wal
        append = wal.append

        def watching_append(rtype, payload):
            seq = append(rtype, payload)
            if rtype == RecordType.STEP_START:
                wl.WATCH["last_start"] = seq
            return seq

        monkeypatch.setattr(wal, "append", watching_append)
        wl.WATCH.update(wal=wal, last_start=0)
        try:
            run_id = rt.submit("durable_workloads:generator_step_among_busy_tasks", 5)
            rt.run()
        finally:
            wl.WATCH.clear()
        assert rt.status(run_id).result == sum(range(5))
    assert sorted(i for i, _ in wl.CALLS) == list(range(5))
    assert all(durable for _, durable in wl.CALLS), wl.CALLS
    wl.CALLS.clear()


def test_which_dispatches_the_next_record_carries():
    from tiffany.durable.dispatch import carried
    from tiffany.kernel import NewTask, Now, Random, Sleep, Step, WaitTask

    def gen():
        yield

    carried_calls = [Now(), Random(), Step(len, "x"), NewTask(gen())]
    assert all(carried(c) for c in carried_calls)
    explicit = [NewTask(42), Sleep(1), WaitTask(1), None]  # NewTask(42): refused, no SPAWN
    assert not any(carried(c) for c in explicit)
