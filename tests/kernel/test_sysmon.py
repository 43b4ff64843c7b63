"""Helped steps: a lone Step(fn) runs on the loop's thread; one that blocks hands the loop over."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from tiffany.errors import InstrumentFailure
from tiffany.kernel import (
    Instrument,
    NewTask,
    RunInThread,
    Scheduler,
    Sleep,
    Step,
    WaitTask,
    current_task,
)

BOUND_S = 0.001


def test_a_lone_quick_step_runs_on_the_loops_thread_and_sees_no_current_task() -> None:
    sched = Scheduler(help_bound_s=BOUND_S)
    seen: list[tuple[int, object]] = []

    def quick(x: int) -> int:
        seen.append((threading.get_ident(), current_task()))
        return x + 1

    def chain():
        x = 0
        for _ in range(50):
            x = yield Step(quick, x)
        return x

    tid = sched.spawn(chain())
    sched.run()
    assert sched.result(tid) == 50
    assert {ident for ident, _ in seen} == {threading.get_ident()}  # no trip to a worker
    assert {task for _, task in seen} == {None}  # as on a worker: not a dispatch
    assert sched._sysmon is not None
    assert sched._sysmon.takeovers == 0
    sched.close()


def test_with_no_bound_every_step_goes_to_the_pool() -> None:
    sched = Scheduler(help_bound_s=0)
    names: list[str] = []

    def task():
        for _ in range(3):
            yield Step(lambda: names.append(threading.current_thread().name))

    sched.spawn(task())
    sched.run()
    assert len(names) == 3
    assert all(n.startswith("tiffany-pool-") for n in names)
    sched.close()


def test_run_in_thread_and_steps_beside_other_work_go_to_the_pool() -> None:
    """Only a lone Step is helped: a RunInThread is for blocking calls; two steps, neither."""
    sched = Scheduler(help_bound_s=BOUND_S)
    names: dict[str, str] = {}

    def record(key: str) -> None:
        names[key] = threading.current_thread().name

    def alone():
        yield RunInThread(record, "run_in_thread")

    def pair(key: str):
        yield Step(record, key)  # both in the same pass: two jobs, none alone

    sched.spawn(alone())
    sched.run()
    sched.spawn(pair("two at once, a"))
    sched.spawn(pair("two at once, b"))
    sched.run()
    assert all(name.startswith("tiffany-pool-") for name in names.values()), names
    assert len(names) == 3
    sched.close()


def test_a_step_that_blocks_hands_the_loop_over_and_others_run_meanwhile() -> None:
    sched = Scheduler(help_bound_s=BOUND_S)
    release = threading.Event()
    ticks: list[float] = []
    blocked_on: list[int] = []

    def blocks() -> str:
        blocked_on.append(threading.get_ident())
        # Released by the ticker, a task of this scheduler: it can only run
        # if another thread runs the loop while this call holds its thread.
        assert release.wait(60), "the loop did not run while the step blocked"
        return "done"

    def stepper():
        first = yield Step(blocks)
        second = yield Step(blocks)  # known to block now: the pool runs it
        return first, second

    def ticker():
        while len(ticks) < 5:
            yield Sleep(0.005)
            ticks.append(time.monotonic())
        release.set()

    def starter():
        yield Sleep(0.05)  # the stepper's first step is then the only thing to do
        sched.spawn(ticker())

    tid = sched.spawn(stepper())
    sched.spawn(starter())
    sched.run()
    assert sched.result(tid) == ("done", "done")
    assert len(ticks) == 5
    assert blocked_on[0] == threading.get_ident()  # helped: on the loop's own thread
    assert blocked_on[1] != threading.get_ident()  # then a worker's
    assert sched.handed_over == 1  # what /metrics shows
    assert sched._sysmon is not None
    assert not sched._sysmon.helps(blocks)  # its code goes to the pool from now on
    sched.close()


def test_a_stop_while_a_helped_step_blocks_ends_the_loop_and_starts_nothing_more() -> None:
    """The substitute takes the stop; run() returns once the blocked call does."""
    sched = Scheduler(help_bound_s=BOUND_S)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []
    got: list[object] = []

    def blocks() -> str:
        started.set()
        assert release.wait(60)
        ran.append("blocks")
        return "blocked value"

    def stepper():
        got.append((yield Step(blocks)))
        yield Step(ran.append, "after")  # never starts: the scheduler was stopped

    sched.spawn(stepper())

    def stop_then_release() -> None:
        assert started.wait(60)
        time.sleep(0.05)  # well past the bound: a substitute runs the loop
        sched.stop()
        time.sleep(0.05)
        release.set()

    t = threading.Thread(target=stop_then_release)
    t.start()
    sched.run()
    t.join(60)
    assert ran == ["blocks"]
    assert got == []  # delivered to the task, which runs when run() runs again
    assert sched._sysmon is not None
    assert sched._sysmon.takeovers == 1
    sched.run()  # effects start again
    assert got == ["blocked value"]
    assert ran == ["blocks", "after"]
    sched.close()


def test_a_failure_on_the_substitute_is_raised_by_run_on_the_callers_thread() -> None:
    sched = Scheduler(help_bound_s=BOUND_S)
    release = threading.Event()

    class Boom(Exception):
        pass

    class Fragile(Instrument):
        critical = True

        def __init__(self) -> None:
            self.armed = False

        def after_wait(self, events: int) -> None:
            if self.armed and threading.current_thread().name == "tiffany-sysmon":
                raise Boom("the journal failed on the substitute")

    fragile = Fragile()
    sched.add_instrument(fragile)

    def blocks() -> None:
        fragile.armed = True
        assert release.wait(60)

    def stepper():
        yield Step(blocks)

    sched.spawn(stepper())
    threading.Timer(0.2, release.set).start()
    with pytest.raises(InstrumentFailure, match="the journal failed on the substitute"):
        sched.run()
    sched.close()


def test_instruments_see_one_loop_thread_at_a_time() -> None:
    """Every hook runs on the loop's thread or the substitute, never on both at once."""
    sched = Scheduler(help_bound_s=BOUND_S)
    inside = threading.Lock()
    overlaps: list[str] = []
    threads: set[str] = set()

    class Watch(Instrument):
        def _hook(self, name: str) -> None:
            threads.add(threading.current_thread().name)
            if not inside.acquire(blocking=False):
                overlaps.append(name)
                return
            time.sleep(0.0002)  # widen the window a second thread would fall into
            inside.release()

        def before_dispatch(self, task) -> None:
            self._hook("before_dispatch")

        def after_wait(self, events: int) -> None:
            self._hook("after_wait")

    sched.add_instrument(Watch())
    release = threading.Event()

    def blocks() -> None:
        assert release.wait(60)

    def stepper():
        yield Step(blocks)

    def busy():
        for _ in range(200):
            yield Sleep(0.001)
        release.set()

    def starter():
        yield Sleep(0.05)
        sched.spawn(busy())

    sched.spawn(stepper())
    sched.spawn(starter())
    sched.run()
    assert overlaps == []
    assert threads == {threading.current_thread().name, "tiffany-sysmon"}
    sched.close()


