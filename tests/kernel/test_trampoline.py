"""D2: nested coroutines (trampolining), ``yield from``, PyOS-style results, misuse."""

from __future__ import annotations

import socket
import traceback

import pytest
import structlog

from tiffany.errors import SystemCallMisuse
from tiffany.io import connect, recv, send_all
from tiffany.kernel import (
    GetTid,
    NewTask,
    ReadWait,
    Scheduler,
    Sleep,
    SystemCall,
    TaskState,
    WaitTask,
)

from .kernel_support import Recorder, spin

DEPTH = 60


def test_deep_nesting_returns_values(sched: Scheduler) -> None:
    frames_at_bottom = []

    def rec(n):
        if n == 0:
            yield Sleep(1)  # park at the bottom of the stack
            frames_at_bottom.append(sched.task(1).frames())
            return 0
        below = yield rec(n - 1)
        return below + 1

    tid = sched.spawn(rec(DEPTH))
    sched.run()
    assert sched.result(tid) == DEPTH
    frames = frames_at_bottom[0]
    assert len(frames) == DEPTH + 1
    assert all(fn.endswith("rec") for fn, _path, _line in frames)
    assert sched.task(tid).stack is None  # dropped with the task


def test_nested_calls_see_system_calls_and_the_task_id(sched: Scheduler) -> None:
    def whoami():
        return (yield GetTid())

    def outer():
        a = yield whoami()
        yield Sleep(1)
        b = yield whoami()
        return a, b

    tid = sched.spawn(outer())
    sched.run()
    assert sched.result(tid) == (tid, tid)


def test_nested_exception_propagates_to_the_caller_with_its_frames(sched: Scheduler) -> None:
    seen = []

    def innermost():
        yield Sleep(1)
        raise ValueError("deep")

    def middle():
        yield
        yield innermost()
        return "unreached"

    def outer():
        try:
            yield middle()
        except ValueError as exc:
            names = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            seen.append((str(exc), names))
        return "recovered"

    tid = sched.spawn(outer())
    sched.run()
    assert sched.result(tid) == "recovered"
    ((msg, names),) = seen
    assert msg == "deep"
    assert names.index("outer") < names.index("middle") < names.index("innermost")


def test_uncaught_nested_exception_crashes_the_task(sched: Scheduler) -> None:
    def level(n):
        if n == 0:
            yield
            raise KeyError("bottom")
        yield level(n - 1)

    tid = sched.spawn(level(DEPTH))
    with structlog.testing.capture_logs() as logs:  # no 60-frame traceback rendering
        sched.run()
    assert [e["tid"] for e in logs if e["event"] == "kernel.task_crashed"] == [tid]
    task = sched.task(tid)
    assert task.state is TaskState.CRASHED
    assert isinstance(task.error, KeyError)
    names = [f.name for f in traceback.extract_tb(task.error.__traceback__)]
    assert names.count("level") == DEPTH + 1


def test_exception_in_caller_runs_after_nested_finally(sched: Scheduler) -> None:
    log = []

    def inner():
        try:
            yield Sleep(1)
            raise RuntimeError("x")
        finally:
            log.append("inner finally")

    def outer():
        try:
            yield inner()
        except RuntimeError:
            log.append("caught")

    sched.spawn(outer())
    sched.run()
    assert log == ["inner finally", "caught"]


def test_yield_from_works_alongside_trampolining(sched: Scheduler) -> None:
    def sub(n):
        yield Sleep(n)
        me = yield GetTid()
        return n, me

    def via_trampoline(n):
        return (yield sub(n))

    def main():
        a = yield from sub(1)
        b = yield via_trampoline(2)
        c = yield from via_trampoline(3)
        return a, b, c

    tid = sched.spawn(main())
    sched.run()
    assert sched.result(tid) == ((1, tid), (2, tid), (3, tid))
    assert sched.clock.monotonic() == 6


def test_plain_value_from_a_nested_coroutine_returns_it_and_closes_it(sched: Scheduler) -> None:
    log = []

    def producer():
        try:
            yield Sleep(1)
            yield "value", 42  # PyOS style: hand the value to the caller
            log.append("unreachable")
        finally:
            log.append("producer closed")

    def consumer():
        got = yield producer()
        log.append(got)
        return got

    tid = sched.spawn(consumer())
    sched.run()
    assert sched.result(tid) == ("value", 42)
    assert log == ["producer closed", ("value", 42)]


