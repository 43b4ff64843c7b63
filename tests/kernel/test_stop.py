"""Scheduler.stop: run returns, tasks are left as they are, and run can go on."""

from __future__ import annotations

from tiffany.kernel import Scheduler, Sleep
from tiffany.kernel.calls import GetTid


def test_stop_returns_without_killing_and_run_resumes() -> None:
    sched = Scheduler()
    steps: list[str] = []

    def worker():
        steps.append("a")
        yield Sleep(0.01)
        steps.append("b")
        yield GetTid()
        steps.append("c")
        return "done"

    def stopper():
        yield
        sched.stop()
        yield
        steps.append("stopper-after")

    wid = sched.spawn(worker())
    sched.spawn(stopper())
    sched.run()
    # Stopped within the first passes: the worker is parked on its sleep.
    assert steps == ["a"]
    assert sched.alive == 2
    sched.run()
    assert steps[0] == "a"
    assert sorted(steps[1:]) == ["b", "c", "stopper-after"]
    assert sched.result(wid) == "done"
    sched.close()
