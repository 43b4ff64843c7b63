"""The scheduler loop: the contract example, round robin (D1), determinism,
immediate system calls, the task state machine and fault isolation."""

from __future__ import annotations

import os

import pytest
import structlog

from tiffany.errors import KernelError, TaskCrashed, TiffanyError
from tiffany.kernel import (
    Event,
    GetTid,
    KillTask,
    NewTask,
    Now,
    Queue,
    Random,
    ReadWait,
    RunInThread,
    Scheduler,
    Sleep,
    TaskState,
    WaitTask,
)
from tiffany.kernel.scheduler import MAX_IMMEDIATE_RESUMES

from .kernel_support import Recorder, make_sched, noop, returns_now, spin

# -- the contract -------------------------------------------------------------


def test_contract_example_returns_45() -> None:
    # Verbatim from docs/architecture.md ("Kernel contract"), on the real clock.
    def child(n):
        yield Sleep(0.01)
        return n * 2

    def helper(x):
        yield
        return x + 1

    def main():
        me = yield GetTid()
        tid = yield NewTask(child(21))
        doubled = yield WaitTask(tid)
        three = yield helper(2)
        assert me == 1
        return doubled + three

    with Scheduler() as sched:
        tid = sched.spawn(main(), name="main")
        assert isinstance(tid, int)
        sched.run()
        assert sched.result(tid) == 45
        assert sched.task(tid).state is TaskState.DONE
        assert sched.task(tid).name == "main"
        assert sched.alive == 0


def test_run_returns_at_once_without_tasks(sched: Scheduler) -> None:
    sched.run()
    assert sched.alive == 0


def test_spawn_rejects_non_generators(sched: Scheduler) -> None:
    with pytest.raises(TypeError):
        sched.spawn(lambda: None)  # type: ignore[arg-type]


def test_run_is_not_reentrant(sched: Scheduler) -> None:
    errors = []

    def task():
        try:
            sched.run()
        except KernelError as exc:
            errors.append(exc)
        yield

    sched.spawn(task())
    sched.run()
    assert len(errors) == 1


# -- D1: round robin ------------------------------------------------------------


def test_bare_yields_interleave_in_fifo_order(sched: Scheduler, recorder: Recorder) -> None:
    log: list[tuple[str, int]] = []

    def worker(name, n):
        for i in range(n):
            log.append((name, i))
            yield
            yield None  # ``yield None`` is the same cooperative yield

    a = sched.spawn(worker("A", 3))
    b = sched.spawn(worker("B", 3))
    sched.run()
    assert log == [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)]
    # Every yield is a trip through the ready queue: strict alternation.
    assert recorder.dispatches() == [a, b] * 7


def test_completion_order_follows_number_of_yields(sched: Scheduler, recorder: Recorder) -> None:
    counts = {"A": 3, "B": 1, "C": 2, "D": 0, "E": 1}
    tids = {name: sched.spawn(spin(n), name=name) for name, n in counts.items()}
    sched.run()
    by_id = {tid: name for name, tid in tids.items()}
    assert [by_id[t] for t in recorder.exits()] == ["D", "B", "E", "C", "A"]
    assert all(sched.task(t).state is TaskState.DONE for t in tids.values())


def test_ready_pass_runs_only_tasks_ready_when_it_began(
    sched: Scheduler, recorder: Recorder
) -> None:
    # A child spawned during a pass runs after every task already queued.
    def parent():
        yield NewTask(noop(), name="child")
        yield

    p = sched.spawn(parent())
    b = sched.spawn(spin(2))
    sched.run()
    child = recorder.hooks("task_spawned")[-1][1]
    assert child not in (p, b)
    assert recorder.turns()[:3] == [p, b, child]


def _program(sched: Scheduler, out: list) -> None:
    """A small program mixing yields, children, timers, randomness, a queue, an event."""
    q: Queue[int] = Queue()
    ev = Event()

    def sleeper(i):
        r = yield Random()
        yield Sleep(r * 10)
        out.append(("woke", i, round(r, 12), (yield Now())))
        q.put(i)
        return i

    def consumer(n):
        got = []
        for _ in range(n):
            got.append((yield q.get()))
        ev.set()
        return got

    def waiter():
        yield ev.wait()
        out.append(("event",))

    def main():
        kids = []
        for i in range(6):
            kids.append((yield NewTask(sleeper(i))))
            yield
        c = yield NewTask(consumer(6))
        yield NewTask(waiter())
        for k in kids:
            yield WaitTask(k)
        out.append(("consumed", (yield WaitTask(c))))

    sched.spawn(main(), name="main")
    sched.spawn(spin(5), name="spinner")


