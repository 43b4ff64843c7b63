"""The PAL hub: ordering, resume, gone, slow-subscriber cut-off, bounded memory."""

from __future__ import annotations

import json

from tiffany.pal import Hub


def _events(frames):
    return [json.loads(f) for f in frames]


def test_events_get_strictly_increasing_seqs_and_the_v1_schema():
    hub = Hub(seq0=1000)
    sub = hub.subscribe()
    for i in range(5):
        hub.publish("step", task_id=i, task="t", label=f"#{i}", data={"i": i})
    hub.drain()
    events = _events(sub.get(timeout=0))
    assert [e["seq"] for e in events] == [1000, 1001, 1002, 1003, 1004]
    first = events[0]
    assert first["v"] == 1
    assert set(first) == {
        "v",
        "seq",
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
