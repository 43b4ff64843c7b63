"""RunInThread: blocking work off the loop thread."""

from __future__ import annotations

import threading
import time

import pytest

from tiffany.kernel import (
    KillTask,
    ManualClock,
    MonotonicClock,
    NewTask,
    RunInThread,
    Scheduler,
    Sleep,
    Step,
    TaskState,
    WaitTask,
)
from tiffany.kernel.threads import ThreadPool

from .kernel_support import Recorder


def test_result_is_delivered(sched: Scheduler) -> None:
    def task():
        return (yield RunInThread(lambda a, b: (a + b, threading.current_thread().name), 2, 3))

    main = threading.current_thread().name
    tid = sched.spawn(task())
    sched.run()
    value, thread = sched.result(tid)
    assert value == 5
    assert thread != main
    assert thread.startswith("tiffany-pool-")


@pytest.mark.parametrize("call", [RunInThread, Step], ids=["in the pool", "a helped step"])
def test_exception_is_raised_in_the_task(sched: Scheduler, call: type) -> None:
    """From a worker, or from a lone step's call on the loop's thread (kernel/sysmon.py)."""

    def fails():
        raise ZeroDivisionError("in thread")

    def task():
        try:
            yield call(fails)
        except ZeroDivisionError as exc:
            return str(exc)

    tid = sched.spawn(task())
    sched.run()
    assert sched.result(tid) == "in thread"


def test_several_concurrent_calls_run_in_parallel() -> None:
    n = 4
    barrier = threading.Barrier(n, timeout=2)
    sched = Scheduler(clock=ManualClock(), max_threads=n)

    def blocking(i):
        barrier.wait()  # deadlocks unless all n calls run at the same time
        return i * i

    def task(i):
        return (yield RunInThread(blocking, i))

    try:
        tids = [sched.spawn(task(i)) for i in range(n)]
        sched.run()
    finally:
        sched.close()
    assert [sched.result(t) for t in tids] == [i * i for i in range(n)]


def test_more_calls_than_threads_all_complete(sched: Scheduler) -> None:
    def task(i):
        return (yield RunInThread(time.sleep, 0.001)), i

    tids = [sched.spawn(task(i)) for i in range(40)]
    sched.run()
    assert [sched.result(t) for t in tids] == [(None, i) for i in range(40)]


def test_loop_keeps_running_other_tasks_while_a_thread_blocks(
    sched: Scheduler, recorder: Recorder
) -> None:
    done = []
    count = [0]

    def blocker():
        yield RunInThread(time.sleep, 0.2)
        done.append(count[0])

    def counter():
        while not done:
            count[0] += 1
            yield

    sched.spawn(blocker())
    sched.spawn(counter())
    t0 = time.monotonic()
    sched.run()
    assert time.monotonic() - t0 >= 0.2
    assert done[0] > 100, "the loop stalled while the thread slept"


def test_thread_starts_after_the_commit_point(sched: Scheduler) -> None:
    # The job is released only after before_wait (the journal's group commit).
    started = threading.Event()
    at_commit = []

    class Commit(Recorder):
        def before_wait(self, timeout):
            if not at_commit:
                time.sleep(0.05)  # time enough for a thread released too early
            at_commit.append(started.is_set())

    sched.add_instrument(Commit())

    def task():
        yield RunInThread(started.set)

    sched.spawn(task())
    sched.run()
    assert started.is_set()
    assert at_commit[0] is False


def test_kill_a_task_blocked_in_run_in_thread(sched: Scheduler) -> None:
    gate = threading.Event()
    finished = threading.Event()
    log = []

    def slow():
        gate.wait(5)
        finished.set()
        return "discarded"

    def target():
        try:
            log.append((yield RunInThread(slow)))
        finally:
            log.append("finally")

    def main():
        tid = yield NewTask(target())
        yield
        yield
        assert sched.task(tid).state is TaskState.BLOCKED_THREAD
        assert (yield KillTask(tid)) is True
        gate.set()
        try:
            yield WaitTask(tid)
        except Exception as exc:
            log.append(type(exc).__name__)
        yield Sleep(0)

    sched.spawn(main())
    sched.run()
    assert finished.is_set()  # run() waited for the thread's completion
    assert log == ["finally", "TaskKilled"]


def test_thread_with_manual_clock_timers(sched: Scheduler, clock: ManualClock) -> None:
    # A blocking thread while another task sleeps on the manual clock.
    log = []

    def sleeper():
        yield Sleep(10)
        log.append(("slept", clock.monotonic()))

    def threaded():
        log.append(("thread", (yield RunInThread(time.sleep, 0.05))))

    sched.spawn(sleeper())
    sched.spawn(threaded())
    sched.run()
    assert sorted(log) == [("slept", 10.0), ("thread", None)]


def test_thread_pool_starts_a_worker_per_concurrent_job() -> None:
    # Jobs submitted while the first workers are still starting up must not
    # queue behind a busy worker when the pool may start more.
    for _ in range(20):
        pool = ThreadPool(4)
        gate = threading.Event()
        for i in range(4):
            pool.submit(i, gate.wait, (5,))
        assert len(pool._threads) == 4
        gate.set()
        pool.close()


def test_thread_pool_reuses_idle_workers() -> None:
    pool = ThreadPool(4)
    for i in range(10):
        pool.submit(i, int, ())
        deadline = time.monotonic() + 5
        while not pool._done and time.monotonic() < deadline:
            time.sleep(0.001)
        pool.drain()
        time.sleep(0.005)  # let the worker get back to its queue
    assert len(pool._threads) <= 2  # never more than one job at a time
    pool.close()


