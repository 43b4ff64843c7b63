"""Slow clients against a real served API on 127.0.0.1: deadlines and the connection cap.

A few hundred half-sent requests (silent, headers cut short, headers
trickling a byte at a time, a body that trickles) are each answered 408 and
closed after the (short) deadline, while a normal request is answered during
the attack; past ``http_max_connections`` one more connection is answered
503 at once (``tiffany/api/connections.py``).
"""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from api_support import LiveApi, make_settings, wait_until

from tiffany.api.connections import effective_max_connections

#: How long every half-sent socket may take to be closed, all together (generous: a loaded box).
CLOSE_BOUND_S = 60.0


def _connect(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data:
        sock.sendall(data)
    return sock


def _read_until_closed(socks: list[socket.socket], bound: float = CLOSE_BOUND_S) -> list[bytes]:
    """Everything each socket receives up to its EOF; fail if any is still open at ``bound``."""
    got = {s.fileno(): b"" for s in socks}
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + bound
    open_ = len(socks)
    try:
        while open_:
            left = deadline - time.monotonic()
            assert left > 0, f"{open_} of {len(socks)} connections still open after {bound} s"
            for key, _ in sel.select(timeout=left):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    got[sock.fileno()] += chunk
                else:
                    sel.unregister(sock)
                    open_ -= 1
    finally:
        sel.close()
    return [got[s.fileno()] for s in socks]


def _status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


@pytest.fixture
def short_deadlines(api_dir, live_api_factory) -> LiveApi:
    settings = make_settings(api_dir, http_header_timeout_s=1.0, http_body_timeout_s=1.0)
    return live_api_factory(settings)


def test_half_sent_requests_are_answered_408_and_closed_while_others_are_served(
    short_deadlines,
) -> None:
    live = short_deadlines
    port = live.port
    silent = [_connect(port) for _ in range(100)]
    cut = [_connect(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: ") for _ in range(200)]
    # A normal request is answered during the attack.
    with httpx.Client(base_url=live.base, timeout=30) as client:
        assert client.get("/healthz").json() == {"ok": True}
    answers = _read_until_closed(silent + cut)
    for answer in answers:
        status, body = _status_and_body(answer)
        assert status == 408
        assert body["code"] == "http.header_timeout"
        assert body["setting"] == "TIFFANY_HTTP_HEADER_TIMEOUT_S"
    for sock in silent + cut:
        sock.close()
    wait_until(lambda: len(live.server.server_state.connections) == 0, timeout=30)


def test_headers_trickling_a_byte_at_a_time_meet_the_deadline_of_the_request(
    short_deadlines,
) -> None:
    """Data arriving does not extend the deadline: a slowloris sends some all the time."""
    sock = _connect(short_deadlines.port)
    stop = threading.Event()

    def trickle() -> None:
        # Header bytes without end, one every 50 ms, until the server closes.
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            while not stop.wait(0.05):
                sock.sendall(b"X")
        except OSError:
            return

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        [answer] = _read_until_closed([sock])
    finally:
        stop.set()
        sender.join(10)
        sock.close()
    status, body = _status_and_body(answer)
    assert (status, body["code"]) == (408, "http.header_timeout")


def test_a_body_that_trickles_is_answered_408_and_closed(short_deadlines) -> None:
    head = (
        b"POST /api/runs HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n"
    )
    socks = [_connect(short_deadlines.port, head + b'{"plan": ') for _ in range(50)]
    with httpx.Client(base_url=short_deadlines.base, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
    answers = _read_until_closed(socks)
    for sock in socks:
        sock.close()
    for answer in answers:
        status, body = _status_and_body(answer)
        assert (status, body["code"]) == (408, "http.body_timeout"), answer
        assert body["setting"] == "TIFFANY_HTTP_BODY_TIMEOUT_S"


def test_a_keep_alive_connection_is_served_again_after_its_first_request(
    short_deadlines,
) -> None:
    """The deadlines are per request: a connection idle between requests is keep-alive's."""
    conn = http.client.HTTPConnection("127.0.0.1", short_deadlines.port, timeout=30)
    try:
        for _ in range(3):
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() == b'{"ok":true}'
            # Idle for longer than the header deadline, less than keep-alive:
            # the same socket is then used again (http.client never reconnects).
            time.sleep(1.5)
            assert conn.sock is not None
    finally:
        conn.close()


def test_one_connection_past_the_cap_is_answered_503_at_once(api_dir, live_api_factory) -> None:
    live = live_api_factory(make_settings(api_dir, http_max_connections=20))
    held = [_connect(live.port) for _ in range(20)]
    try:
        wait_until(lambda: len(live.server.server_state.connections) >= 20, timeout=30)
        extra = _connect(live.port)
        [answer] = _read_until_closed([extra])
        extra.close()
        status, body = _status_and_body(answer)
        assert status == 503
        assert body["code"] == "http.too_many_connections"
        assert body["setting"] == "TIFFANY_HTTP_MAX_CONNECTIONS"
        assert "20" in body["message"]
        held.pop().close()
        wait_until(lambda: len(live.server.server_state.connections) < 20, timeout=30)
        with httpx.Client(base_url=live.base, timeout=30) as client:
            assert client.get("/healthz").status_code == 200
    finally:
        for sock in held:
            sock.close()


def test_the_cap_is_lowered_to_the_open_file_limit(monkeypatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 4096))
    assert effective_max_connections(10_000) == 1024 - 256
    assert effective_max_connections(500) == 500
