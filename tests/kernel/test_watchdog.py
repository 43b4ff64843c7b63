"""SlowDispatchWatchdog: reports dispatches that hold the loop too long."""

from __future__ import annotations

import time

import structlog

from tiffany.kernel import Instrument, ManualClock, Scheduler, Sleep, SlowDispatchWatchdog

from .kernel_support import spin


class FakeTimer:
    """A perf_counter the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def crunch_numbers(timer: FakeTimer, seconds: float):
    timer.now += seconds  # "computes" for that long without yielding
    yield


def test_slow_dispatch_reported_with_task_name_and_stack() -> None:
    timer = FakeTimer()
    seen = []
    dog = SlowDispatchWatchdog(threshold_s=0.1, timer=timer, on_report=seen.append)
    sched = Scheduler(clock=ManualClock(), instruments=[dog])

    def slow_task():
        yield Sleep(1)
        yield crunch_numbers(timer, 0.25)

    def fast_task():
        for _ in range(5):
            timer.now += 0.01
            yield

    with structlog.testing.capture_logs() as logs:
        slow = sched.spawn(slow_task(), name="slow")
        sched.spawn(fast_task(), name="fast")
        sched.spawn(spin(20), name="idle")
        sched.run()
    sched.close()
    assert dog.stalls == 1
    assert len(dog.reports) == 1
    report = dog.reports[0]
    assert seen == [report]
    assert report.tid == slow
    assert report.name == "slow"
    assert abs(report.duration_s - 0.25) < 1e-9
    assert abs(dog.longest_s - 0.25) < 1e-9
    assert report.yielded == "None"
    functions = [fn for fn, _path, _line in report.stack]
    assert functions[-1].endswith("crunch_numbers")
    assert any(fn.endswith("slow_task") for fn in functions)
    events = [e for e in logs if e["event"] == "kernel.slow_dispatch"]
    assert len(events) == 1
    assert events[0]["name"] == "slow"
    assert events[0]["tid"] == slow
    assert events[0]["log_level"] == "warning"
    assert events[0]["duration_ms"] == 250.0
    assert events[0]["threshold_ms"] == 100.0
    assert any("crunch_numbers" in frame for frame in events[0]["frames"])


def test_time_blocked_in_the_wait_stage_is_not_a_stall() -> None:
    timer = FakeTimer()

    class SlowSelector(Instrument):
        def before_wait(self, timeout):
            timer.now += 5.0  # the loop sat in the selector for five seconds

    dog = SlowDispatchWatchdog(threshold_s=0.1, timer=timer)
    sched = Scheduler(clock=ManualClock(), instruments=[SlowSelector(), dog])

    def sleeper():
        for _ in range(3):
            yield Sleep(10)

    sched.spawn(sleeper())
    sched.run()
    sched.close()
    assert dog.stalls == 0
    assert dog.longest_s < 0.1


def test_fast_dispatches_are_not_reported() -> None:
    dog = SlowDispatchWatchdog(threshold_s=0.1)
    sched = Scheduler(clock=ManualClock(), instruments=[dog])
    for _ in range(50):
        sched.spawn(spin(10))
    with structlog.testing.capture_logs() as logs:
        sched.run()
    sched.close()
    assert dog.stalls == 0
    assert not [e for e in logs if e["event"] == "kernel.slow_dispatch"]


def busy_loop(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def test_real_busy_loop_is_reported() -> None:
    dog = SlowDispatchWatchdog(threshold_s=0.1)
    sched = Scheduler(clock=ManualClock(), instruments=[dog])

    def hog():
        yield
        busy_loop(0.15)
        yield

    with structlog.testing.capture_logs() as logs:
        tid = sched.spawn(hog(), name="hog")
        for _ in range(5):
            sched.spawn(spin(3))
        sched.run()
    sched.close()
    assert dog.stalls == 1
    report = dog.reports[0]
    assert report.tid == tid
    assert report.name == "hog"
    assert report.duration_s >= 0.15
    assert [fn for fn, _p, _l in report.stack] == ["test_real_busy_loop_is_reported.<locals>.hog"]
    assert [e["name"] for e in logs if e["event"] == "kernel.slow_dispatch"] == ["hog"]


def test_reports_are_bounded_but_stalls_counted() -> None:
    timer = FakeTimer()
    dog = SlowDispatchWatchdog(threshold_s=0.1, timer=timer)
    sched = Scheduler(clock=ManualClock(), instruments=[dog])

    def stalls(n):
        for _ in range(n):
            timer.now += 0.2
            yield

    sched.spawn(stalls(150))
    with structlog.testing.capture_logs():
        sched.run()
    sched.close()
    assert dog.stalls == 150
    assert len(dog.reports) == 100
