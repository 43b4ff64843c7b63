"""Event and Queue on the kernel."""

from __future__ import annotations

import pytest

from tiffany.errors import KernelError, QueueEmpty, QueueFull
from tiffany.kernel import Event, GetTid, KillTask, NewTask, Queue, Scheduler, Sleep, TaskState

from .kernel_support import Recorder, make_sched

# -- Queue -------------------------------------------------------------------------------


def test_parked_getters_are_served_in_fifo_order(sched: Scheduler) -> None:
    q: Queue[int] = Queue(name="jobs")
    got = []

    def getter(name):
        got.append((name, (yield q.get())))

    def producer():
        yield Sleep(1)
        assert q.waiting == 3
        for i in range(3):
            q.put(i)

    for name in "abc":
        sched.spawn(getter(name))
    sched.spawn(producer())
    sched.run()
    assert got == [("a", 0), ("b", 1), ("c", 2)]
    assert q.waiting == 0
    assert len(q) == 0


def test_put_hands_over_directly_to_a_parked_getter(sched: Scheduler, recorder: Recorder) -> None:
    q: Queue[str] = Queue()

    def getter():
        return (yield q.get())

    def producer():
        yield Sleep(1)
        q.put("direct")
        assert len(q) == 0  # not buffered: handed to the getter
        assert q.empty()

    g = sched.spawn(getter())
    sched.spawn(producer())
    sched.run()
    assert sched.result(g) == "direct"
    assert ("task_woken", g, "ready", "queue_get") in recorder.events


def test_buffered_items_come_out_in_order(sched: Scheduler) -> None:
    q: Queue[int] = Queue()
    for i in range(5):
        q.put(i)
    assert len(q) == 5

    def consumer():
        out = []
        for _ in range(4):
            out.append((yield q.get()))
        out.append(q.get_nowait())
        with pytest.raises(QueueEmpty):
            q.get_nowait()
        return out

    tid = sched.spawn(consumer())
    sched.run()
    assert sched.result(tid) == [0, 1, 2, 3, 4]


def test_bounded_queue_raises_queue_full(sched: Scheduler) -> None:
    q: Queue[int] = Queue(maxsize=2)
    q.put(1)
    q.put(2)
    with pytest.raises(QueueFull) as info:
        q.put(3)
    assert info.value.fields["maxsize"] == 2

    def consumer():
        a = yield q.get()
        q.put(3)  # room again
        return a, (yield q.get()), (yield q.get())

    tid = sched.spawn(consumer())
    sched.run()
    assert sched.result(tid) == (1, 2, 3)


def test_producer_consumer_pipeline(sched: Scheduler) -> None:
    q: Queue[int | None] = Queue()
    total = []

    def producer(n):
        for i in range(n):
            q.put(i)
            if i % 7 == 0:
                yield Sleep(0.1)
        q.put(None)

    def consumer():
        s = 0
        while (item := (yield q.get())) is not None:
            s += item
        total.append(s)

    sched.spawn(consumer())
    sched.spawn(producer(1000))
    sched.run()
    assert total == [sum(range(1000))]


def test_killed_getter_does_not_swallow_an_item(sched: Scheduler) -> None:
    q: Queue[str] = Queue()
    got = []

    def getter(name):
        got.append((name, (yield q.get())))

    def main():
        a = yield NewTask(getter("a"))
        yield NewTask(getter("b"))
        yield Sleep(1)
        yield KillTask(a)
        q.put("item")

    sched.spawn(main())
    sched.run()
    assert got == [("b", "item")]


# -- Event -------------------------------------------------------------------------------


def test_event_set_wakes_all_waiters_in_order(sched: Scheduler) -> None:
    ev = Event(name="go")
    woke = []

    def waiter(i):
        assert (yield ev.wait()) is True
        woke.append((i, sched.clock.monotonic()))

    def setter():
        yield Sleep(2)
        assert not ev.is_set()
        ev.set()
        assert ev.is_set()

    for i in range(4):
        sched.spawn(waiter(i))
    sched.spawn(setter())
    sched.run()
    assert woke == [(i, 2) for i in range(4)]


def test_event_wait_on_a_set_event_returns_at_once_and_clear_rearms(
    sched: Scheduler, recorder: Recorder
) -> None:
    ev = Event()
    ev.set()
    log = []

    def task():
        log.append((yield ev.wait()))
        ev.clear()
        yield NewTask(setter())
        log.append((yield ev.wait()))

    def setter():
        yield Sleep(1)
        ev.set()

    tid = sched.spawn(task())
    sched.run()
    assert log == [True, True]
    assert [e for e in recorder.of(tid) if e[0] == "task_blocked"] == [
        ("task_blocked", "blocked_sync", "event_wait")
    ]


def test_killed_event_waiter_is_removed(sched: Scheduler) -> None:
    ev = Event()
    woke = []

    def waiter(i):
        yield ev.wait()
        woke.append(i)

    def main():
        a = yield NewTask(waiter(0))
        yield NewTask(waiter(1))
        yield Sleep(1)
        yield KillTask(a)
        ev.set()

    sched.spawn(main())
    sched.run()
    assert woke == [1]


@pytest.mark.parametrize("kind", ["queue", "event"])
def test_primitive_used_from_two_schedulers_raises_in_the_task(kind: str) -> None:
    q: Queue[int] = Queue()
    ev = Event()

    def block():
        if kind == "queue":
            yield q.get()
        else:
            yield ev.wait()

    def release():
        yield Sleep(1)
        if kind == "queue":
            q.put(1)
        else:
            ev.set()
            ev.clear()

    first, _rec, _clock = make_sched()
    first.spawn(block())
    first.spawn(release())
    first.run()  # binds the primitive to ``first``
    first.close()

    second, _rec, _clock = make_sched()
    errors = []

    def other():
        try:
            yield block()
        except KernelError as exc:
            errors.append(exc)

    tid = second.spawn(other())
    second.run()
    second.close()
    assert len(errors) == 1
    assert second.task(tid).state is TaskState.DONE
    assert "two schedulers" in str(errors[0])


def test_reused_call_objects_allocate_nothing(sched: Scheduler) -> None:
    q: Queue[int] = Queue()
    ev = Event()
    assert q.get() is q.get()
    assert ev.wait() is ev.wait()
    assert repr(q).startswith("<Queue")
    assert "set=False" in repr(ev)

    def task():
        yield GetTid()

    sched.spawn(task())
    sched.run()


def test_an_item_handed_to_a_getter_killed_before_it_runs_is_not_lost() -> None:
    from tiffany.kernel import KillTask, NewTask, Scheduler

    q: Queue = Queue()
    got = []

    def getter():
        got.append((yield q.get()))

    def main():
        g1 = yield NewTask(getter())
        yield  # g1 parks on the queue
        q.put("precious")  # handed straight to g1...
        yield KillTask(g1)  # ...which is killed before it runs
        g2 = yield NewTask(getter())
        yield
        yield
        return g2

    with Scheduler() as sched:
        sched.spawn(main())
        sched.run()
    assert got == ["precious"]
    assert len(q) == 0