# -- the seed's Accept(sock), as written there ------------------------------------------


def Accept(sock):
    yield ReadWait(sock)
    client, addr = sock.accept()  # accept connection (once socket is ready)
    yield client, addr  # yield the result back to caller


def test_seed_accept_trampolining_against_a_real_socket(sched: Scheduler) -> None:
    n_clients = 5
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    address = listener.getsockname()
    handled = []

    def handle_client(client, addr):
        yield ReadWait(client)
        data = client.recv(100)
        client.sendall(data.upper())
        client.close()
        handled.append(addr)

    def server(sock):
        for _ in range(n_clients):
            client, addr = yield Accept(sock)  # call sub-coroutine Accept
            yield NewTask(handle_client(client, addr))

    def client(i):
        sock = yield connect(address)
        try:
            yield send_all(sock, b"hello %d" % i)
            reply = yield recv(sock, 100)
        finally:
            sock.close()
        return reply

    try:
        srv = sched.spawn(server(listener))
        clients = [sched.spawn(client(i)) for i in range(n_clients)]
        sched.run()
    finally:
        listener.close()
    assert sched.task(srv).state is TaskState.DONE
    assert [sched.result(c) for c in clients] == [b"HELLO %d" % i for i in range(n_clients)]
    assert len(handled) == n_clients


# -- misuse ----------------------------------------------------------------------------


def test_plain_value_at_top_level_is_a_misuse_thrown_at_the_yield(sched: Scheduler) -> None:
    caught = []

    def confused():
        try:
            yield 42
        except SystemCallMisuse as exc:
            caught.append(exc)
        try:
            yield "text"
        except TypeError as exc:  # SystemCallMisuse is a TypeError
            caught.append(exc)
        return "survived"

    tid = sched.spawn(confused())
    other = sched.spawn(spin(5))
    sched.run()
    assert sched.result(tid) == "survived"
    assert sched.task(other).state is TaskState.DONE
    assert len(caught) == 2
    assert "42" in str(caught[0])
    assert caught[0].fields["tid"] == tid


def test_uncaught_misuse_crashes_only_that_task(sched: Scheduler) -> None:
    def confused():
        yield 3.14

    tid = sched.spawn(confused())
    other = sched.spawn(spin(5))
    sched.run()
    assert sched.task(tid).state is TaskState.CRASHED
    assert isinstance(sched.task(tid).error, SystemCallMisuse)
    assert sched.task(other).state is TaskState.DONE


class Unregistered(SystemCall):
    """A system call no handler is registered for."""

    __slots__ = ()
    kind = "unregistered"


@pytest.mark.parametrize("nested", [False, True], ids=["top-level", "nested"])
def test_system_call_without_a_handler_is_a_misuse(sched: Scheduler, nested: bool) -> None:
    outcome = []

    def sub():
        yield Unregistered()
        return "fell through"

    def task():
        try:
            if nested:
                outcome.append((yield sub()))
            else:
                outcome.append((yield Unregistered()))
        except SystemCallMisuse as exc:
            outcome.append(exc)

    sched.spawn(task())
    sched.run()
    assert len(outcome) == 1
    assert isinstance(outcome[0], SystemCallMisuse), outcome


def test_trampolining_hooks(sched: Scheduler, recorder: Recorder) -> None:
    def sub():
        yield
        return 1

    def main():
        return (yield sub())

    tid = sched.spawn(main())
    sched.run()
    after = [e[2] for e in recorder.events if e[0] == "after_dispatch" and e[1] == tid]
    # main yields the generator, sub yields None, sub returns, main returns.
    assert after == ["generator", None, "RETURNED", "RETURNED"]
    assert sched.result(tid) == 1


def test_wait_task_from_nested_coroutine(sched: Scheduler) -> None:
    def child():
        yield Sleep(2)
        return "kid"

    def joiner():
        tid = yield NewTask(child())
        return (yield WaitTask(tid))

    def main():
        return (yield joiner())

    tid = sched.spawn(main())
    sched.run()
    assert sched.result(tid) == "kid"
