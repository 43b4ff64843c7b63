"""Every route that takes a body reads it the same way: capped, then parsed with limits.

``POST /api/schedules`` let FastAPI read its body: all of it (a 152 MB body
was buffered on the event loop before anything looked at it), then answered
a non-UTF-8 or deeply nested one with an undocumented 400 where
``POST /api/runs`` answered 413 and 422. Now every body route reads through
``tiffany/api/body.py``: 413 naming the size setting before the body is
buffered, 422 naming the byte offset or the path, whatever the size (the
big ones are parsed in the worker process).
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest
from api_support import make_settings
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tiffany.api import create_app
from tiffany.api.routes import activity, runs, schedules, system, tools

#: Each route that takes a body, and the setting of its size cap.
BODY_ROUTES = [
    ("/api/runs", "TIFFANY_MAX_PLAN_BYTES"),
    ("/api/schedules", "TIFFANY_MAX_PLAN_BYTES"),
    ("/api/runs/run-none/rerun", "TIFFANY_MAX_PLAN_BYTES"),
    ("/api/runs/run-none/signals/go", "TIFFANY_MAX_SIGNAL_BYTES"),
]
ROUTES = [path for path, _ in BODY_ROUTES]

#: Large enough for the worker process (over body.BIG_BODY_BYTES), under every cap.
BIG = 100_000


@pytest.fixture(scope="module")
def client(engine) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(engine.data_dir)), raise_server_exceptions=False) as c:
        yield c


def test_no_route_has_fastapi_read_its_body() -> None:
    """A body model makes FastAPI read the body whole, uncapped: none is declared."""
    for module in (runs, schedules, tools, activity, system):
        for route in module.router.routes:
            if isinstance(route, APIRoute):
                assert route.body_field is None, (route.path, route.methods)


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("size", ["small", "big"])
def test_a_deep_body_is_a_422_naming_the_depth(client, path: str, size: str) -> None:
    depth = 100 if size == "small" else BIG // 2
    r = client.post(path, content=b"[" * depth + b"]" * depth)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"][0] == "body"
    assert "nested deeper than 64" in detail["msg"]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("pad", [0, BIG])
def test_a_body_that_is_not_utf8_is_a_422_naming_the_byte(client, path: str, pad: int) -> None:
    body = b'{"plan": "' + b"x" * pad + b'\xff"}'
    r = client.post(path, content=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    offset = 10 + pad
    assert (detail["loc"], detail["offset"]) == (["body"], offset)
    assert f"not UTF-8 (byte {offset})" in detail["msg"]


@pytest.mark.parametrize(("path", "setting"), BODY_ROUTES)
def test_a_declared_length_over_the_cap_is_a_413_naming_the_setting(
    client, path: str, setting: str
) -> None:
    limit = 262_144 if setting == "TIFFANY_MAX_SIGNAL_BYTES" else 1_048_576
    r = client.post(path, content=b" " * (limit + 1))
    assert r.status_code == 413, r.text
    answer = r.json()
    assert (answer["limit_bytes"], answer["setting"]) == (limit, setting)
    assert setting in answer["message"]


#: What a client streams at most: the body of the issue.
STREAM_BYTES = 152 * 1024 * 1024
CHUNK = 256 * 1024


def _stream(port: int, path: str) -> tuple[int, bytes]:
    """POST a chunked body of up to STREAM_BYTES; return how much was sent and the answer.

    Sending stops as soon as the server answers (or stops reading): what
    was sent by then is what the server could have buffered, plus the
    sockets' buffers.
    """
    sent = 0
    chunk = b"%x\r\n" % CHUNK + b" " * CHUNK + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        try:
            while sent < STREAM_BYTES:
                readable, writable, _ = select.select([sock], [sock], [], 60)
                if readable or not writable:
                    break  # answered (or not reading at all for a minute)
                sock.sendall(chunk)
                sent += CHUNK
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                got = sock.recv(65536)
                if not got:
                    break
                answer += got
        except ConnectionResetError:
            pass
    return sent, answer


@pytest.mark.parametrize(("path", "setting"), BODY_ROUTES)
def test_a_152_mb_streamed_body_is_refused_before_it_is_buffered(
    engine, live_api_factory, path: str, setting: str
) -> None:
    live = live_api_factory(make_settings(engine.data_dir))
    sent, answer = _stream(live.port, path)
    # The cap is 1 MiB (256 KiB): a few more in the sockets' buffers, never the 152.
    assert sent < 32 * 1024 * 1024, (sent, answer[:200])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/run-none/cancel",
        "/api/runs/run-none/verify",
        "/api/schedules/sched-none/pause",
        "/api/schedules/sched-none/resume",
    ],
)
def test_a_route_without_a_body_answers_without_reading_one(
    engine, live_api_factory, path: str
) -> None:
    """The POST routes that take no body never read one: 152 MB sent costs them nothing."""
    live = live_api_factory(make_settings(engine.data_dir))
    sent, answer = _stream(live.port, path)
    assert sent < 32 * 1024 * 1024, (sent, answer[:200])
    assert answer.startswith(b"HTTP/1.1 404"), answer[:300]