def test_a_scheduler_dropped_unclosed_is_not_kept_alive_by_its_monitor() -> None:
    import gc
    import weakref

    sched = Scheduler(help_bound_s=BOUND_S)

    def task():
        yield Step(int, "1")

    sched.spawn(task())
    sched.run()
    assert sched._sysmon is not None
    assert sched._sysmon._thread is not None  # the monitor started
    ref = weakref.ref(sched)
    del sched
    gc.collect()
    assert ref() is None


def test_many_helped_calls_of_mixed_lengths_beside_timers_all_finish() -> None:
    """Takeovers and hand-backs in quick succession, fast and slow calls mixed.

    Before the call's thread cleared ``job`` first, a monitor could take the
    claim back from its own substitute (a lock is not fair) and run the loop
    again for a call that had returned: a deadlock, 1 run in ~200 here
    beside two CPU hogs.
    """
    import random  # noqa: TID251 - picks the test's durations, not task code

    rng = random.Random(20261130)

    def make(i: int):
        def f(d: float) -> float:
            end = time.perf_counter() + d
            while time.perf_counter() < end:
                if i % 2:
                    time.sleep(0.0002)  # blocks (the GIL released)
            return d

        f.__qualname__ = f"f{i}"
        return f

    fns = [make(i) for i in range(200)]

    def chain(k: int):
        total = 0.0
        for _ in range(30):
            total += yield Step(rng.choice(fns), rng.choice([0, 0, 0, 0.0005, 0.0015, 0.003]))
            if rng.random() < 0.3:
                yield Sleep(rng.choice([0, 0.001, 0.002]))
        return total

    def root():
        tids = []
        for k in range(3):
            tids.append((yield NewTask(chain(k))))
            yield Sleep(0.003)
        results = []
        for t in tids:
            results.append((yield WaitTask(t)))
        return results

    takeovers = 0
    for _ in range(15):
        sched = Scheduler(help_bound_s=BOUND_S)
        tid = sched.spawn(root())
        done = threading.Event()
        runner = threading.Thread(target=lambda s=sched, e=done: (s.run(), e.set()))
        runner.start()
        assert done.wait(60), "the loop did not finish: a hand-back was lost"
        runner.join()
        assert len(sched.result(tid)) == 3
        assert sched._sysmon is not None
        takeovers += sched._sysmon.takeovers
        sched.close()
    assert takeovers > 0  # the hand-off path ran


def test_a_call_that_returns_as_the_monitor_looks_keeps_its_wait_stage_whole() -> None:
    """The monitor holds the claim as the call returns, and lets go: no substitute ran.

    The call's thread asked the loop back and must undo that, and its wait
    stage must end as any does (``after_wait``: the journal treats wake-ups
    as external until then).
    """
    sched = Scheduler(help_bound_s=60.0)  # the real monitor never takes over here
    assert sched._sysmon is not None
    claim = sched._sysmon.claim
    stages: list[str] = []

    class Stages(Instrument):
        def before_wait(self, timeout: float | None) -> None:
            stages.append("before")

        def after_wait(self, events: int) -> None:
            stages.append("after")

    sched.add_instrument(Stages())
    held = threading.Event()

    def hold_the_claim() -> None:
        with claim:  # as the monitor does while it looks at a call
            held.set()
            time.sleep(0.05)

    def returns_while_held() -> str:
        threading.Thread(target=hold_the_claim).start()
        assert held.wait(60)
        return "value"

    def task():
        first = yield Step(returns_while_held)
        second = yield Step(str, "after")  # the loop went on normally
        return first, second

    tid = sched.spawn(task())
    sched.run()
    assert sched.result(tid) == ("value", "after")
    assert sched.handed_over == 0
    assert stages.count("before") == stages.count("after")  # every stage ended
    assert all(a != b for a, b in itertools.pairwise(stages))  # paired, in turn
    assert not sched._handback
    sched.close()
