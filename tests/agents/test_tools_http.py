"""The http tool against a real server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tiffany.agents.tools.http import HttpConnectError, HttpStatusError, HttpTimeout, HttpTool

HTTP = HttpTool()


@pytest.fixture
def base(http_server, reply, read_body):
    def hello(h):
        reply(h, 200, b'{"hello": "world"}', "application/json; charset=utf-8", {"X-Test": "1"})

    def echo(h):
        body = read_body(h)
        doc = {
            "method": h.command,
            "content_type": h.headers.get("Content-Type"),
            "auth": h.headers.get("Authorization"),
            "body": body.decode(),
        }
        reply(h, 201, json.dumps(doc).encode(), "application/json")

    def missing(h):
        reply(h, 404, b"no such thing")

    def slow(h):
        h.server.stop.wait(5)
        reply(h, 200, b"late")

    def drip(h):
        h.send_response(200)
        h.send_header("Content-Length", "50")
        h.end_headers()
        for _ in range(50):
            if h.server.stop.wait(0.1):
                return
            h.wfile.write(b"x")
            h.wfile.flush()

    def big(h):
        reply(h, 200, json.dumps({"data": "y" * 10_000}).encode(), "application/json")

    def latin(h):
        reply(h, 200, "café".encode("latin-1"), "text/plain; charset=latin-1")

    def to_ftp(h):
        reply(h, 302, b"", headers={"Location": "ftp://127.0.0.1/x"})

    def to_hello(h):
        reply(h, 302, b"", headers={"Location": "/hello"})

    routes = {
        "/hello": hello,
        "/echo": echo,
        "/missing": missing,
        "/slow": slow,
        "/drip": drip,
        "/big": big,
        "/latin": latin,
        "/to-ftp": to_ftp,
        "/to-hello": to_hello,
    }
    return http_server(routes)


def test_get_json(run_tool, make_ctx, base):
    out = run_tool(HTTP, {"url": f"{base}/hello"}, make_ctx())
    assert out["status"] == 200
    assert out["json"] == {"hello": "world"}
    assert out["body"] == '{"hello": "world"}'
    assert out["headers"]["x-test"] == "1"
    assert out["headers"]["content-type"].startswith("application/json")
    assert out["truncated"] is False


def test_post_json_sets_content_type(run_tool, make_ctx, base):
    args = {"method": "post", "url": f"{base}/echo", "json": {"a": [1, 2]}}
    out = run_tool(HTTP, args, make_ctx())
    assert out["status"] == 201
    assert out["json"]["method"] == "POST"
    assert out["json"]["content_type"] == "application/json"
    assert json.loads(out["json"]["body"]) == {"a": [1, 2]}


def test_text_body_and_headers(run_tool, make_ctx, base):
    args = {
        "method": "PUT",
        "url": f"{base}/echo",
        "body": "plain text",
        "headers": {"Authorization": "Bearer t0k", "Content-Type": "text/plain"},
    }
    out = run_tool(HTTP, args, make_ctx())
    assert out["json"] == {
        "method": "PUT",
        "content_type": "text/plain",
        "auth": "Bearer t0k",
        "body": "plain text",
    }


def test_error_status_raises_unless_told_not_to(run_tool, make_ctx, base):
    with pytest.raises(HttpStatusError) as info:
        run_tool(HTTP, {"url": f"{base}/missing"}, make_ctx())
    assert info.value.code == "tool.http.status"
    assert info.value.fields["status"] == 404
    assert info.value.fields["body"] == "no such thing"
    out = run_tool(HTTP, {"url": f"{base}/missing", "raise_for_status": False}, make_ctx())
    assert out["status"] == 404
    assert out["json"] is None


def test_timeout_waiting_for_the_response(run_tool, make_ctx, base):
    started = time.monotonic()
    with pytest.raises(HttpTimeout) as info:
        run_tool(HTTP, {"url": f"{base}/slow", "timeout_s": 0.3}, make_ctx())
    assert info.value.code == "tool.http.timeout"
    assert time.monotonic() - started < 3


def test_timeout_bounds_the_whole_body_not_each_read(run_tool, make_ctx, base):
    # each byte arrives within 0.1 s, so a per-read timeout would never fire
    started = time.monotonic()
    with pytest.raises(HttpTimeout):
        run_tool(HTTP, {"url": f"{base}/drip", "timeout_s": 0.5}, make_ctx())
    assert time.monotonic() - started < 2


def test_body_cap(run_tool, make_ctx, base):
    out = run_tool(HTTP, {"url": f"{base}/big", "max_body_bytes": 100}, make_ctx())
    assert len(out["body"]) == 100
    assert out["truncated"] is True
    assert out["json"] is None  # a truncated JSON body is not parsed
    out = run_tool(HTTP, {"url": f"{base}/big"}, make_ctx(http_max_body_bytes=300))
    assert len(out["body"]) == 300
    full = run_tool(HTTP, {"url": f"{base}/big"}, make_ctx())
    assert full["json"] == {"data": "y" * 10_000}


def test_charset_is_honoured(run_tool, make_ctx, base):
    assert run_tool(HTTP, {"url": f"{base}/latin"}, make_ctx())["body"] == "café"


def test_connection_refused(run_tool, make_ctx):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HttpConnectError) as info:
        run_tool(HTTP, {"url": f"http://127.0.0.1:{port}/"}, make_ctx())
    assert info.value.code == "tool.http.connect"


def test_redirects_followed_to_http_only(run_tool, make_ctx, base):
    assert run_tool(HTTP, {"url": f"{base}/to-hello"}, make_ctx())["json"] == {"hello": "world"}
    with pytest.raises(HttpConnectError, match="ftp"):
        run_tool(HTTP, {"url": f"{base}/to-ftp"}, make_ctx())
    out = run_tool(HTTP, {"url": f"{base}/to-hello", "follow_redirects": False}, make_ctx())
    assert out["status"] == 302
    assert out["headers"]["location"] == "/hello"


@pytest.mark.parametrize(
    "args",
    [
        {"url": "file:///etc/passwd"},
        {"url": "ftp://example.com/x"},
        {"url": "http:///nohost"},
        {"url": "http://x", "body": "a", "json": {}},
        {"url": "http://x", "method": "TRACE"},
        {"url": "http://x", "timeout_s": 0},
        {"url": "http://x", "bogus": 1},
    ],
)
def test_invalid_args(args):
    with pytest.raises(ValueError):  # noqa: PT011 - pydantic's ValidationError
        HttpTool.Args.model_validate(args)
