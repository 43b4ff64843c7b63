"""The PAL hub: ordering, resume, gone, slow-subscriber cut-off, bounded memory."""

from __future__ import annotations

import json
import time

from tiffany.feed import FEED_SEQ_FILE, SEQS_PER_RECORD, Hub
from tiffany.feed.events import TaskFields


def _events(frames):
    return [json.loads(f) for f in frames]


def test_events_get_strictly_increasing_seqs_and_the_v2_schema():
    hub = Hub(seq0=1000)
    sub = hub.subscribe()
    for i in range(5):
        hub.publish("step", task_id=i, task="t", label=f"#{i}", data={"i": i})
    hub.drain()
    events = _events(sub.get(timeout=0))
    assert [e["seq"] for e in events] == [1000, 1001, 1002, 1003, 1004]
    first = events[0]
    assert first["v"] == 2
    assert first["wal_seq"] == 0  # no WAL: no record before it
    assert set(first) == {
        "v",
        "seq",
        "wal_seq",
        "engine",
        "ts",
        "kind",
        "task_id",
        "ltid",
        "run_id",
        "task",
        "task_kind",
        "step_id",
        "label",
        "data",
    }
    assert first["data"] == {"i": 0}
    assert first["engine"] == 0


def test_resume_with_since_is_gapless_and_filters_apply():
    hub = Hub(seq0=1)
    for i in range(10):
        hub.publish("step", run_id="a" if i % 2 else "b", task_id=i)
    hub.drain()
    sub = hub.subscribe(since=4, flt=lambda e: e.run_id == "a")
    for i in range(10, 14):
        hub.publish("step", run_id="a" if i % 2 else "b", task_id=i)
    hub.drain()
    got = _events(sub.get(timeout=0))
    assert [e["seq"] for e in got] == [6, 8, 10, 12, 14]
    assert all(e["run_id"] == "a" for e in got)


def test_a_resume_older_than_the_ring_gets_gone():
    hub = Hub(ring_size=5, seq0=1)
    for _ in range(20):
        hub.publish("step")
    hub.drain()
    frames = _events(hub.subscribe(since=3).get(timeout=0))
    assert frames == [{"type": "gone", "oldest": 16}]
    ok = _events(hub.subscribe(since=17).get(timeout=0))
    assert [e["seq"] for e in ok] == [18, 19, 20]


def test_a_slow_subscriber_is_cut_off_without_hurting_others():
    hub = Hub(seq0=1)
    slow = hub.subscribe(maxlen=10)
    fast = hub.subscribe(maxlen=1000)
    got_fast = []
    for _ in range(5):
        for _ in range(20):
            hub.publish("step")
        hub.drain()
        got_fast += _events(fast.get(timeout=0))
    frames = _events(slow.get(timeout=0))
    assert frames[-1]["type"] == "cutoff"
    # It never read anything: the cutoff says so (its queued frames are dropped).
    assert frames[-1]["last_seq"] == 0
    assert slow.closed
    assert len(slow.frames) == 0
    assert [e["seq"] for e in got_fast] == list(range(1, 101))
    assert hub.subscribers == 1
    assert hub.dropped_subscribers == 1
    # it resumes from where it was cut off, gapless
    again = hub.subscribe(since=frames[-1]["last_seq"])
    assert [e["seq"] for e in _events(again.get(timeout=0))] == list(range(1, 101))


def test_the_hub_thread_delivers_within_milliseconds():
    hub = Hub()
    hub.start()
    try:
        sub = hub.subscribe()
        hub.publish("spawned", task="x")
        frames = sub.get(timeout=2)
        assert _events(frames)[0]["kind"] == "spawned"
    finally:
        hub.stop()


def test_a_resume_far_behind_is_not_cut_off_by_its_backlog() -> None:
    hub = Hub(ring_size=1_000, seq0=1)
    for i in range(500):
        hub.publish("step", label=str(i))
    hub.drain()
    sub = hub.subscribe(since=1, maxlen=50)  # 499 events of backlog, 10x the live bound
    got = sub.get(0)
    assert not sub.closed
    assert len(got) == 499
    # Live frames beyond the bound still cut it off.
    for _ in range(60):
        hub.publish("step")
    hub.drain()
    assert sub.closed
    sub.close()


