"""The engine's control server on a real Unix socket: which thread answers, and lines stay whole.

A quick request (``quick(request)``) is handled on its connection's thread;
a deferred answer is written by the thread that completes its future when
the socket takes it at once, else (or for its tail) by the pool.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tiffany.engine.control_server import WORKERS, ControlServer
from tiffany.errors import RunFinished
from tiffany.wire.control import (
    Cancel,
    Command,
    Verify,
    WaitProjected,
    call,
    decode_frame,
    encode_frame,
)


class Handler:
    """Answers a ``cancel`` at once (echoing its run id), parks ``verify`` until released,
    defers ``wait_projected``: real commands, decoded by the server, dispatched by type."""

    def __init__(self) -> None:
        self.threads: dict[int, str] = {}
        self.later: dict[int, Future[dict[str, Any]]] = {}
        self.release = threading.Event()

    def __call__(self, command: Command) -> dict[str, Any] | Future[dict[str, Any]]:
        assert command.id is not None
        self.threads[command.id] = threading.current_thread().name
        if isinstance(command, Verify):
            assert self.release.wait(30)
            return {"waited": True}
        if isinstance(command, WaitProjected):
            fut: Future[dict[str, Any]] = Future()
            self.later[command.id] = fut
            return fut
        assert isinstance(command, Cancel)
        return {"echo": command.run_id}


def _quick(command: Command) -> bool:
    return isinstance(command, Cancel | WaitProjected)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlServer, Handler, Path]]:
    handler = Handler()
    server = ControlServer(tmp_path / "control.sock", handler, _quick)
    server.start()
    try:
        yield server, handler, tmp_path / "control.sock"
    finally:
        handler.release.set()
        server.stop()


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(path))
    return sock


def _deferred(handler: Handler, *ids: int, handled: int = 0) -> None:
    """Wait until requests ``ids`` hold a future and ``handled`` requests reached ``handle``."""
    deadline = time.monotonic() + 10
    while not (set(ids) <= handler.later.keys() and len(handler.threads) >= handled):
        assert time.monotonic() < deadline, f"requests {ids} never reached the handler"
        time.sleep(0.01)


def _lines(sock: socket.socket, n: int) -> list[dict[str, Any]]:
    buf = b""
    out: list[dict[str, Any]] = []
    while len(out) < n:
        chunk = sock.recv(1 << 20)
        assert chunk, "the server closed the connection"
        buf += chunk
        *whole, buf = buf.split(b"\n")
        out += [decode_frame(line) for line in whole]
    assert buf == b""
    return out


def test_quick_requests_are_answered_on_the_connection_thread(served):
    _, handler, path = served
    with _connect(path) as sock:
        sock.sendall(encode_frame({"id": 1, "op": "cancel", "run_id": "hi"}))
        sock.sendall(encode_frame({"id": 2, "op": "verify"}))
        assert _lines(sock, 1) == [{"id": 1, "ok": True, "echo": "hi"}]
        handler.release.set()
        assert _lines(sock, 1) == [{"id": 2, "ok": True, "waited": True}]
    assert handler.threads[1] == "tiffany-control-conn"
    assert handler.threads[2].startswith("tiffany-control_")  # the pool's


def test_a_deferred_answer_goes_out_while_every_pool_worker_is_busy(served):
    # Every worker of the pool is held by a blocking request: the answer the
    # resolving thread completes must not need one of them.
    _, handler, path = served
    with _connect(path) as sock:
        for i in range(WORKERS):
            sock.sendall(encode_frame({"id": 100 + i, "op": "verify"}))
        sock.sendall(encode_frame({"id": 1, "op": "wait_projected", "seq": 1}))
        _deferred(handler, 1, handled=WORKERS + 1)
        resolver = threading.Thread(
            target=handler.later[1].set_result, args=({"run_id": "r1", "seq": 7},)
        )
        resolver.start()
        resolver.join()
        assert _lines(sock, 1) == [{"id": 1, "ok": True, "run_id": "r1", "seq": 7}]
        handler.release.set()
        answers = _lines(sock, WORKERS)
    assert sorted(a["id"] for a in answers) == list(range(100, 100 + WORKERS))


def test_a_line_the_socket_cannot_take_at_once_is_finished_by_the_pool_whole(served):
    # The client reads nothing while a 4 MB answer and a small one are
    # completed: the first goes out in part at once, its tail from the pool
    # (holding the connection's lock), and the second cannot cut into it.
    _, handler, path = served
    with _connect(path) as sock:
        sock.sendall(
            encode_frame({"id": 1, "op": "wait_projected", "seq": 1})
            + encode_frame({"id": 2, "op": "wait_projected", "seq": 1})
        )
        _deferred(handler, 1, 2)
        big = "x" * (4 << 20)
        handler.later[1].set_result({"blob": big})
        handler.later[2].set_result({"small": True})
        answers = {a["id"]: a for a in _lines(sock, 2)}
    assert answers[1] == {"id": 1, "ok": True, "blob": big}
    assert answers[2] == {"id": 2, "ok": True, "small": True}


def test_a_refused_deferred_answer_names_its_error(served):
    _, handler, path = served
    with _connect(path) as sock:
        sock.sendall(encode_frame({"id": 1, "op": "wait_projected", "seq": 1}))
        _deferred(handler, 1)
        handler.later[1].set_exception(RuntimeError("boom"))
        (answer,) = _lines(sock, 1)
    assert answer["id"] == 1
    assert answer["ok"] is False
    assert answer["kind"] == "fault"  # a bug: no refusal of the caller's
    assert "boom" in answer["error"]


def test_the_answer_of_a_client_gone_is_dropped_and_the_server_goes_on(served):
    _, handler, path = served
    with _connect(path) as sock:
        sock.sendall(encode_frame({"id": 1, "op": "wait_projected", "seq": 1}))
        _deferred(handler, 1)
    handler.later[1].set_result({"late": True})  # the resolving thread sees EPIPE/ECONNRESET
    with _connect(path) as sock:
        sock.sendall(encode_frame({"id": 2, "op": "cancel", "run_id": "still here"}))
        assert _lines(sock, 1) == [{"id": 2, "ok": True, "echo": "still here"}]


def test_a_command_decoded_at_the_intake_is_refused_naming_its_field(served):
    """A field of the wrong type never reaches the handler: the answer names the field."""
    _, handler, path = served
    with _connect(path) as sock:
        sock.sendall(encode_frame({"id": 1, "op": "wait_projected", "seq": -3}))
        sock.sendall(encode_frame({"id": 2, "op": "signal", "run_id": "r", "name": 7}))
        sock.sendall(encode_frame({"id": 3, "op": "reboot"}))
        sock.sendall(b'{"id": 4, "op": "cancel", \n')  # not JSON
        sock.sendall(encode_frame({"id": 5, "op": "cancel", "run_id": "ok"}))
        answers = {a["id"]: a for a in _lines(sock, 5)}
    assert answers[1]["kind"] == "invalid"
    assert answers[1]["field"] == "seq"
    assert answers[1]["detail"] == [{"loc": "seq", "msg": "Expected `int` >= 0"}]
    assert (answers[2]["kind"], answers[2]["field"]) == ("invalid", "name")
    assert answers[3]["kind"] == "malformed"
    assert "reboot" in answers[3]["error"]
    assert answers[4]["kind"] == "invalid"
    assert answers[5] == {"id": 5, "ok": True, "echo": "ok"}  # the connection goes on
    assert set(handler.threads) == {5}  # only the good one reached the handler


def test_a_refusal_crosses_as_its_kind_and_comes_back_as_its_type(served):
    """What the handler raises (a domain refusal) is what the client raises: no HTTP code."""
    server, _, path = served

    def refuse(command: Command) -> Any:
        raise RunFinished("run r already finished (succeeded)", detail={"status": "succeeded"})

    server.handle = refuse
    with pytest.raises(RunFinished) as info:
        call(path.parent, Cancel(run_id="r"))
    assert info.value.detail == {"status": "succeeded"}
    assert info.value.message == "run r already finished (succeeded)"
    assert not hasattr(info.value, "status")
