"""tiffany.io sockets on 127.0.0.1: helpers, a 1,000-client echo server, and
compute interleaved with I/O on one thread."""

from __future__ import annotations

import itertools
import resource
import socket
import time

import pytest

from tiffany.io import accept, connect, listen, recv, send_all
from tiffany.kernel import (
    Instrument,
    ManualClock,
    NewTask,
    ReadWait,
    Scheduler,
    TaskState,
    WaitTask,
)

N_CLIENTS = 1000
MESSAGES_PER_CLIENT = 3


@pytest.fixture
def sched():
    s = Scheduler(clock=ManualClock())
    yield s
    s.close()


@pytest.fixture
def listener():
    sock = listen("127.0.0.1", 0, backlog=2048)
    yield sock
    sock.close()


def raise_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        target = hard if hard == resource.RLIM_INFINITY else max(soft, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        pytest.skip(f"need {needed} descriptors, the hard limit is {hard}")


def echo_handler(conn: socket.socket):
    try:
        while True:
            data = yield recv(conn, 65536)
            if not data:
                return
            yield send_all(conn, data)
    finally:
        conn.close()


def read_exactly(sock: socket.socket, n: int):
    buf = b""
    while len(buf) < n:
        chunk = yield recv(sock, n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def test_listen_returns_a_non_blocking_listener(listener) -> None:
    assert listener.getblocking() is False
    host, port = listener.getsockname()
    assert host == "127.0.0.1"
    assert port > 0


def test_accept_connect_send_recv_round_trip(sched: Scheduler, listener) -> None:
    address = listener.getsockname()

    def server():
        conn, addr = yield accept(listener)
        assert conn.getblocking() is False
        data = yield read_exactly(conn, 5)
        yield send_all(conn, data[::-1])
        conn.close()
        return addr

    def client():
        sock = yield connect(address)
        try:
            yield send_all(sock, b"hello")
            reply = yield read_exactly(sock, 5)
            eof = yield recv(sock, 10)  # the server closed: b""
        finally:
            sock.close()
        return reply, eof

    s = sched.spawn(server())
    c = sched.spawn(client())
    sched.run()
    assert sched.result(c) == (b"olleh", b"")
    assert sched.result(s)[0] == "127.0.0.1"


def test_connect_refused_raises_in_the_task(sched: Scheduler) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    address = probe.getsockname()
    probe.close()  # nothing listens there now

    def client():
        try:
            yield connect(address)
        except ConnectionRefusedError:
            return "refused"
        except OSError as exc:
            return exc.errno

    tid = sched.spawn(client())
    sched.run()
    assert sched.result(tid) in ("refused", 111)


def test_send_all_waits_for_buffer_space(sched: Scheduler) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    payload = bytes(range(256)) * 16384  # 4 MiB, far more than the buffers

    def sender():
        n = yield send_all(a, payload)
        a.shutdown(socket.SHUT_WR)
        return n

    def receiver():
        chunks = []
        while True:
            chunk = yield recv(b, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    s = sched.spawn(sender())
    r = sched.spawn(receiver())
    try:
        sched.run()
    finally:
        a.close()
        b.close()
    assert sched.result(s) == len(payload)
    assert sched.result(r) == payload


def test_echo_server_with_1000_concurrent_clients(sched: Scheduler, listener) -> None:
    raise_nofile(3 * N_CLIENTS)
    address = listener.getsockname()
    accepted = []

    def server():
        for _ in range(N_CLIENTS):
            conn, _addr = yield accept(listener)
            accepted.append((yield NewTask(echo_handler(conn), daemon=True)))
        return len(accepted)

    def client(i):
        sock = yield connect(address)
        try:
            for j in range(MESSAGES_PER_CLIENT):
                msg = b"client %d message %d\n" % (i, j)
                yield send_all(sock, msg)
                echoed = yield read_exactly(sock, len(msg))
                if echoed != msg:
                    raise AssertionError(f"client {i} got {echoed!r} for {msg!r}")
        finally:
            sock.close()
        return i

    t0 = time.perf_counter()
    srv = sched.spawn(server(), name="server")
    clients = [sched.spawn(client(i), name=f"client-{i}") for i in range(N_CLIENTS)]
    sched.run()
    elapsed = time.perf_counter() - t0
    assert sched.result(srv) == N_CLIENTS
    assert [sched.result(c) for c in clients] == list(range(N_CLIENTS))
    assert sched.alive == 0  # every handler saw its client close and ended
    # The daemon handlers left no record; the server and the clients did.
    assert len(sched.tasks()) == 1 + N_CLIENTS
    assert elapsed < 5.0, f"1,000 clients took {elapsed:.2f} s"


def test_compute_and_io_interleave_on_one_thread(sched: Scheduler, listener) -> None:
    address = listener.getsockname()
    timeline: list[tuple[str, int]] = []
    rounds = 30

    def cpu_task(chunks):
        total = 0
        for i in range(chunks):
            total += sum(x * x for x in range(20_000))  # one chunk of work
            timeline.append(("cpu", i))
            yield  # let the others run
        return total

    def server():
        conn, _ = yield accept(listener)
        yield NewTask(echo_handler(conn), daemon=True)

    def io_client():
        sock = yield connect(address)
        try:
            for j in range(rounds):
                msg = b"ping %03d" % j
                yield send_all(sock, msg)
                assert (yield read_exactly(sock, len(msg))) == msg
                timeline.append(("io", j))
        finally:
            sock.close()
        return rounds

    cpu = sched.spawn(cpu_task(rounds), name="compute")
    sched.spawn(server(), name="server")
    io = sched.spawn(io_client(), name="echo-client")
    sched.run()
    assert sched.result(cpu) == rounds * sum(x * x for x in range(20_000))
    assert sched.result(io) == rounds
    kinds = [k for k, _ in timeline]
    switches = sum(1 for a, b in itertools.pairwise(kinds) if a != b)
    # Both made progress side by side, not one after the other.
    assert switches >= rounds // 2, kinds
    first_io, last_cpu = kinds.index("io"), len(kinds) - 1 - kinds[::-1].index("cpu")
    assert first_io < last_cpu


def test_seed_pyos_server_with_a_handler_per_client(sched: Scheduler, listener) -> None:
    # The io helpers trampolined from a server that spawns one task per client,
    # the clients joined with WaitTask; and an observer of blocked states.
    address = listener.getsockname()
    states = []

    class Observe(Instrument):
        def task_blocked(self, task, call):
            if isinstance(call, ReadWait) and call.fd == listener.fileno():
                states.append(task.state)

    sched.add_instrument(Observe())

    def server(n):
        for _ in range(n):
            conn, _ = yield accept(listener)
            yield NewTask(echo_handler(conn))

    def client(i):
        sock = yield connect(address)
        yield send_all(sock, b"x" * (i + 1))
        data = yield read_exactly(sock, i + 1)
        sock.close()
        return len(data)

    def main():
        yield NewTask(server(5))
        kids = []
        for i in range(5):
            kids.append((yield NewTask(client(i))))
        results = []
        for k in kids:
            results.append((yield WaitTask(k)))
        return results

    tid = sched.spawn(main())
    sched.run()
    assert sched.result(tid) == [1, 2, 3, 4, 5]
    assert states
    assert set(states) == {TaskState.BLOCKED_IO}
