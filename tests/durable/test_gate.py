"""The step gate: a step the engine holds back waits (HOLD), and starts on a later engine."""

from __future__ import annotations

from pathlib import Path

import gate_workloads as gw
import pytest
from walcut import cut_wal

from tiffany.durable import RecordType, Runtime, scan, verify
from tiffany.durable.history import decoded_records
from tiffany.kernel import Instrument, Sleep
from tiffany.wal import iter_records
from tiffany.wire.records import as_list

REASON = "tool gated is disabled on this engine (--enable-tool gated)"


def _gate(task, call):
    return REASON if (call.name or "").startswith("gated:") else None


@pytest.fixture(autouse=True)
def _calls():
    gw.CALLS.clear()
    yield
    gw.CALLS.clear()


def _records(data_dir: Path, run_id: str) -> list[tuple[int, list]]:
    info = scan(data_dir / "wal").get(run_id)
    wal = data_dir / "wal"
    return [(rtype, as_list(rec)) for _seq, rtype, rec in decoded_records(wal, info)]


def _resume(data_dir: Path, run_id: str, *, gated: bool):
    with Runtime(data_dir) as rt:
        if gated:
            rt.journal.step_gate = _gate
        assert rt.recover() == [run_id]
        rt.run()
        state = rt.status(run_id)
        held = list(rt.journal.held.values())
    return state, held


def _tick():
    yield Sleep(0.05)


def _uncrashed(data_dir: Path):
    with Runtime(data_dir) as rt:
        run_id = rt.submit("gate_workloads:pair")
        rt.run()
        state = rt.status(run_id)
    return run_id, state.status, state.result


def test_a_held_step_waits_and_starts_on_a_later_engine_with_aligned_dispatches(tmp_path):
    _, status, expected = _uncrashed(tmp_path / "twin")
    assert status == "succeeded"
    gw.CALLS.clear()
    with Runtime(tmp_path) as rt:
        rt.journal.step_gate = _gate
        run_id = rt.submit("gate_workloads:pair")
        rt.run()  # returns when nothing can go on: the held step keeps the run open
        state = rt.status(run_id)
        held = list(rt.journal.held.values())
    assert state.status == "running"
    assert [(h.run_id, h.step, h.reason) for h in held] == [(run_id, "gated:effect", REASON)]
    assert gw.CALLS == ["free", "after-free"]  # the run's other task went on
    recs = _records(tmp_path, run_id)
    holds = [f for t, f in recs if t == RecordType.HOLD]
    assert len(holds) == 1
    assert holds[0][3:] == ["gated:effect", REASON]
    # The held step's dispatch is an explicit DISPATCH; no STEP_START was written.
    assert [holds[0][0], holds[0][1], "step", "gated:effect"] in [
        f for t, f in recs if t == RecordType.DISPATCH
    ]
    assert not [f for t, f in recs if t == RecordType.STEP_START and f[3] == "gated:effect"]

    # Restarted still gated: it replays (no nondeterminism) and waits again.
    state, held = _resume(tmp_path, run_id, gated=True)
    assert state.status == "running"
    assert len(held) == 1
    assert gw.CALLS == ["free", "after-free"]

    # Restarted with the gate open: the step starts (a first attempt, not a re-run).
    state, held = _resume(tmp_path, run_id, gated=False)
    assert (state.status, state.result) == ("succeeded", expected)
    assert held == []
    assert gw.CALLS == ["free", "after-free", "gated"]
    starts = [f for t, f in _records(tmp_path, run_id) if t == RecordType.STEP_START]
    assert [f[4] for f in starts if f[3] == "gated:effect"] == [1]
    assert len([f for t, f in _records(tmp_path, run_id) if t == RecordType.HOLD]) == 2
    assert verify(tmp_path, run_id).ok


def test_a_step_in_flight_at_a_crash_waits_on_a_gated_engine_then_reruns_once(tmp_path):
    run_id, status, expected = _uncrashed(tmp_path / "full")
    assert status == "succeeded"
    records = list(iter_records(tmp_path / "full" / "wal"))
    # The crash: right after the gated step's STEP_START (it was in flight).
    keep = next(
        i + 1
        for i, r in enumerate(records)
        if r.rtype == RecordType.STEP_START and b"gated:effect" in bytes(r.payload)
    )
    cut_wal(tmp_path / "full" / "wal", tmp_path / "cut" / "wal", keep)
    gw.CALLS.clear()
    data = tmp_path / "cut"
    state, held = _resume(data, run_id, gated=True)
    assert state.status == "running"
    assert [h.step for h in held] == ["gated:effect"]
    assert "gated" not in gw.CALLS
    recs = _records(data, run_id)
    assert len([f for t, f in recs if t == RecordType.HOLD]) == 1
    # Restarted at go-live: its dispatch is already journaled (no DISPATCH for it).
    assert not [f for t, f in recs if t == RecordType.DISPATCH and f[2] == "step"]

    state, held = _resume(data, run_id, gated=False)
    assert (state.status, state.result) == ("succeeded", expected)
    assert gw.CALLS.count("gated") == 1
    starts = [f for t, f in _records(data, run_id) if t == RecordType.STEP_START]
    assert [f[4] for f in starts if f[3] == "gated:effect"] == [1, 2]
    assert verify(data, run_id).ok


def test_cancelling_a_run_with_a_held_step_ends_it_and_forgets_the_hold(tmp_path):
    with Runtime(tmp_path) as rt:
        rt.journal.step_gate = _gate
        run_id = rt.submit("gate_workloads:pair")
        seen = []

        class CancelWhenHeld(Instrument):
            def after_wait(self, events):
                if rt.journal.held and not seen:
                    seen.append(len(rt.journal.held))
                    rt.journal.request_cancel(run_id, "test")

        rt.sched.add_instrument(CancelWhenHeld())
        rt.sched.spawn(_tick(), name="tick")  # keeps a wait stage going until the cancel
        rt.run()
        assert seen == [1]
        assert rt.status(run_id).status == "cancelled"
        assert rt.journal.held == {}
    assert "gated" not in gw.CALLS
    assert verify(tmp_path, run_id).ok
