"""Instruments: observer hooks, their cost when absent, and their failure policy."""

from __future__ import annotations

import pytest
import structlog

from tiffany.errors import InstrumentFailure
from tiffany.kernel import (
    HOOKS,
    RETURNED,
    Instrument,
    ManualClock,
    NewTask,
    Queue,
    Scheduler,
    Sleep,
    TaskState,
)

from .kernel_support import Recorder, noop, spin


def _workload(sched: Scheduler) -> list[int]:
    q: Queue[int] = Queue()

    def child():
        yield Sleep(1)
        q.put(1)

    def main():
        yield NewTask(child())
        yield q.get()
        yield

    return [sched.spawn(main()), sched.spawn(spin(3))]


def test_no_hook_is_called_after_detaching(clock: ManualClock) -> None:
    rec = Recorder()
    sched = Scheduler(clock=clock, instruments=[rec])
    sched.remove_instrument(rec)
    assert sched.instruments == []
    assert all(hook is None for hook in sched._instruments.hooks.values())
    tids = _workload(sched)
    sched.run()
    assert rec.events == []
    assert all(sched.task(t).state is TaskState.DONE for t in tids)


def test_only_overridden_hooks_are_compiled(sched: Scheduler) -> None:
    class ExitsOnly(Instrument):
        def __init__(self):
            self.exits = []

        def task_exited(self, task):
            self.exits.append(task.id)

    for inst in list(sched.instruments):
        sched.remove_instrument(inst)
    ex = ExitsOnly()
    sched.add_instrument(ex)
    hooks = sched._instruments.hooks
    assert [name for name in HOOKS if hooks[name] is not None] == ["task_exited"]
    tids = _workload(sched)
    sched.run()
    assert sorted(ex.exits) == sorted([*tids, 3])


def test_attaching_twice_is_an_error(sched: Scheduler, recorder: Recorder) -> None:
    with pytest.raises(ValueError, match="already attached"):
        sched.add_instrument(recorder)


def test_run_hooks_and_returned_marker(sched: Scheduler) -> None:
    calls = []

    class RunHooks(Instrument):
        def before_run(self):
            calls.append("before_run")

        def after_run(self):
            calls.append("after_run")

        def after_dispatch(self, task, yielded):
            if yielded is RETURNED:
                calls.append(("returned", task.id))

        def task_woken(self, task, value):
            calls.append(("woken", task.id, value))

    sched.add_instrument(RunHooks())
    q: Queue[str] = Queue()

    def getter():
        yield q.get()

    def putter():
        yield Sleep(1)
        q.put("payload")

    g = sched.spawn(getter())
    p = sched.spawn(putter())
    sched.run()
    assert calls[0] == "before_run"
    assert calls[-1] == "after_run"
    assert ("woken", g, "payload") in calls
    assert ("woken", p, None) in calls
    assert {c[1] for c in calls if c[0] == "returned"} == {g, p}


def test_instrument_added_by_a_task_sees_later_dispatches(sched: Scheduler) -> None:
    late = Recorder()

    def main():
        yield
        sched.add_instrument(late)
        yield
        yield

    tid = sched.spawn(main())
    sched.run()
    assert late.dispatches() == [tid, tid]


class Exploding(Instrument):
    """Raises from one hook after ``after`` calls."""

    def __init__(self, hook: str, after: int = 0) -> None:
        self.hook = hook
        self.after = after
        self.calls = 0

    def _maybe_raise(self, name: str) -> None:
        if name == self.hook:
            self.calls += 1
            if self.calls > self.after:
                raise RuntimeError(f"{name} exploded")

    def before_run(self):
        self._maybe_raise("before_run")

    def task_spawned(self, task):
        self._maybe_raise("task_spawned")

    def before_dispatch(self, task):
        self._maybe_raise("before_dispatch")

    def after_dispatch(self, task, yielded):
        self._maybe_raise("after_dispatch")

    def task_blocked(self, task, call):
        self._maybe_raise("task_blocked")

    def task_woken(self, task, value):
        self._maybe_raise("task_woken")

    def task_exited(self, task):
        self._maybe_raise("task_exited")

    def before_wait(self, timeout):
        self._maybe_raise("before_wait")

    def after_wait(self, events):
        self._maybe_raise("after_wait")


class CriticalExploding(Exploding):
    critical = True


FAILING_HOOKS = [
    "before_run",
    "before_dispatch",
    "after_dispatch",
    "task_blocked",
    "task_woken",
    "task_exited",
    "before_wait",
    "after_wait",
]