def test_same_program_same_dispatch_sequence() -> None:
    runs = []
    for _ in range(2):
        sched, rec, _clock = make_sched(seed=42)
        out: list = []
        _program(sched, out)
        sched.run()
        sched.close()
        runs.append((rec.events, out))
    assert runs[0][1] == runs[1][1]
    assert runs[0][0] == runs[1][0]
    assert len(runs[0][0]) > 100


def test_different_seed_different_choices() -> None:
    outs = []
    for seed in (1, 2):
        sched, _rec, _clock = make_sched(seed=seed)
        out: list = []
        _program(sched, out)
        sched.run()
        sched.close()
        outs.append([e[2] for e in out if e[0] == "woke"])
    assert outs[0] != outs[1]


# -- immediate system calls -------------------------------------------------------


def _finished_task():
    tid = yield NewTask(returns_now(7))
    yield  # the child runs and ends
    return tid


def _setup_get_tid():
    return GetTid()
    yield


def _setup_new_task():
    return NewTask(noop())
    yield


def _setup_now():
    return Now()
    yield


def _setup_random():
    return Random()
    yield


def _setup_kill_finished():
    tid = yield _finished_task()
    return KillTask(tid)


def _setup_wait_finished():
    tid = yield _finished_task()
    return WaitTask(tid)


def _setup_queue_item():
    q: Queue[str] = Queue()
    q.put("item")
    return q.get()
    yield


def _setup_event_set():
    ev = Event()
    ev.set()
    return ev.wait()
    yield


@pytest.mark.parametrize(
    ("setup", "check"),
    [
        (_setup_get_tid, lambda v, me: v == me),
        (_setup_new_task, lambda v, me: isinstance(v, int) and v > me),
        (_setup_now, lambda v, me: v == 1_700_000_000.0),
        (_setup_random, lambda v, me: 0.0 <= v < 1.0),
        (_setup_kill_finished, lambda v, me: v is False),
        (_setup_wait_finished, lambda v, me: v == 7),
        (_setup_queue_item, lambda v, me: v == "item"),
        (_setup_event_set, lambda v, me: v is True),
    ],
    ids=["GetTid", "NewTask", "Now", "Random", "KillTask", "WaitTask", "Queue.get", "Event.wait"],
)
def test_immediate_calls_resume_the_same_task(
    sched: Scheduler, recorder: Recorder, setup, check
) -> None:
    results = []

    def task():
        call = yield setup()
        results.append((yield call))

    me = sched.spawn(task())
    other = sched.spawn(spin(10))
    sched.run()
    assert len(results) == 1
    assert check(results[0], me), results
    # Right after the task yielded the call, the next dispatch is the same task:
    # no trip through the ready queue, although ``other`` was waiting there.
    dispatch = [e for e in recorder.events if e[0] in ("before_dispatch", "after_dispatch")]
    kind = None
    for i, e in enumerate(dispatch):
        if e[0] == "after_dispatch" and e[1] == me and e[2] not in (None, "generator", "RETURNED"):
            kind = e[2]
            assert dispatch[i + 1][:2] == ("before_dispatch", me), dispatch[i - 2 : i + 3]
    assert kind is not None
    assert other in recorder.dispatches()


def test_immediate_resumes_are_capped(sched: Scheduler, recorder: Recorder) -> None:
    n = MAX_IMMEDIATE_RESUMES * 2 + 10

    def greedy():
        for _ in range(n):
            yield GetTid()

    g = sched.spawn(greedy())
    o = sched.spawn(spin(3))
    sched.run()
    seq = recorder.dispatches()
    # The first turn is exactly MAX_IMMEDIATE_RESUMES resumes, then ``o`` runs.
    assert seq[:MAX_IMMEDIATE_RESUMES] == [g] * MAX_IMMEDIATE_RESUMES
    assert seq[MAX_IMMEDIATE_RESUMES] == o
    assert recorder.turns()[:4] == [g, o, g, o]
    assert sched.task(g).state is TaskState.DONE


