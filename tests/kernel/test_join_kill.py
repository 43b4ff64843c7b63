"""D5 (WaitTask) and KillTask: joins, timeouts, crashes, cancellation everywhere."""

from __future__ import annotations

import os
import threading

import pytest
import structlog

from tiffany.errors import (
    KernelError,
    TaskCancelled,
    TaskCrashed,
    TaskKilled,
    UnknownTask,
    WaitTimeout,
)
from tiffany.kernel import (
    Event,
    GetTid,
    KillTask,
    NewTask,
    Queue,
    ReadWait,
    RunInThread,
    Scheduler,
    Sleep,
    TaskState,
    WaitTask,
)

from .kernel_support import Recorder, noop, spin

# -- WaitTask ------------------------------------------------------------------------


def test_wait_returns_the_child_result(sched: Scheduler) -> None:
    def child(x):
        yield Sleep(3)
        return {"x": x}

    def parent():
        tid = yield NewTask(child(7))
        return (yield WaitTask(tid)), sched.clock.monotonic()

    tid = sched.spawn(parent())
    sched.run()
    assert sched.result(tid) == ({"x": 7}, 3)


def test_wait_on_a_finished_task_returns_at_once(sched: Scheduler, recorder: Recorder) -> None:
    def parent():
        tid = yield NewTask(noop("early"))
        yield Sleep(5)
        return (yield WaitTask(tid))

    p = sched.spawn(parent())
    sched.run()
    assert sched.result(p) == "early"
    assert [e for e in recorder.of(p) if e[0] == "task_blocked"] == [
        ("task_blocked", "blocked_sleep", "sleep")
    ]


def test_wait_on_a_crashed_task_raises_task_crashed_with_cause(sched: Scheduler) -> None:
    boom = OSError("disk")
    caught = []

    def child():
        yield Sleep(1)
        raise boom

    def parent(late):
        tid = yield NewTask(child())
        if late:
            yield Sleep(2)  # the child has crashed by now: an immediate raise
        try:
            yield WaitTask(tid)
        except TaskCrashed as exc:
            caught.append(exc)

    with structlog.testing.capture_logs():
        sched.spawn(parent(False))
        sched.spawn(parent(True))
        sched.run()
    assert len(caught) == 2
    for exc in caught:
        assert exc.__cause__ is boom
        assert exc.code == "task.crashed"


def test_wait_on_a_killed_task_raises_task_killed(sched: Scheduler) -> None:
    caught = []

    def parent():
        tid = yield NewTask(Sleep_forever())
        yield NewTask(killer(tid))
        try:
            yield WaitTask(tid)
        except TaskKilled as exc:
            caught.append(exc)

    def killer(tid):
        yield Sleep(1)
        assert (yield KillTask(tid)) is True

    sched.spawn(parent())
    sched.run()
    assert len(caught) == 1
    assert isinstance(caught[0].__cause__, TaskCancelled)


def Sleep_forever():
    yield Sleep(1e9)


def test_wait_timeout_raises_and_cleans_up(sched: Scheduler, recorder: Recorder) -> None:
    log = []

    def child():
        yield Sleep(5)
        return "late"

    def parent():
        tid = yield NewTask(child())
        try:
            yield WaitTask(tid, timeout=2)
        except TimeoutError as exc:
            log.append(("timeout", sched.clock.monotonic(), type(exc), exc.fields["tid"] == tid))
        yield Sleep(10)  # the child ends at t=5 while we sleep: no early wake-up
        log.append(("slept", sched.clock.monotonic()))
        log.append(("result", (yield WaitTask(tid))))

    p = sched.spawn(parent())
    sched.run()
    assert log == [("timeout", 2, WaitTimeout, True), ("slept", 12), ("result", "late")]
    woken = [e for e in recorder.of(p) if e[0] == "task_woken"]
    assert woken == [("task_woken", "ready", "wait_task"), ("task_woken", "ready", "sleep")]


def test_wait_with_timeout_that_does_not_expire(sched: Scheduler) -> None:
    def child():
        yield Sleep(1)
        return "quick"

    def parent():
        tid = yield NewTask(child())
        return (yield WaitTask(tid, timeout=100))

    tid = sched.spawn(parent())
    sched.run()
    assert sched.result(tid) == "quick"
    # The cancelled timer neither fires later nor keeps the loop alive until t=100.
    assert sched.clock.monotonic() == 1


def test_wait_with_zero_timeout_on_a_live_task(sched: Scheduler) -> None:
    def parent():
        tid = yield NewTask(spin(3))
        with pytest.raises(WaitTimeout):
            yield WaitTask(tid, timeout=0)
        return (yield WaitTask(tid))

    tid = sched.spawn(parent())
    sched.run()
    assert sched.task(tid).state is TaskState.DONE


