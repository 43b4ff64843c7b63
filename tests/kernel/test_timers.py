"""D4: Sleep and timers on the manual clock (and one check on the real clock)."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from tiffany.kernel import (
    KillTask,
    ManualClock,
    MonotonicClock,
    NewTask,
    Now,
    Scheduler,
    Sleep,
    TaskState,
)

from .kernel_support import Recorder, make_sched, spin


def test_sleep_wakes_at_the_right_virtual_time(sched: Scheduler, clock: ManualClock) -> None:
    seen = []

    def sleeper():
        t0 = yield Now()
        seen.append(("start", clock.monotonic(), t0))
        yield Sleep(2.5)
        seen.append(("woke", clock.monotonic(), (yield Now())))
        yield Sleep(60)
        seen.append(("woke", clock.monotonic(), (yield Now())))

    started = time.perf_counter()
    sched.spawn(sleeper())
    sched.run()
    assert time.perf_counter() - started < 1.0  # virtual minutes, real milliseconds
    epoch = 1_700_000_000.0
    assert seen == [
        ("start", 0.0, epoch),
        ("woke", 2.5, epoch + 2.5),
        ("woke", 62.5, epoch + 62.5),
    ]


def test_timers_fire_in_deadline_order_ties_in_fifo(sched: Scheduler) -> None:
    woke = []

    def sleeper(name, seconds):
        yield Sleep(seconds)
        woke.append((name, sched.clock.monotonic()))

    plan = [("a", 3), ("b", 1), ("c", 2), ("d", 1), ("e", 3), ("f", 0.5), ("g", 1)]
    for name, seconds in plan:
        sched.spawn(sleeper(name, seconds))
    sched.run()
    assert woke == [
        ("f", 0.5),
        ("b", 1),
        ("d", 1),
        ("g", 1),
        ("c", 2),
        ("a", 3),
        ("e", 3),
    ]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=30))
def test_wake_order_is_deadline_then_spawn_order(durations: list[int]) -> None:
    sched, _rec, clock = make_sched()
    woke = []

    def sleeper(i, seconds):
        yield Sleep(seconds)
        woke.append((clock.monotonic(), i))

    for i, d in enumerate(durations):
        sched.spawn(sleeper(i, d))
    sched.run()
    sched.close()
    assert woke == sorted((float(d), i) for i, d in enumerate(durations))


def test_sleep_zero_is_a_cooperative_yield(sched: Scheduler, recorder: Recorder) -> None:
    log = []

    def worker(name):
        for i in range(3):
            log.append((name, i))
            yield Sleep(0)

    a = sched.spawn(worker("A"))
    b = sched.spawn(worker("B"))
    sched.run()
    assert log == [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)]
    assert recorder.turns() == [a, b] * 4
    assert sched.clock.monotonic() == 0
    assert not recorder.hooks("task_blocked")  # never parked on a timer


def test_negative_sleep_is_rejected() -> None:
    try:
        Sleep(-1)
    except ValueError:
        pass
    else:  # pragma: no cover
        raise AssertionError("Sleep(-1) accepted")


def test_clock_does_not_jump_while_tasks_are_ready(sched: Scheduler, clock: ManualClock) -> None:
    seen = []

    def sleeper():
        yield Sleep(1)
        seen.append(("sleeper", clock.monotonic()))

    def busy():
        for _ in range(50):
            yield
        seen.append(("busy", clock.monotonic()))

    sched.spawn(sleeper())
    sched.spawn(busy())
    sched.run()
    assert seen == [("busy", 0.0), ("sleeper", 1.0)]


def test_manual_advance_without_autojump_fires_due_timers() -> None:
    clock = ManualClock(autojump=False)
    sched = Scheduler(clock=clock)
    woke = []

    def sleeper():
        yield Sleep(5)
        woke.append(clock.monotonic())

    def ticker():
        for _ in range(10):
            clock.advance(1)
            yield

    sched.spawn(sleeper())
    sched.spawn(ticker())
    sched.run()
    sched.close()
    # The timer fires at the wait stage after the ticker reached 5; in the next
    # pass the ticker (queued first) advances once more before the sleeper runs.
    assert woke == [6.0]


def test_killed_sleeper_timer_does_not_keep_the_loop_alive(
    sched: Scheduler, clock: ManualClock
) -> None:
    def sleeper():
        yield Sleep(1000)

    def main():
        tid = yield NewTask(sleeper())
        yield Sleep(1)
        yield KillTask(tid)

    tid = sched.spawn(main())
    sched.run()
    assert sched.task(tid).state is TaskState.DONE
    assert clock.monotonic() == 1  # did not wait for the dead timer at t=1000


def test_many_timers_with_cancellations_stay_ordered(sched: Scheduler) -> None:
    # Enough cancelled entries to trigger the heap compaction.
    woke = []

    def sleeper(i):
        yield Sleep(10 + i)
        woke.append(i)

    def main():
        tids = []
        for i in range(300):
            tids.append((yield NewTask(sleeper(i))))
        yield Sleep(1)
        for tid in tids[::2]:
            yield KillTask(tid)
        yield Sleep(1)
        for tid in tids[1::4]:
            yield KillTask(tid)

    sched.spawn(main())
    sched.run()
    expected = [i for i in range(300) if i % 2 == 1 and i % 4 != 1]
    assert woke == expected
    assert sched.clock.monotonic() == 10 + expected[-1]


def test_idle_sleeping_loop_uses_almost_no_cpu() -> None:
    sched = Scheduler(clock=MonotonicClock())

    def sleeper():
        yield Sleep(0.5)

    sched.spawn(sleeper())
    wall0, cpu0 = time.monotonic(), time.process_time()
    sched.run()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    sched.close()
    assert wall >= 0.5
    assert cpu < 0.05, f"the idle loop burned {cpu:.3f} s of CPU in {wall:.3f} s"


def test_immediate_resume_budget_does_not_starve_sleepers(sched: Scheduler) -> None:
    # A task looping on Now() still lets a due timer's task run.
    order = []

    def looper():
        for _ in range(5):
            for _ in range(150):
                yield Now()
            order.append("loop")
        yield

    def sleeper():
        yield Sleep(0)
        order.append("sleeper")

    sched.spawn(looper())
    sched.spawn(sleeper())
    sched.spawn(spin(1))
    sched.run()
    assert order.index("sleeper") < order.index("loop") + 2