def test_thread_pool_unit() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        ThreadPool(0)
    pool = ThreadPool(2)
    pool.submit("a", lambda: 1, ())
    pool.submit("b", lambda: 1 / 0, ())
    deadline = time.monotonic() + 5
    got = []
    while len(got) < 2 and time.monotonic() < deadline:
        got.extend(pool.drain())
        time.sleep(0.001)
    pool.close()
    by_token = {token: (value, exc) for token, value, exc in got}
    assert by_token["a"] == (1, None)
    assert isinstance(by_token["b"][1], ZeroDivisionError)
    with pytest.raises(RuntimeError):
        pool.submit("c", lambda: 1, ())


def test_real_clock_sleep_and_thread() -> None:
    sched = Scheduler(clock=MonotonicClock())
    log = []

    def a():
        yield Sleep(0.05)
        log.append("sleep")

    def b():
        yield RunInThread(time.sleep, 0.1)
        log.append("thread")

    sched.spawn(a())
    sched.spawn(b())
    sched.run()
    sched.close()
    assert log == ["sleep", "thread"]


def test_kill_before_the_thread_job_is_released(sched: Scheduler) -> None:
    ran = []

    def target():
        yield RunInThread(ran.append, "ran")

    def killer(tid):
        return (yield KillTask(tid))  # same pass: the job is still in the outbox

    t = sched.spawn(target())
    k = sched.spawn(killer(t))
    sched.run()
    assert sched.result(k) is True
    assert sched.task(t).state is TaskState.CANCELLED
    assert ran == []  # the job never started
    assert sched._reactor.threads_pending == 0


def test_held_effects_wait_for_the_commit_that_releases_them(sched: Scheduler) -> None:
    """While ``hold_effects()`` is in force at the commit point, steps stay queued."""
    from tiffany.kernel import Instrument, Step

    events: list[str] = []

    class DeferringCommit(Instrument):
        def __init__(self) -> None:
            self.waits = 0

        def before_wait(self, timeout: float | None) -> None:
            self.waits += 1
            if self.waits < 3 and sched.ready_count:
                events.append("deferred")
                sched.hold_effects()
            else:
                events.append("commit")
                sched.release_effects()

    def quick(tag: str) -> str:
        events.append(f"ran {tag}")
        return tag

    def stepper(tag: str, inline: bool):
        return (yield Step(quick, tag, inline=inline))

    def busy():
        for _ in range(5):
            yield

    sched.add_instrument(DeferringCommit())
    a = sched.spawn(stepper("inline", True))
    b = sched.spawn(stepper("pool", False))
    sched.spawn(busy())
    sched.run()
    assert (sched.result(a), sched.result(b)) == ("inline", "pool")
    first_run = min(events.index("ran inline"), events.index("ran pool"))
    assert events[:2] == ["deferred", "deferred"]
    assert "commit" in events[:first_run]


@pytest.mark.parametrize("inline", [True, False])
def test_a_timed_step_returns_its_clock_readings(inline: bool) -> None:
    from tiffany.kernel import Step

    clock = ManualClock(start=5.0, epoch=1_000.0)

    def work(x: int) -> int:
        return x * 2

    def fails() -> None:
        raise ValueError("nope")

    def task():
        value = yield Step(work, 21, inline=inline, timed=True)
        try:
            yield Step(fails, inline=inline, timed=True)
        except ValueError as exc:
            return value, str(exc)
        return value, None

    with Scheduler(clock=clock) as sched:
        tid = sched.spawn(task())
        sched.run()
        (value, started, ended), error = sched.result(tid)
    assert (value, error) == (42, "nope")
    assert started == ended == 1_000.0  # the manual clock did not move


def test_a_chain_through_the_pool_waits_once_a_step(sched: Scheduler) -> None:
    # A thread job released at a wait stage is pending from that stage on:
    # the stage blocks for its completion (timeout None, as the commit hook
    # hears) instead of polling once for nothing and waiting in a second,
    # empty pass (what it did: two passes and two epoll calls a step).
    waits = Recorder()
    sched.add_instrument(waits)

    def chain():
        x = 0
        for _ in range(50):
            x = yield RunInThread(lambda v: v + 1, x)
        return x

    tid = sched.spawn(chain())
    sched.run()
    assert sched.result(tid) == 50
    timeouts = [e[1] for e in waits.events if e[0] == "before_wait"]
    # One stage a step, and the last one (nothing left to wait for).
    assert timeouts == [None] * 51, timeouts


def test_an_inline_step_in_the_outbox_still_polls(sched: Scheduler) -> None:
    # An inline step makes its task ready when it is released, so the stage
    # that releases it must not block (the task would wait for an event).
    waits = Recorder()
    sched.add_instrument(waits)

    def chain():
        x = 0
        for _ in range(5):
            x = yield Step(lambda v: v + 1, x, inline=True)
        return x

    tid = sched.spawn(chain())
    t0 = time.monotonic()
    sched.run()
    assert sched.result(tid) == 5
    assert time.monotonic() - t0 < 30
    timeouts = [e[1] for e in waits.events if e[0] == "before_wait"]
    assert timeouts[:5] == [0.0] * 5, timeouts  # then the last stage: nothing left
