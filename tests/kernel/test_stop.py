"""Scheduler.stop: run returns, tasks are left as they are, and run can go on."""

from __future__ import annotations

import threading
import time

from process_support import wait_for

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


# -- a stop starts nothing new (issue 38) ---------------------------------------------------


def test_pool_close_discards_queued_jobs_and_the_one_in_flight_finishes() -> None:
    """``close`` used to queue its stop markers behind the jobs: every queued job ran."""
    import threading

    from tiffany.kernel.threads import ThreadPool

    pool = ThreadPool(1)
    ran: list[str] = []
    started, gate = threading.Event(), threading.Event()

    def in_flight() -> None:
        started.set()
        gate.wait(60)
        ran.append("in flight")

    pool.submit("a", in_flight, ())
    for i in range(50):
        pool.submit(i, ran.append, (i,))
    assert started.wait(30)
    discarded: list[int] = []
    closer = threading.Thread(target=lambda: discarded.append(pool.close()))
    closer.start()
    wait_for(lambda: pool._closed, 30, "close to begin")
    gate.set()  # the job in flight finishes while close waits for its worker
    closer.join(30)
    worker = pool._threads[0]
    worker.join(30)
    assert not worker.is_alive()
    assert ran == ["in flight"]  # it finished; none of the 50 queued behind it started
    assert discarded == [50]


def test_stop_from_another_thread_leaves_queued_jobs_unstarted_until_run_again() -> None:
    """A stop (SIGTERM's handler, a fence's heartbeat thread) halts the pool at once."""
    import threading

    from tiffany.kernel import RunInThread

    sched = Scheduler(max_threads=1)
    ran: list[int] = []
    started, gate = threading.Event(), threading.Event()

    def first() -> None:
        started.set()
        gate.wait(60)
        ran.append(0)

    def job(i: int):
        yield RunInThread(first if i == 0 else ran.append, *(() if i == 0 else (i,)))

    for i in range(20):
        sched.spawn(job(i))
    runner = threading.Thread(target=sched.run, daemon=True)
    runner.start()
    assert started.wait(30)
    sched.stop()  # not on the loop's thread: the loop waits for the pool
    gate.set()  # the job in flight finishes, and its completion wakes the loop
    runner.join(30)
    assert not runner.is_alive(), "run() did not return after stop()"
    # run() returns at its next pass, which may come before the job in flight
    # ends: wait for that job, then watch that the worker, free again, starts
    # none of the queued ones (unhalted, it would take the next at once).
    deadline = time.monotonic() + 30
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    watch_until = time.monotonic() + 0.5
    while time.monotonic() < watch_until:
        assert ran == [0]
        time.sleep(0.01)
    assert sched.alive == 20
    sched.run()  # effects start again: each job once
    assert sorted(ran) == list(range(20))
    assert sched.alive == 0
    sched.close()


def test_a_generator_step_whose_task_had_not_begun_does_not_begin_after_a_stop() -> None:
    """A generator step's body starts in the pass after its Step: a stop in between holds it."""
    from tiffany.kernel import Step

    sched = Scheduler()
    began: list[str] = []

    def body():
        began.append("body")
        yield
        return "done"

    def caller():
        return (yield Step(body))

    def stopper():
        yield  # pass 1: queued before the step's body
        sched.stop()  # pass 2, before the body's first turn

    sched.spawn(stopper())
    tid = sched.spawn(caller())
    sched.run()
    assert began == []
    sched.run()
    assert began == ["body"]
    assert sched.result(tid) == "done"
    sched.close()


def test_a_critical_instruments_failure_halts_the_scheduler_at_once() -> None:
    """A fail-stop (the journal failed: disk full, fenced) halts effects in the failing hook.

    The engine does more before it closes the scheduler (it answers waiters,
    stops its servers): the pool must start nothing meanwhile.
    """
    import pytest

    from tiffany.errors import InstrumentFailure
    from tiffany.kernel import Instrument, RunInThread

    halted_in_failure: list[bool] = []

    class Journal(Instrument):
        critical = True

        def before_wait(self, timeout: float | None) -> None:
            raise OSError(28, "No space left on device")

    class Witness(Instrument):
        def after_run(self) -> None:
            halted_in_failure.append(sched.halted)

    sched = Scheduler(max_threads=1, instruments=[Journal(), Witness()])

    def job():
        yield RunInThread(int)

    sched.spawn(job())
    with pytest.raises(InstrumentFailure):
        sched.run()
    assert sched.halted
    assert halted_in_failure == [True]
    sched.close()