def test_a_cutoff_names_the_last_event_delivered_not_the_last_queued() -> None:
    import msgspec

    hub = Hub(ring_size=1_000, seq0=1)
    sub = hub.subscribe(maxlen=5)
    for _ in range(3):
        hub.publish("step")
    hub.drain()
    delivered = sub.get(0)
    last = msgspec.json.decode(delivered[-1])["seq"]
    for _ in range(10):  # queued, never read: overflows
        hub.publish("step")
    hub.drain()
    frames = sub.get(0)
    cutoff = msgspec.json.decode(frames[-1])
    assert cutoff["type"] == "cutoff"
    assert cutoff["last_seq"] == last


class FakeWal:
    """The WAL's position as the hub reads it (``next_seq``), moved by hand."""

    def __init__(self, next_seq: int) -> None:
        self.next_seq = next_seq

    def append(self, n: int = 1) -> int:
        """Write ``n`` records; return the last one's seq."""
        self.next_seq += n
        return self.next_seq - 1


def test_events_carry_the_wal_seq_and_keys_jump_to_each_new_record(tmp_path):
    wal = FakeWal(next_seq=8)
    hub = Hub(wal=wal, seq_file=tmp_path / FEED_SEQ_FILE)
    sub = hub.subscribe()
    hub.publish("spawned")  # after record 7
    hub.publish("step")
    at = wal.append()  # record 8 carries the next dispatch
    hub.publish("step")
    hub.publish("run.started", wal_seq=wal.next_seq)  # announces record 9
    hub.publish("woke")  # published before record 9 is written: not below the last
    hub.drain()
    got = _events(sub.get(timeout=0))
    assert [e["wal_seq"] for e in got] == [7, 7, at, 9, 9]
    k = SEQS_PER_RECORD
    assert [e["seq"] for e in got] == [8 * k, 8 * k + 1, 8 * k + 2, 9 * k, 9 * k + 1]
    assert [e["v"] for e in got] == [2] * 5


def test_seqs_survive_a_restart_with_the_clock_stepped_back(tmp_path, monkeypatch):
    """No wall clock orders the feed: a client resuming after a restart gets the new events."""
    seq_file = tmp_path / FEED_SEQ_FILE
    wal = FakeWal(next_seq=3)
    hub = Hub(wal=wal, seq_file=seq_file)
    for _ in range(3):
        hub.publish("step")  # events after the WAL's last record: only the seq file orders them
    hub.drain()
    hub.stop()
    last = hub.last_seq

    # The engine comes back a day earlier by the wall clock, and wrote nothing in between.
    real_time = time.time  # noqa: TID251 - the test steps the wall clock back
    monkeypatch.setattr(time, "time", lambda: real_time() - 86_400)
    hub2 = Hub(wal=wal, seq_file=seq_file)
    resumed = hub2.subscribe(since=last)  # a client that saw everything of the first life
    hub2.publish("step")
    wal.append()
    hub2.publish("exit")
    hub2.drain()
    got = _events(resumed.get(timeout=0))
    assert [e["kind"] for e in got] == ["step", "exit"]  # no gone: nothing was missed
    assert got[0]["seq"] > last
    assert got[1]["seq"] > got[0]["seq"]
    assert got[0]["ts"] < real_time() - 80_000  # the clock did step back
    # a client that missed the end of the first life is told so, then gets the new events
    behind = _events(hub2.subscribe(since=last - 1).get(timeout=0))
    assert behind[0]["type"] == "gone"
    hub2.stop()


def test_without_a_seq_file_a_restart_still_starts_above_the_wal(tmp_path):
    wal = FakeWal(next_seq=5)
    hub = Hub(wal=wal)
    hub.publish("step")
    hub.drain()
    wal.append(2)
    hub2 = Hub(wal=wal)
    hub2.publish("step")
    hub2.drain()
    assert hub2.last_seq > hub.last_seq
    assert hub2.last_seq == wal.next_seq * SEQS_PER_RECORD


