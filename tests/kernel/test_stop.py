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


def test_stop_from_a_task_that_then_blocks_on_io() -> None:
    """The loop must not go on to wait for events once stop() was called."""
    import os
    import threading

    from tiffany.kernel import ReadWait

    sched = Scheduler()
    rfd, wfd = os.pipe()

    def reader():
        while True:
            yield ReadWait(rfd)
            if os.read(rfd, 1) == b"s":
                sched.stop()

    sched.spawn(reader())
    timer = threading.Timer(0.05, os.write, (wfd, b"s"))
    timer.start()
    done = threading.Event()
    runner = threading.Thread(target=lambda: (sched.run(), done.set()), daemon=True)
    runner.start()
    assert done.wait(5), "run() did not return after stop()"
    assert sched.alive == 1
    sched.close()
    os.close(rfd)
    os.close(wfd)


def test_stop_with_a_dispatch_hook_attached() -> None:
    """A dispatch hook re-reads the hooks mid-pass; stop() must still be seen."""
    from tiffany.kernel import Instrument

    class Counter(Instrument):
        n = 0

        def after_dispatch(self, task, yielded) -> None:
            Counter.n += 1

    sched = Scheduler(instruments=[Counter()])

    def spinner():
        while True:
            yield

    def stopper():
        yield
        sched.stop()

    sched.spawn(spinner())
    sched.spawn(stopper())
    sched.run()  # returns (a hang here fails the test by its timeout)
    assert Counter.n >= 2
    sched.close()


def test_before_wait_hears_the_real_timeout_when_an_injector_is_present() -> None:
    """With an injector, the first before_wait gets 0; one with the block follows."""
    from tiffany.kernel import Instrument

    seen: list[float | None] = []

    class Waits(Instrument):
        def before_wait(self, timeout: float | None) -> None:
            seen.append(timeout)

    sched = Scheduler(instruments=[Waits()])
    sched.add_injector(lambda: None)

    def sleeper():
        yield Sleep(0.05)

    sched.spawn(sleeper())
    sched.run()
    sched.close()
    assert any(t is None or t > 0.0 for t in seen), seen


def test_instruments_see_every_dispatch_of_a_second_run() -> None:
    """``run`` again (after a stop, or a stall) calls the instruments as the first did.

    The loop keeps its hooks in locals, refreshed only when an instrument
    came or went; a second ``run`` started with none, so the journal saw
    no dispatch of it (a run started between two ``run`` calls recorded
    nothing past its spawns).
    """
    from tiffany.kernel import Instrument

    class Count(Instrument):
        def __init__(self) -> None:
            self.dispatched = 0

        def after_dispatch(self, task, yielded) -> None:
            self.dispatched += 1

    count = Count()
    sched = Scheduler(instruments=[count])

    def two() -> object:
        yield
        yield

    sched.spawn(two())
    sched.run()
    first = count.dispatched
    assert first == 3  # two yields and the return
    sched.spawn(two())
    sched.run()
    assert count.dispatched == 2 * first
    sched.close()
