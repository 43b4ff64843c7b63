"""tiffany.io subprocesses: pipes through ReadWait, exit through a pidfd."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tiffany.io import spawn_process
from tiffany.io.process import CompletedRun
from tiffany.kernel import (
    KillTask,
    ManualClock,
    NewTask,
    ReadWait,
    Scheduler,
    Sleep,
    TaskState,
    WaitTask,
)


@pytest.fixture
def sched():
    s = Scheduler(clock=ManualClock())
    yield s
    s.close()


def run_one(sched: Scheduler, coro):
    tid = sched.spawn(coro)
    t0 = time.perf_counter()
    sched.run()
    return sched.result(tid), time.perf_counter() - t0


def test_communicate_returns_completed_run(sched: Scheduler) -> None:
    proc = spawn_process(["sh", "-c", "tr a-z A-Z; echo oops >&2; exit 3"])

    def task():
        return (yield proc.communicate(stdin=b"hello world\n"))

    result, _ = run_one(sched, task())
    assert result == CompletedRun(3, b"HELLO WORLD\n", b"oops\n", 0, 0)
    assert proc.returncode == 3


def test_output_cap_drops_and_counts_extra_bytes(sched: Scheduler) -> None:
    proc = spawn_process(["sh", "-c", "head -c 100000 /dev/zero; head -c 300 /dev/zero >&2"])

    def task():
        return (yield proc.communicate(max_output_bytes=1000))

    result, _ = run_one(sched, task())
    assert result.returncode == 0
    assert result.stdout == b"\0" * 1000
    assert result.stdout_dropped == 99_000
    assert result.stderr == b"\0" * 300
    assert result.stderr_dropped == 0


def test_large_output_without_deadlock(sched: Scheduler) -> None:
    proc = spawn_process(["head", "-c", "5000000", "/dev/zero"], stdin=False)

    def task():
        return (yield proc.communicate(max_output_bytes=10_000_000))

    result, elapsed = run_one(sched, task())
    assert result.returncode == 0
    assert len(result.stdout) == 5_000_000
    assert result.stdout_dropped == 0
    assert elapsed < 5


def test_large_input_and_output_at_once(sched: Scheduler) -> None:
    # cat blocks writing stdout unless stdout is drained while stdin is fed.
    data = os.urandom(3 << 20)
    proc = spawn_process(["cat"])

    def task():
        return (yield proc.communicate(stdin=data, max_output_bytes=len(data)))

    result, elapsed = run_one(sched, task())
    assert result.returncode == 0
    assert result.stdout == data
    assert elapsed < 5


def test_child_that_ignores_its_input(sched: Scheduler) -> None:
    proc = spawn_process(["sh", "-c", "exec 0<&-; echo done"])

    def task():
        return (yield proc.communicate(stdin=b"x" * (1 << 20)))

    result, _ = run_one(sched, task())
    assert result.returncode == 0
    assert result.stdout == b"done\n"


def test_wait_parks_on_the_pidfd_while_others_run(sched: Scheduler) -> None:
    proc = spawn_process(["sh", "-c", "sleep 0.2; exit 7"], stdin=False)
    seen = []

    def waiter():
        return (yield proc.wait())

    def watcher(tid):
        yield
        task = sched.task(tid)
        seen.append((task.state, type(task.blocked_on), task.blocked_on.fd == proc._pidfd))
        n = 0
        while task.state is not TaskState.DONE:
            n += 1
            yield Sleep(0.001)
        seen.append(n)

    w = sched.spawn(waiter())
    sched.spawn(watcher(w))
    sched.run()
    assert sched.result(w) == 7
    assert proc.returncode == 7
    assert seen[0] == (TaskState.BLOCKED_IO, ReadWait, True)
    assert seen[1] > 10  # the watcher kept running while the waiter was parked
    proc.close_pipes()


def test_wait_alone_blocks_in_the_selector() -> None:
    sched = Scheduler()  # the real clock
    proc = spawn_process(["sleep", "0.3"], stdin=False)

    def waiter():
        return (yield proc.wait())

    cpu0, wall0 = time.process_time(), time.monotonic()
    tid = sched.spawn(waiter())
    sched.run()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    sched.close()
    proc.close_pipes()
    assert sched.result(tid) == 0
    assert wall >= 0.25
    assert cpu < 0.1, f"{cpu:.3f} s of CPU waiting {wall:.3f} s for a child"


def test_wait_on_an_exited_child_returns_at_once(sched: Scheduler) -> None:
    proc = spawn_process(["true"], stdin=False)

    def task():
        first = yield proc.wait()
        second = yield proc.wait()  # already reaped: no wait at all
        return first, second

    result, _ = run_one(sched, task())
    assert result == (0, 0)
    proc.close_pipes()


def test_kill_a_long_running_child(sched: Scheduler) -> None:
    proc = spawn_process(["sleep", "30"], stdin=False)

    def task():
        yield Sleep(1)  # virtual: instant
        proc.kill()
        return (yield proc.wait())

    result, elapsed = run_one(sched, task())
    assert result == -signal.SIGKILL
    assert elapsed < 2
    proc.kill()  # a no-op once it has exited
    proc.close_pipes()


def test_kill_reaches_the_process_group(sched: Scheduler) -> None:
    # The shell's own child would keep stdout open if only the shell died.
    proc = spawn_process(["sh", "-c", "sleep 30 & sleep 30; echo never"], stdin=False)

    def task():
        yield Sleep(1)
        proc.kill(signal.SIGTERM)
        return (yield proc.communicate())

    result, elapsed = run_one(sched, task())
    assert result.returncode == -signal.SIGTERM
    assert result.stdout == b""
    assert elapsed < 3


def test_killing_a_communicating_task_does_not_hang_the_loop(sched: Scheduler) -> None:
    proc = spawn_process(["sleep", "30"])
    log = []

    def runner():
        try:
            yield proc.communicate(stdin=b"")
        finally:
            log.append("runner finally")

    def main():
        tid = yield NewTask(runner())
        yield Sleep(1)
        yield KillTask(tid)
        proc.kill()
        try:
            yield WaitTask(tid)
        except Exception as exc:
            log.append(type(exc).__name__)
        log.append(("exit", (yield proc.wait())))

    t0 = time.perf_counter()
    sched.spawn(main())
    sched.run()
    assert time.perf_counter() - t0 < 3
    assert log == ["runner finally", "TaskKilled", ("exit", -signal.SIGKILL)]
    assert sched.alive == 0


def test_several_processes_concurrently(sched: Scheduler) -> None:
    procs = [spawn_process(["sh", "-c", f"sleep 0.{i}; echo {i}"]) for i in range(1, 6)]

    def one(p):
        return (yield p.communicate())

    def main():
        kids = []
        for p in procs:
            kids.append((yield NewTask(one(p))))
        out = []
        for k in kids:
            out.append((yield WaitTask(k)).stdout)
        return out

    result, elapsed = run_one(sched, main())
    assert result == [b"%d\n" % i for i in range(1, 6)]
    assert elapsed < 1.0  # concurrent: about the longest (0.5 s), not the sum (1.5 s)