def test_new_task_returns_child_id_and_queues_it(sched: Scheduler, recorder: Recorder) -> None:
    got = []
    info = []

    def child():
        got.append(("child", (yield GetTid())))

    def parent():
        tid = yield NewTask(child(), name="kid")
        got.append(("parent", tid))
        rec = sched.task(tid)
        info.append((rec.parent, rec.name, rec.state))
        yield WaitTask(tid)

    p = sched.spawn(parent())
    b = sched.spawn(noop())
    sched.run()
    kid = got[0][1]
    assert got == [("parent", kid), ("child", kid)]
    assert info == [(p, "kid", TaskState.READY)]
    assert ("task_spawned", kid, "ready") in recorder.events
    # The child joined the back of the ready queue, behind ``b``.
    assert recorder.turns()[:3] == [p, b, kid]


def test_new_task_with_a_non_generator_raises_in_the_caller(sched: Scheduler) -> None:
    caught = []

    def parent():
        try:
            yield NewTask(42)  # type: ignore[arg-type]
        except TypeError as exc:
            caught.append(exc)

    sched.spawn(parent())
    sched.run()
    assert len(caught) == 1


def test_turns_counter(sched: Scheduler) -> None:
    sched.spawn(spin(2))
    sched.spawn(spin(2))
    sched.run()
    assert sched.turns == 6  # two tasks, three turns each


# -- the task state machine ---------------------------------------------------------


def test_state_machine_through_every_blocked_state(sched: Scheduler, recorder: Recorder) -> None:
    r, w = os.pipe()
    ev = Event()
    snapshots = []

    def child():
        yield Sleep(1)
        return "child"

    def subject():
        yield Sleep(1)
        kid = yield NewTask(child())
        assert (yield WaitTask(kid)) == "child"
        yield ReadWait(r)
        assert os.read(r, 1) == b"x"
        yield ev.wait()
        assert (yield RunInThread(lambda: 5)) == 5
        return "ok"

    def driver(tid):
        yield Sleep(0.5)
        t = sched.task(tid)
        snapshots.append((t.state, t.blocked_on.kind, t.blocked_on.seconds))
        yield Sleep(1)  # t = 1.5: subject joins the child
        snapshots.append((t.state, t.blocked_on.kind))
        yield Sleep(1)  # t = 2.5: subject waits on the pipe
        snapshots.append((t.state, t.blocked_on.kind, t.blocked_on.fd))
        os.write(w, b"x")
        yield Sleep(1)  # t = 3.5: subject waits on the event
        snapshots.append((t.state, t.blocked_on.kind))
        ev.set()
        yield

    try:
        s = sched.spawn(subject(), name="subject")
        sched.spawn(driver(s))
        sched.run()
    finally:
        os.close(r)
        os.close(w)
    assert snapshots == [
        (TaskState.BLOCKED_SLEEP, "sleep", 1),
        (TaskState.BLOCKED_JOIN, "wait_task"),
        (TaskState.BLOCKED_IO, "read_wait", r),
        (TaskState.BLOCKED_SYNC, "event_wait"),
    ]
    task = sched.task(s)
    assert task.state is TaskState.DONE
    assert task.result == "ok"
    assert task.blocked_on is None
    assert task.coro is None
    events = [e for e in recorder.of(s) if e[0] != "after_dispatch"]
    # Collapse the immediate resumes (consecutive before_dispatch).
    collapsed = [e for i, e in enumerate(events) if i == 0 or e != events[i - 1]]
    blocked = [("before_dispatch", "running")]

    def parked(state, kind):
        return [("task_blocked", state, kind), ("task_woken", "ready", kind), *blocked]

    assert collapsed == [
        ("task_spawned", "ready"),
        *blocked,
        *parked("blocked_sleep", "sleep"),
        *parked("blocked_join", "wait_task"),
        *parked("blocked_io", "read_wait"),
        *parked("blocked_sync", "event_wait"),
        *parked("blocked_thread", "run_in_thread"),
        ("task_exited", "done"),
    ]