def test_a_resume_after_a_restart_gets_the_events_published_before_it(tmp_path):
    """A relay that reconnects after the new engine's first events misses none of them."""
    seq_file = tmp_path / FEED_SEQ_FILE
    wal = FakeWal(next_seq=3)
    hub = Hub(wal=wal, seq_file=seq_file)
    hub.publish("run.started", wal_seq=wal.next_seq)
    wal.append()
    hub.publish("step")
    hub.drain()
    hub.stop()
    last = hub.last_seq  # the relay saw everything of the first life

    hub2 = Hub(wal=wal, seq_file=seq_file)
    hub2.publish("run.started", wal_seq=wal.next_seq)  # a new run, before the relay is back
    wal.append()
    hub2.publish("step")
    hub2.drain()
    got = _events(hub2.subscribe(since=last).get(timeout=0))
    assert [e["kind"] for e in got] == ["run.started", "step"]  # no gone
    # With records in the WAL after the mark's (a mark that lost its last
    # writes), nothing below the WAL's end resumes gaplessly.
    hub2.stop()
    wal.append(3)
    hub3 = Hub(wal=wal, seq_file=seq_file)
    assert _events(hub3.subscribe(since=hub2.last_seq).get(timeout=0))[0]["type"] == "gone"
    hub3.stop()


def test_a_task_event_is_the_event_publish_makes_and_filters_see_it():
    """``publish_task`` (the activity log's path) writes what ``publish`` would."""
    hub = Hub(seq0=1)
    everything = hub.subscribe()
    only_b = hub.subscribe(flt=lambda e: e.run_id == "b")
    ids = {
        "task_id": 7,
        "ltid": None,
        "run_id": "b",
        "task": 'worker:"quoted" \u00e9',
        "task_kind": "worker",
        "step_id": "s1",
    }
    task = TaskFields(**ids)
    hub.publish("step", label="sleep 2s", data={"n": [1, 2]}, **ids)
    hub.publish_task("step", task, "sleep 2s", {"n": [1, 2]})
    hub.publish_task("woke", task, "woke")
    hub.publish_task("woke", TaskFields(8, 2, "a", "t", "task", None), "woke")
    hub.drain()
    slow, fast, woke, other = _events(everything.get(timeout=0))
    for event in (slow, fast):
        del event["seq"], event["ts"]
    assert fast == slow
    assert (woke["data"], woke["ltid"], woke["step_id"]) == ({}, None, "s1")
    assert (other["ltid"], other["run_id"]) == (2, "a")
    assert [e["seq"] for e in _events(only_b.get(timeout=0))] == [1, 2, 3]


def test_events_holding_text_with_no_utf8_form_are_sent_escaped_and_the_hub_goes_on():
    """A lone surrogate (a task named from data, an error's message) raised in the encoder.

    On the hub's thread that ended the thread (the feed stopped for every
    run); in ``TaskFields``, on the scheduler's, it disabled the activity
    log. Events now always encode, their text escaped.
    """
    from msgspec import json as msgjson

    from tiffany.feed import Event

    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    hub = Hub(seq0=1)
    sub = hub.subscribe(flt=lambda e: True)  # the filter decodes every frame as an Event
    task = TaskFields(1, 1, "run-1", "child-x\ud800", "task", None)
    hub.publish_task("crash", task, "boom x\ud800", {"message": "x\udfff", "obj": Hostile()})
    hub.publish("signal", run_id="run-1", label="x\ud800", data={"k\ud800": [2**70]})
    hub.publish("step", run_id="run-1", label="after")
    assert hub.drain() == 3
    frames = sub.get(timeout=0)
    events = [msgjson.decode(f, type=Event) for f in frames]  # valid UTF-8 JSON, as Events
    assert [e.label for e in events] == ["boom x\\ud800", "x\\ud800", "after"]
    assert events[0].task == "child-x\\ud800"
    assert events[0].data["message"] == "x\\udfff"
    assert events[0].data["obj"].endswith("Hostile object: repr() raised RuntimeError>")
    assert events[1].data == {"k\\ud800": [str(2**70)]}