def test_a_shut_gate_sets_jobs_aside_until_reopened_and_a_halt_still_wins() -> None:
    """The pool asks its gate before each job (an engine's lease): shut, nothing starts."""
    import threading

    from tiffany.kernel.threads import ThreadPool

    pool = ThreadPool(2)
    is_open = threading.Event()
    pool.gate = is_open.is_set
    ran: list[int] = []
    try:
        for i in range(5):
            pool.submit(i, ran.append, (i,))
        wait_for(lambda: len(pool._unstarted) == 5, 30, "the jobs set aside")
        assert ran == []
        is_open.set()
        pool.reopen()
        wait_for(lambda: sorted(ran) == [0, 1, 2, 3, 4], 30, "the jobs to run once reopened")
        # A halt is not undone by the gate opening: halted jobs wait for resume.
        pool.halt()
        pool.submit(9, ran.append, (9,))
        wait_for(lambda: len(pool._unstarted) == 1, 30, "the halted job set aside")
        pool.reopen()
        assert 9 not in ran
        pool.resume()
        wait_for(lambda: 9 in ran, 30, "the job to run once resumed")
    finally:
        pool.close()


def _stopped_with_a_job_in_flight(
    sched: Scheduler, jobs: int
) -> tuple[list[int], list[object], threading.Event]:
    """Run ``jobs`` tasks of one thread job each on a 1-worker pool; stop with job 0 in flight.

    Returns what ran, what the tasks got back, and the in-flight job's gate
    (set it to let the job end).
    """
    from tiffany.kernel import RunInThread

    ran: list[int] = []
    got: list[object] = []
    started, gate = threading.Event(), threading.Event()

    def first() -> int:
        started.set()
        gate.wait(60)
        ran.append(0)
        return 0

    def job(i: int):
        got.append((yield RunInThread(first if i == 0 else (lambda: ran.append(i) or i))))

    def stopper():
        while not started.is_set():
            yield Sleep(0.01)
        sched.stop()

    for i in range(jobs):
        sched.spawn(job(i))
    sched.spawn(stopper())
    sched.run()
    return ran, got, gate


def test_drain_delivers_the_jobs_in_flight_at_a_stop_and_starts_none() -> None:
    """A SIGTERM'd engine waits for its workers' steps: their ends reach the journal."""
    from tiffany.kernel import Instrument

    woken: list[object] = []
    commits: list[str] = []

    class Journal(Instrument):
        def task_woken(self, task, value) -> None:
            if value is not None:  # not the stopper's sleeps
                woken.append(value)

        def after_run(self) -> None:
            commits.append("commit")

    sched = Scheduler(max_threads=1, instruments=[Journal()])
    ran, got, gate = _stopped_with_a_job_in_flight(sched, 10)
    assert woken == []  # run() returned before the job's end
    threading.Timer(0.2, gate.set).start()
    assert sched.drain(60) == 0
    assert woken == [0]  # the job's end, delivered (and so journaled) by the drain...
    assert commits == ["commit", "commit"]  # ...and committed: run's end, the drain's
    assert ran == [0]  # none of the 9 queued jobs started
    assert got == []  # no task ran: the woken one resumes when run() runs again
    sched.run()
    assert sorted(got) == list(range(10))  # 0: the drained job's value, kept for its task
    assert sorted(ran) == list(range(10))  # each job once
    sched.close()


def test_drain_returns_at_its_bound_with_the_jobs_still_running() -> None:
    sched = Scheduler(max_threads=1)
    ran, _, gate = _stopped_with_a_job_in_flight(sched, 3)
    t0 = time.monotonic()
    assert sched.drain(0.3) == 1  # still running: the next start runs it again
    assert time.monotonic() - t0 >= 0.3
    gate.set()
    wait_for(lambda: ran == [0], 30, "the job to end")
    assert sched.drain(30) == 0  # its completion, delivered now
    sched.close()


def test_drain_is_for_a_stopped_scheduler() -> None:
    import pytest

    from tiffany.errors import KernelError

    sched = Scheduler()
    errors: list[BaseException] = []

    def main():
        try:
            sched.drain(1)
        except KernelError as exc:
            errors.append(exc)
        yield

    sched.spawn(main())
    sched.run()
    assert len(errors) == 1  # while running
    sched.close()
    with pytest.raises(KernelError):
        Scheduler().drain(1)  # never run nor stopped