def test_created_state_and_terminal_states() -> None:
    assert not TaskState.CREATED.finished
    assert {s for s in TaskState if s.finished} == {
        TaskState.DONE,
        TaskState.CRASHED,
        TaskState.CANCELLED,
    }
    assert {s for s in TaskState if s.blocked} == {
        TaskState.BLOCKED_IO,
        TaskState.BLOCKED_SLEEP,
        TaskState.BLOCKED_JOIN,
        TaskState.BLOCKED_SYNC,
        TaskState.BLOCKED_THREAD,
    }


def test_result_and_task_lookups(sched: Scheduler) -> None:
    tid = sched.spawn(noop(3))
    with pytest.raises(KernelError):
        sched.result(tid)  # not finished yet
    sched.run()
    assert sched.result(tid) == 3
    assert [t.id for t in sched.tasks()] == [tid]
    sched.forget(tid)
    with pytest.raises(LookupError):
        sched.task(tid)


# -- fault isolation ------------------------------------------------------------------


def test_crashing_task_is_isolated_logged_and_reported_to_joiners(
    sched: Scheduler, recorder: Recorder
) -> None:
    boom = ValueError("boom")
    joined = []

    def crasher():
        yield
        raise boom

    def joiner(tid):
        try:
            yield WaitTask(tid)
        except TaskCrashed as exc:
            joined.append(exc)

    with structlog.testing.capture_logs() as logs:
        bad = sched.spawn(crasher(), name="crasher")
        j = sched.spawn(joiner(bad))
        good = [sched.spawn(spin(5)) for _ in range(3)]
        sched.run()
    task = sched.task(bad)
    assert task.state is TaskState.CRASHED
    assert task.error is boom
    assert all(sched.task(t).state is TaskState.DONE for t in [j, *good])
    assert ("task_crashed", bad, "ValueError") in recorder.events
    crashed = [e for e in logs if e["event"] == "kernel.task_crashed"]
    assert len(crashed) == 1
    assert crashed[0]["tid"] == bad
    assert crashed[0]["name"] == "crasher"
    # a joiner handles the error: a warning, without the traceback
    assert crashed[0]["log_level"] == "warning"
    assert "exc_info" not in crashed[0]
    assert len(joined) == 1
    assert joined[0].__cause__ is boom
    with pytest.raises(TaskCrashed):
        sched.result(bad)


def test_an_unobserved_crash_is_an_error_with_its_traceback(sched: Scheduler) -> None:
    def crasher():
        yield
        raise KeyError("nobody waits for me")

    with structlog.testing.capture_logs() as logs:
        bad = sched.spawn(crasher(), name="lonely")
        sched.run()
    (entry,) = [e for e in logs if e["event"] == "kernel.task_crashed"]
    assert entry["tid"] == bad
    assert entry["log_level"] == "error"
    assert entry["exc_info"][0] is KeyError


def test_a_crash_that_is_an_outcome_is_logged_at_debug_without_alarm(sched: Scheduler) -> None:
    """A TiffanyError marked ``outcome`` (a tool's failure, a plan's) is reported elsewhere."""

    class Reported(TiffanyError):
        outcome = True

    def crasher(err: BaseException):
        yield
        raise err

    with structlog.testing.capture_logs() as logs:
        quiet = sched.spawn(crasher(Reported("the step failed")), name="tool")
        loud = sched.spawn(crasher(TiffanyError("a bug")), name="bug")
        sched.run()
    assert sched.task(quiet).state is TaskState.CRASHED
    levels = {e["tid"]: e["log_level"] for e in logs if e["event"] == "kernel.task_crashed"}
    assert levels == {quiet: "debug", loud: "error"}


def test_run_returns_when_no_task_can_ever_wake_and_close_runs_finally(
    sched: Scheduler,
) -> None:
    ev = Event()
    log = []

    def stuck():
        try:
            yield ev.wait()  # nobody will ever set it
        finally:
            log.append("finally")

    tid = sched.spawn(stuck())
    sched.spawn(spin(3))
    with structlog.testing.capture_logs() as logs:
        sched.run()
    assert sched.task(tid).state is TaskState.BLOCKED_SYNC
    assert sched.alive == 1
    assert [e["blocked"] for e in logs if e["event"] == "kernel.stalled"] == [1]
    sched.close()
    assert log == ["finally"]
    with pytest.raises(KernelError):
        sched.run()  # closed
