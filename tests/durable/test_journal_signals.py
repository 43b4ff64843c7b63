"""Signals: a run's tasks ``Receive`` what comes from outside, journaled and replayed exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from walcut import cut_wal

from tiffany.durable import RecordType, Runtime, signal_bytes, verify
from tiffany.errors import ReservedSignal, SystemCallMisuse
from tiffany.kernel import Instrument, Receive, Scheduler, Sleep
from tiffany.wal import iter_records
from tiffany.wire.records import Wake, decode_body

EXPECTED = [{"n": 1}, "B", "timeout", 1, 2]
#: What the sender sends when the run waits on a channel: (name, payload, signal id).
SCRIPT: dict[str, list[tuple[str, Any, str]]] = {
    "a": [("a", {"n": 1}, "a1"), ("b", "B", "b1")],  # "b" before its wait: kept
    "b": [("a", {"n": 1}, "a1"), ("b", "B", "b1")],
    "d": [("d", 1, "d1"), ("d", 2, "d2")],
}


class Sender(Instrument):
    """Sends the script's signals at wait stages where the run's root waits on a channel.

    It sends again at every such stage (the same ids): a signal journaled
    once is never journaled (nor delivered) twice.
    """

    def __init__(self, rt: Runtime, run_id: str) -> None:
        self.rt, self.run_id = rt, run_id
        self.answers: list[tuple[str, int, str | None]] = []

    def after_wait(self, events: int) -> None:
        run = self.rt.journal.runs.get(self.run_id)
        call = run.root.blocked_on if run is not None and run.root is not None else None
        if not isinstance(call, Receive):
            return
        for name, payload, sid in SCRIPT.get(call.channel, []):
            self.rt.journal.request_signal(
                self.run_id,
                name,
                payload,
                sid,
                lambda seq, ended, s=sid: self.answers.append((s, seq, ended)),
            )


def _ticker(rt: Runtime, run_id: str) -> Any:
    """Keeps wait stages coming (the engine's inbox does) until the run ends."""
    while rt.journal.runs[run_id].status == "running":
        yield Sleep(0.002)


def _signals(wal: Path) -> list[list[Any]]:
    out = []
    for rec in iter_records(wal):
        if rec.rtype == RecordType.WAKE:
            wake = decode_body(rec.rtype, bytes(rec.payload)[4:])
            assert isinstance(wake, Wake)
            if wake.cause == "signal":
                out.append([wake.value[0], wake.value[2]])
    return out


def _run(data_dir: Path) -> tuple[str, Sender]:
    with Runtime(data_dir) as rt:
        run_id = rt.submit("durable_workloads:approvals")
        sender = Sender(rt, run_id)
        rt.sched.add_instrument(sender)
        rt.sched.spawn(_ticker(rt, run_id), name="ticker")
        rt.run()
        state = rt.status(run_id)
        assert (state.status, state.result) == ("succeeded", EXPECTED), state.error
    return run_id, sender


def test_signals_reach_their_receivers_once_in_order_and_replay(tmp_path):
    run_id, sender = _run(tmp_path)
    # Each signal journaled once, however often it was sent, in the order sent.
    assert _signals(tmp_path / "wal") == [["a", "a1"], ["b", "b1"], ["d", "d1"], ["d", "d2"]]
    seqs = {sid: seq for sid, seq, _ in sender.answers}
    assert all(seq > 0 for seq in seqs.values())
    assert all(ended is None and seqs[sid] == seq for sid, seq, ended in sender.answers)
    report = verify(tmp_path, run_id)
    assert report.ok, report.to_dict()


def test_a_run_recovers_from_every_record_prefix_and_takes_each_signal_once(tmp_path):
    run_id, _ = _run(tmp_path / "full")
    records = list(iter_records(tmp_path / "full" / "wal"))
    for keep in range(1, len(records)):
        d = tmp_path / f"cut{keep}"
        cut_wal(tmp_path / "full" / "wal", d / "wal", keep)
        with Runtime(d) as rt:
            assert rt.recover() == [run_id]
            rt.sched.add_instrument(Sender(rt, run_id))
            rt.sched.spawn(_ticker(rt, run_id), name="ticker")
            rt.run()
            state = rt.status(run_id)
        assert (state.status, state.result) == ("succeeded", EXPECTED), (keep, state.error)
        assert _signals(d / "wal") == [["a", "a1"], ["b", "b1"], ["d", "d1"], ["d", "d2"]], keep
        assert verify(d, run_id).ok, keep


def test_a_signal_for_a_finished_run_is_refused(tmp_path):
    run_id, _ = _run(tmp_path)
    with Runtime(tmp_path) as rt:
        rt.recover()
        assert not rt.journal.request_signal(run_id, "a", 1, "x", lambda seq, ended: None)


def test_receive_needs_a_journaled_run_and_a_positive_timeout():
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Receive("a", timeout=0)
    caught: list[BaseException] = []

    def task() -> Any:
        try:
            yield Receive("a")
        except SystemCallMisuse as exc:
            caught.append(exc)

    with Scheduler() as sched:  # no journal: no mailbox to receive from
        sched.spawn(task())
        sched.run()
    assert len(caught) == 1
    assert "no handler" in str(caught[0])


def test_a_signal_sent_while_a_recovered_run_replays_is_journaled_when_it_goes_live(tmp_path):
    """A signal that arrives before the replay ends goes in at the wait stage the run goes live.

    It used to wait for the wait stage after that one, which an engine with
    nothing else to do never reached: the signal's 202 did not come, and the
    API answered 503 for as long as nobody else woke the loop (seen in CI
    after a kill -9 of the engine). No ticker here: nothing else wakes the loop.
    """
    with Runtime(tmp_path) as rt:
        run_id = rt.submit("durable_workloads:wait_for_go")
        rt.run()  # it waits for "go"; with nothing else to do, the loop returns
        assert rt.status(run_id).status == "running"
    answers: list[tuple[int, str | None]] = []
    with Runtime(tmp_path) as rt:
        assert rt.recover() == [run_id]
        assert rt.journal.request_signal(
            run_id, "go", 7, "g1", lambda seq, ended: answers.append((seq, ended))
        )
        rt.run()
        state = rt.status(run_id)
    assert (state.status, state.result) == ("succeeded", 7), state.error
    assert len(answers) == 1
    assert answers[0][0] > 0
    assert answers[0][1] is None
    assert _signals(tmp_path / "wal") == [["go", "g1"]]
    assert verify(tmp_path, run_id).ok


def test_a_client_cannot_send_the_engines_own_signals_nor_borrow_their_ids(tmp_path):
    """``child:``, ``concurrency.`` and ``tiffany.`` names come only from the engine.

    The clients' path refuses them; the engine's path delivers them even
    when a client's signal took the same id first (it used to be taken for
    a repeat and dropped: the parent waited for ever).
    """
    answers: list[tuple[int, str | None]] = []
    with Runtime(tmp_path) as rt:
        run_id = rt.submit("durable_workloads:wait_for_child")
        for name in ("child:kid", "concurrency.slot", "tiffany.anything"):
            with pytest.raises(ReservedSignal):
                rt.journal.request_signal(run_id, name, {"status": "succeeded"}, "x", _no_answer)
        assert rt.journal.request_signal(
            run_id, "note", 1, "end:kid", lambda seq, ended: answers.append((seq, ended))
        )
        assert rt.journal.request_internal_signal(run_id, "child:kid", {"ok": 1}, "end:kid")
        rt.sched.spawn(_ticker(rt, run_id), name="ticker")
        rt.run()
        state = rt.status(run_id)
    assert (state.status, state.result) == ("succeeded", {"ok": 1}), state.error
    assert answers[0][0] > 0
    assert _signals(tmp_path / "wal") == [["note", "end:kid"], ["child:kid", "end:kid"]]
    assert verify(tmp_path, run_id).ok


def test_signals_nobody_receives_are_counted_and_let_go_when_the_run_ends(tmp_path):
    size = signal_bytes({"pad": "x" * 1000})
    with Runtime(tmp_path) as rt:
        run_id = rt.submit("durable_workloads:wait_for_go")
        for i in range(3):
            rt.journal.request_signal(run_id, "note", {"pad": "x" * 1000}, f"n{i}", _no_answer)
        assert rt.journal.held_signals(run_id) == (3, 3 * size)  # queued for the wait stage
        rt.run()  # journaled, kept: nobody waits for "note"
        assert rt.journal.held_signals(run_id) == (3, 3 * size)
        assert (rt.journal.signals_held, rt.journal.signal_bytes_held) == (3, 3 * size)
    with Runtime(tmp_path) as rt:  # a recovered run holds them again
        assert rt.recover() == [run_id]
        rt.run()  # the replay: the kept signals are kept again, and counted
        assert rt.journal.held_signals(run_id) == (3, 3 * size)
        rt.journal.request_signal(run_id, "go", 1, "go", _no_answer)
        rt.run()
        assert rt.status(run_id).status == "succeeded"
        assert rt.journal.held_signals(run_id) == (0, 0)
        assert (rt.journal.signals_held, rt.journal.signal_bytes_held) == (0, 0)


def _no_answer(seq: int, ended: str | None) -> None:
    pass