def test_wait_on_unknown_task_and_on_itself(sched: Scheduler) -> None:
    caught = []

    def task():
        try:
            yield WaitTask(9999)
        except UnknownTask as exc:
            caught.append(exc)
        me = yield GetTid()
        try:
            yield WaitTask(me)
        except KernelError as exc:
            caught.append(exc)

    sched.spawn(task())
    sched.run()
    assert [type(e) for e in caught] == [UnknownTask, KernelError]
    assert isinstance(caught[0], LookupError)


def test_several_joiners_are_all_woken_in_order(sched: Scheduler) -> None:
    woken = []

    def target():
        yield Sleep(4)
        return "t"

    def joiner(i, tid):
        woken.append((i, (yield WaitTask(tid)), sched.clock.monotonic()))

    t = sched.spawn(target())
    for i in range(5):
        sched.spawn(joiner(i, t))
    sched.run()
    assert woken == [(i, "t", 4) for i in range(5)]


# -- KillTask at every place a task can be ------------------------------------------


def _blocked_on_sleep(ctx):
    yield Sleep(100)


def _blocked_on_join(ctx):
    tid = yield NewTask(Sleep_forever(), daemon=True)
    ctx["child"] = tid
    yield WaitTask(tid, timeout=50)


def _blocked_on_io(ctx):
    yield ReadWait(ctx["rfd"])


def _blocked_on_queue(ctx):
    yield ctx["queue"].get()


def _blocked_on_event(ctx):
    yield ctx["event"].wait()


def _blocked_in_thread(ctx):
    yield RunInThread(ctx["gate"].wait, 5)


def _in_ready_queue(ctx):
    while True:
        yield


def _in_nested_call(ctx):
    def inner():
        try:
            yield Sleep(100)
        finally:
            ctx["log"].append("inner finally")

    yield inner()


BLOCKERS = {
    "sleep": (_blocked_on_sleep, TaskState.BLOCKED_SLEEP),
    "join": (_blocked_on_join, TaskState.BLOCKED_JOIN),
    "io": (_blocked_on_io, TaskState.BLOCKED_IO),
    "queue": (_blocked_on_queue, TaskState.BLOCKED_SYNC),
    "event": (_blocked_on_event, TaskState.BLOCKED_SYNC),
    "thread": (_blocked_in_thread, TaskState.BLOCKED_THREAD),
    "ready": (_in_ready_queue, TaskState.READY),
    "nested": (_in_nested_call, TaskState.BLOCKED_SLEEP),
}


@pytest.mark.parametrize("where", list(BLOCKERS))
def test_kill_throws_task_cancelled_wherever_the_task_waits(sched: Scheduler, where: str) -> None:
    body, state = BLOCKERS[where]
    rfd, wfd = os.pipe()
    ctx = {
        "rfd": rfd,
        "queue": Queue(),
        "event": Event(),
        "gate": threading.Event(),
        "log": [],
    }
    log = ctx["log"]

    def target():
        try:
            yield body(ctx)
        except Exception:  # must not catch the cancellation
            log.append("except Exception")
        finally:
            log.append("finally")
        log.append("after")  # never reached

    def killer(tid):
        if where == "ready":
            yield  # a manual clock stands still while a task is always ready
        else:
            yield Sleep(1)
        yield
        t = sched.task(tid)
        log.append(("state", t.state))
        log.append(("kill", (yield KillTask(tid))))
        ctx["gate"].set()  # let the thread finish
        log.append(("again", (yield KillTask(tid))))  # a second kill may close it
        yield Sleep(1)
        log.append(("dead", (yield KillTask(tid))))
        # Whatever it waited on is free again.
        assert ctx["queue"].waiting == 0
        assert ctx["event"]._waiters is None or tid not in [w.id for w in ctx["event"]._waiters]
        os.write(wfd, b"x")
        yield ReadWait(rfd)  # no "already waited on" error
        if "child" in ctx:
            assert sched.task(ctx["child"]).joiners in (None, [])
            yield KillTask(ctx["child"])

    try:
        t = sched.spawn(target(), name="target")
        sched.spawn(killer(t))
        sched.run()
    finally:
        os.close(rfd)
        os.close(wfd)
    task = sched.task(t)
    assert task.state is TaskState.CANCELLED
    assert isinstance(task.error, TaskCancelled)
    assert ("state", state) in log
    assert ("kill", True) in log
    assert ("dead", False) in log
    assert "finally" in log
    assert "except Exception" not in log
    assert "after" not in log
    if where == "nested":
        assert log.index("inner finally") < log.index("finally")
    assert sched.alive == 0


