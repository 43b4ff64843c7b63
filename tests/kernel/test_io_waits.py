"""D3: ReadWait / WriteWait on sockets and raw descriptors, over the selector."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
import threading
import time

import pytest

from tiffany.errors import KernelError
from tiffany.kernel import (
    KillTask,
    MonotonicClock,
    NewTask,
    ReadWait,
    Scheduler,
    Sleep,
    TaskState,
    WaitTask,
    WriteWait,
)

from .kernel_support import Recorder


@pytest.fixture
def pipe():
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)


@pytest.fixture
def sockpair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_read_wait_on_a_raw_pipe(sched: Scheduler, pipe) -> None:
    r, w = pipe
    got = []

    def reader():
        while True:
            yield ReadWait(r)
            data = os.read(r, 100)
            if not data:
                return b"".join(got)
            got.append(data)

    def writer():
        for chunk in (b"ab", b"cd", b"ef"):
            yield WriteWait(w)
            os.write(w, chunk)
            yield Sleep(1)
        os.close(w)

    tid = sched.spawn(reader())
    sched.spawn(writer())
    sched.run()
    assert sched.result(tid) == b"abcdef"
    assert got == [b"ab", b"cd", b"ef"]


def test_read_and_write_wait_on_a_socket(sched: Scheduler, sockpair) -> None:
    a, b = sockpair
    payload = os.urandom(1 << 20)  # more than the socket buffers hold

    def sender():
        view = memoryview(payload)
        waits = 0
        while view:
            yield WriteWait(a)  # a file object: its fileno() is used
            with contextlib.suppress(BlockingIOError):
                view = view[a.send(view) :]
            waits += 1
        a.shutdown(socket.SHUT_WR)
        return waits

    def receiver():
        chunks = []
        while True:
            yield ReadWait(b)
            try:
                data = b.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                return b"".join(chunks)
            chunks.append(data)

    s = sched.spawn(sender())
    r = sched.spawn(receiver())
    sched.run()
    assert sched.result(r) == payload
    assert sched.result(s) > 1  # the sender really had to wait for buffer space


def test_reader_and_writer_on_the_same_descriptor(sched: Scheduler, sockpair) -> None:
    a, b = sockpair
    log = []

    def reader():
        yield ReadWait(a)
        log.append(("read", a.recv(10)))

    def writer():
        yield WriteWait(a)
        log.append(("write", a.send(b"out")))

    def peer():
        yield Sleep(1)
        b.send(b"in")
        yield ReadWait(b)
        log.append(("peer", b.recv(10)))

    sched.spawn(reader())
    sched.spawn(writer())
    sched.spawn(peer())
    sched.run()
    assert sorted(log) == [("peer", b"out"), ("read", b"in"), ("write", 3)]


def test_second_reader_of_the_same_fd_gets_a_kernel_error(sched: Scheduler, pipe) -> None:
    r, w = pipe
    outcome = {}

    def first():
        yield ReadWait(r)
        outcome["first"] = os.read(r, 10)

    def second():
        try:
            yield ReadWait(r)
        except KernelError as exc:
            outcome["second"] = exc
        yield Sleep(1)
        os.write(w, b"data")

    a = sched.spawn(first())
    sched.spawn(second())
    sched.run()
    assert outcome["first"] == b"data"
    err = outcome["second"]
    assert err.fields == {"fd": r, "tid": a}


def test_second_writer_of_the_same_fd_gets_a_kernel_error(sched: Scheduler, sockpair) -> None:
    a, _b = sockpair
    outcome = []

    def writer():
        yield WriteWait(a)
        outcome.append("ok")

    def writer2():
        try:
            yield WriteWait(a)
        except KernelError:
            outcome.append("error")

    sched.spawn(writer())
    sched.spawn(writer2())
    sched.run()
    assert sorted(outcome) == ["error", "ok"]


def test_bad_descriptors_raise_in_the_task(sched: Scheduler) -> None:
    errors = []

    def task(target):
        try:
            yield ReadWait(target)
        except (OSError, ValueError) as exc:
            errors.append(type(exc))

    with tempfile.TemporaryFile() as regular:  # epoll refuses regular files
        sched.spawn(task(regular))
        sched.spawn(task(-1))
        r, w = os.pipe()
        os.close(r)
        os.close(w)
        sched.spawn(task(r))  # closed
        closed = socket.socket()
        closed.close()
        sched.spawn(task(closed))  # a closed socket's fileno() is -1
        sched.run()
    assert len(errors) == 4
    assert sched.alive == 0


def test_killed_io_waiter_frees_the_descriptor(sched: Scheduler, pipe) -> None:
    r, w = pipe
    out = []

    def waiter():
        yield ReadWait(r)

    def main():
        tid = yield NewTask(waiter())
        yield Sleep(1)
        yield KillTask(tid)
        os.write(w, b"z")
        yield ReadWait(r)  # the slot is free again
        out.append(os.read(r, 1))
        try:
            yield WaitTask(tid)
        except KernelError:
            out.append("killed")

    sched.spawn(main())
    sched.run()
    assert out == [b"z", "killed"]


def test_loop_blocks_in_the_selector_without_busy_waiting(recorder: Recorder) -> None:
    r, w = os.pipe()
    sched = Scheduler(clock=MonotonicClock(), instruments=[recorder])

    def reader():
        yield ReadWait(r)
        return os.read(r, 10)

    timer = threading.Timer(0.3, os.write, (w, b"late"))
    try:
        tid = sched.spawn(reader())
        wall0, cpu0 = time.monotonic(), time.process_time()
        timer.start()
        sched.run()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    finally:
        timer.join()
        sched.close()
        os.close(r)
        os.close(w)
    assert sched.result(tid) == b"late"
    assert wall >= 0.25
    assert cpu < 0.05, f"{cpu:.3f} s of CPU while waiting {wall:.3f} s"
    # One blocking poll (timeout None) and the final commit when nothing is
    # left, not a spin of zero-timeout polls.
    waits = recorder.hooks("before_wait")
    assert waits == [("before_wait", None), ("before_wait", None)], waits
    assert recorder.hooks("after_wait")[0] == ("after_wait", 1)


def test_io_waiters_and_timers_together(sched: Scheduler, pipe) -> None:
    r, w = pipe
    log = []

    def reader():
        yield ReadWait(r)
        log.append(("read", os.read(r, 10), sched.clock.monotonic()))

    def sleeper():
        yield Sleep(3)
        log.append(("slept", sched.clock.monotonic()))
        os.write(w, b"x")

    sched.spawn(reader())
    sched.spawn(sleeper())
    sched.run()
    assert log == [("slept", 3), ("read", b"x", 3)]
    assert sched.task(1).state is TaskState.DONE


def test_descriptor_closed_and_reused_under_a_parked_waiter(sched: Scheduler) -> None:
    r, w = os.pipe()
    errors = []

    def parked():
        yield ReadWait(r)

    def closer():
        yield Sleep(1)
        os.close(r)  # closed while ``parked`` waits on it: epoll forgets it
        r2, w2 = os.pipe()
        try:
            assert r2 == r  # the number is reused
            try:
                yield WriteWait(r2)
            except OSError as exc:
                errors.append(exc)
            os.write(w2, b"x")
            yield ReadWait(r2)  # the descriptor can be waited on again
            return os.read(r2, 1)
        finally:
            os.close(r2)
            os.close(w2)

    p = sched.spawn(parked())
    c = sched.spawn(closer())
    try:
        sched.run()  # neither a KernelInternalError nor a hang
    finally:
        os.close(w)
    assert len(errors) == 1
    assert sched.result(c) == b"x"
    task = sched.task(p)
    assert task.state is TaskState.CRASHED
    assert isinstance(task.error, OSError)
    assert task.error.errno == errno.EBADF