@pytest.mark.parametrize("hook", FAILING_HOOKS)
def test_failing_instrument_is_removed_and_logged(
    sched: Scheduler, recorder: Recorder, hook: str
) -> None:
    bad = Exploding(hook, after=0 if hook == "before_run" else 1)
    sched.add_instrument(bad)
    with structlog.testing.capture_logs() as logs:
        tids = _workload(sched)
        sched.run()
    assert bad not in sched.instruments
    assert recorder in sched.instruments  # the others keep observing
    assert all(sched.task(t).state is TaskState.DONE for t in tids)
    disabled = [e for e in logs if e["event"] == "kernel.instrument_disabled"]
    assert len(disabled) == 1
    assert disabled[0]["hook"] == hook
    assert "exploded" in disabled[0]["error"]
    # The recorder saw the whole run, including what came after the failure.
    assert len(recorder.exits()) == 3


def test_failing_single_instrument_is_removed(sched: Scheduler, recorder: Recorder) -> None:
    # With one instrument the hook is called through its own guard, not a fan-out.
    sched.remove_instrument(recorder)
    bad = Exploding("after_dispatch")
    sched.add_instrument(bad)
    with structlog.testing.capture_logs() as logs:
        tid = sched.spawn(spin(5))
        sched.run()
    assert sched.instruments == []
    assert bad.calls == 1
    assert sched.task(tid).state is TaskState.DONE
    assert [e["hook"] for e in logs if e["event"] == "kernel.instrument_disabled"] == [
        "after_dispatch"
    ]


@pytest.mark.parametrize("hook", ["before_dispatch", "after_dispatch", "before_wait"])
def test_critical_instrument_failure_stops_the_kernel(sched: Scheduler, hook: str) -> None:
    bad = CriticalExploding(hook, after=2)
    sched.add_instrument(bad)
    progress = []

    def worker():
        for i in range(100):
            progress.append(i)
            yield Sleep(1)

    sched.spawn(worker())
    with structlog.testing.capture_logs() as logs, pytest.raises(InstrumentFailure) as info:
        sched.run()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.fields["hook"] == hook
    assert len(progress) < 10  # stopped soon after the failure, not at the end
    failed = [e for e in logs if e["event"] == "kernel.instrument_failed"]
    assert failed
    assert failed[0]["fatal"] is True


def test_critical_failure_as_a_task_returns_runs_no_other_task(
    sched: Scheduler, recorder: Recorder
) -> None:
    # The journal failing to record a return stops the kernel right there,
    # as after any other dispatch: the rest of the pass does not run.
    class FailsOnReturn(Instrument):
        critical = True

        def after_dispatch(self, task, yielded):
            if yielded is RETURNED:
                raise RuntimeError("return exploded")

    sched.remove_instrument(recorder)
    sched.add_instrument(FailsOnReturn())
    ran = []

    def returns_at_once():
        return 1
        yield

    def worker():
        ran.append("worker")
        yield

    sched.spawn(returns_at_once())
    sched.spawn(worker())
    with structlog.testing.capture_logs(), pytest.raises(InstrumentFailure) as info:
        sched.run()
    assert info.value.fields["hook"] == "after_dispatch"
    assert isinstance(info.value.__cause__, RuntimeError)
    assert ran == []


@pytest.mark.parametrize("hook", ["before_run", "task_spawned"])
def test_critical_failure_before_any_dispatch_runs_no_task(
    sched: Scheduler, recorder: Recorder, hook: str
) -> None:
    # The journal failing to start (or to record a spawn) must stop the kernel
    # before any task runs: nothing may happen that was not recorded.
    class OneHook(Instrument):  # only the failing hook: no dispatch hooks to stop at
        critical = True

    def explode(*args):
        raise RuntimeError(f"{hook} exploded")

    setattr(OneHook, hook, explode)
    sched.remove_instrument(recorder)
    sched.add_instrument(OneHook())
    ran = []

    def worker(i):
        ran.append(i)
        yield

    with structlog.testing.capture_logs():
        sched.spawn(worker(0))
        sched.spawn(worker(1))
        with pytest.raises(InstrumentFailure):
            sched.run()
    assert ran == []


def test_noncritical_failure_in_task_spawned_outside_run(sched: Scheduler) -> None:
    bad = Exploding("task_spawned")
    sched.add_instrument(bad)
    with structlog.testing.capture_logs() as logs:
        tid = sched.spawn(noop(1))
    assert bad not in sched.instruments
    assert [e["hook"] for e in logs if e["event"] == "kernel.instrument_disabled"] == [
        "task_spawned"
    ]
    sched.run()
    assert sched.result(tid) == 1


def test_instrument_detached_by_a_task_is_not_called_again(
    sched: Scheduler, recorder: Recorder
) -> None:
    def detacher():
        yield
        sched.remove_instrument(recorder)
        yield

    d = sched.spawn(detacher())
    others = [sched.spawn(spin(3)) for _ in range(3)]
    sched.run()
    # The last thing recorded is the end of the detacher's own dispatch; the
    # tasks after it in the same pass were not reported to the instrument.
    assert recorder.events[-2:] == [("before_dispatch", d, "running"), ("after_dispatch", d, None)]
    assert all(sched.task(t).state is TaskState.DONE for t in others)