def test_kill_a_task_that_has_not_started(sched: Scheduler) -> None:
    started = []

    def target():
        started.append(True)
        yield

    def killer(tid):
        return (yield KillTask(tid))

    k = sched.spawn(killer(2))
    t = sched.spawn(target())
    sched.run()
    assert sched.result(k) is True
    assert sched.task(t).state is TaskState.CANCELLED
    assert started == []


def test_kill_returns_false_for_finished_and_unknown_tasks(sched: Scheduler) -> None:
    def main():
        tid = yield NewTask(noop())
        yield Sleep(1)
        return (yield KillTask(tid)), (yield KillTask(424242))

    tid = sched.spawn(main())
    sched.run()
    assert sched.result(tid) == (False, False)


def test_killing_yourself(sched: Scheduler) -> None:
    log = []

    def suicidal(catch):
        me = yield GetTid()
        try:
            yield KillTask(me)
            log.append("not reached")
        except TaskCancelled:
            log.append(("caught", me))
            if not catch:
                raise
        return "survived"

    a = sched.spawn(suicidal(catch=False))
    b = sched.spawn(suicidal(catch=True))
    sched.run()
    assert log == [("caught", a), ("caught", b)]
    assert sched.task(a).state is TaskState.CANCELLED
    assert sched.task(b).state is TaskState.DONE
    assert sched.result(b) == "survived"


@pytest.mark.parametrize("after_swallow", ["sleep", "spin"])
def test_second_kill_closes_a_task_that_swallows_the_first(
    sched: Scheduler, after_swallow: str
) -> None:
    log = []

    def stubborn():
        try:
            while True:
                try:
                    if after_swallow == "sleep":
                        yield Sleep(1)
                    else:
                        yield
                except TaskCancelled:
                    log.append("swallowed")
        finally:
            log.append("finally")

    def pause(seconds):
        # A manual clock stands still while a task is always ready: count yields.
        if after_swallow == "sleep":
            yield Sleep(seconds)
        else:
            for _ in range(int(seconds * 2)):
                yield

    def killer(tid):
        yield pause(2.5)
        assert (yield KillTask(tid)) is True
        yield pause(2)
        assert sched.task(tid).state is not TaskState.CANCELLED
        assert (yield KillTask(tid)) is True
        yield pause(1)
        assert (yield KillTask(tid)) is False

    t = sched.spawn(stubborn())
    sched.spawn(killer(t))
    sched.run()
    assert log.count("swallowed") == 1
    assert log.count("finally") == 1
    assert sched.task(t).state in (TaskState.CANCELLED, TaskState.CRASHED)
    assert sched.alive == 0


def test_two_kills_in_one_turn_close_the_target(sched: Scheduler) -> None:
    log = []

    def target():
        try:
            while True:
                try:
                    yield Sleep(1)
                except TaskCancelled:
                    log.append("swallowed")
        finally:
            log.append("finally")

    def killer(tid):
        yield
        yield KillTask(tid)
        yield KillTask(tid)

    t = sched.spawn(target())
    sched.spawn(killer(t))
    sched.run()
    assert log == ["finally"]
    assert sched.task(t).state is TaskState.CANCELLED


def test_second_kill_of_a_task_that_yields_in_finally_is_final(sched: Scheduler) -> None:
    def target():
        while True:
            try:
                yield Sleep(1)
            except TaskCancelled:
                pass
            finally:
                yield Sleep(1)  # misbehaving: yields while being closed

    def killer(tid):
        yield Sleep(0.5)
        yield KillTask(tid)
        yield Sleep(0.2)
        yield KillTask(tid)

    t = sched.spawn(target())
    sched.spawn(killer(t))
    with structlog.testing.capture_logs():
        sched.run()
    assert sched.task(t).state in (TaskState.CANCELLED, TaskState.CRASHED)
    assert sched.alive == 0


def test_host_kill_from_outside_any_task(sched: Scheduler) -> None:
    t = sched.spawn(Sleep_forever())
    assert sched.kill(t) is True
    sched.run()
    assert sched.task(t).state is TaskState.CANCELLED
    assert sched.kill(t) is False


def test_killed_task_joiners_and_children(sched: Scheduler) -> None:
    out = []

    def parent():
        kid = yield NewTask(Sleep_forever())
        out.append(kid)
        try:
            yield WaitTask(kid)
        finally:
            yield KillTask(kid)  # clean up the child in finally

    def joiner(tid):
        try:
            yield WaitTask(tid)
        except TaskKilled:
            out.append("joiner saw kill")

    p = sched.spawn(parent())
    sched.spawn(joiner(p))
    sched.spawn(killer_after(p, 1))
    sched.run()
    assert out[1:] == ["joiner saw kill"]
    assert sched.task(p).state is TaskState.CANCELLED
    assert sched.alive == 0


def killer_after(tid, seconds):
    yield Sleep(seconds)
    return (yield KillTask(tid))
