"""The http tool against a real server on 127.0.0.1 (allowed explicitly: the
egress policy refuses loopback by default), and the egress policy itself."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tiffany.agents.tools import http as http_mod
from tiffany.agents.tools.http import (
    EgressPolicy,
    EgressRefused,
    HttpConnectError,
    HttpStatusError,
    HttpTimeout,
    HttpTool,
    blocked_kind,
)

HTTP = HttpTool()


@pytest.fixture
def make_ctx(make_ctx):
    """The conftest's contexts, with the test servers' 127.0.0.1 allowed (unless given)."""

    def make(**settings):
        settings.setdefault("http_allow", ("127.0.0.1",))
        return make_ctx(**settings)

    return make


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


# -- egress policy --------------------------------------------------------------


@pytest.fixture
def counted(http_server, reply):
    """A server on 127.0.0.1 that counts the requests it gets: (base, hits)."""
    hits: list[str] = []

    def hello(h):
        hits.append(h.headers.get("Host"))
        reply(h, 200, b'{"hello": "world"}', "application/json")

    def to_loopback(h):
        hits.append(h.headers.get("Host"))
        port = h.server.server_address[1]
        reply(h, 302, b"", headers={"Location": f"http://127.0.0.1:{port}/hello"})

    base = http_server({"/hello": hello, "/to-loopback": to_loopback})
    return base, hits


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "127.1",
    "2130706433",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "0x7f000001",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "localhost",
    "LocalHost",
]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_loopback_is_refused_in_every_spelling(run_tool, make_ctx, counted, host):
    base, hits = counted
    url = f"http://{host}:{_port(base)}/hello"
    with pytest.raises(EgressRefused) as info:
        run_tool(HTTP, {"url": url}, make_ctx(http_allow=()))
    assert info.value.code == "tool.http.egress"
    assert "TIFFANY_HTTP_ALLOW" in info.value.message
    assert "loopback" in info.value.fields["kind"]
    assert info.value.fields["host"]
    assert hits == []  # nothing reached the server
    # the same URL with the address allowed reaches it: the refusal was the policy
    if host not in ("[::ffff:127.0.0.1]", "[::ffff:7f00:1]"):
        allowed = make_ctx(http_allow=("127.0.0.0/8", "::1", "::ffff:127.0.0.1"))
        assert run_tool(HTTP, {"url": url}, allowed)["status"] == 200


@pytest.mark.parametrize(
    "address",
    [
        "0.0.0.0",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "224.0.0.1",
        "239.255.255.250",
        "255.255.255.255",
        "240.0.0.1",
        "::",
        "::1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "ff02::1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",
        "2002:7f00:1::",
        "2002:a00:1::",
        "64:ff9b::7f00:1",
        "64:ff9b::a00:1",
    ],
)
def test_non_public_addresses_are_blocked(address):
    import ipaddress

    assert blocked_kind(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"]
)
def test_public_addresses_pass(address):
    import ipaddress

    assert blocked_kind(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("host", ["10.0.0.1", "192.168.0.1", "[fc00::1]", "169.254.169.254"])
def test_private_literals_are_refused_before_connecting(run_tool, make_ctx, host):
    with pytest.raises(EgressRefused, match="TIFFANY_HTTP_ALLOW"):
        run_tool(HTTP, {"url": f"http://{host}:9/", "timeout_s": 2}, make_ctx(http_allow=()))


def test_redirect_to_a_private_address_is_refused(run_tool, make_ctx, counted):
    base, hits = counted
    port = _port(base)
    # the start host is allowed by name; the redirect goes to 127.0.0.1, which is not
    ctx = make_ctx(http_allow=("localhost",))
    with pytest.raises(EgressRefused) as info:
        run_tool(HTTP, {"url": f"http://localhost:{port}/to-loopback"}, ctx)
    assert info.value.fields["host"] == "127.0.0.1"
    assert len(hits) == 1  # the first hop only
    out = run_tool(
        HTTP, {"url": f"http://localhost:{port}/to-loopback"}, make_ctx(http_allow=("*",))
    )
    assert out["json"] == {"hello": "world"}


def _fake_dns(monkeypatch, answers):
    """Make getaddrinfo answer ``answers[name]`` (a list per call) for the test names."""
    real = socket.getaddrinfo
    calls: list[str] = []

    def fake(host, port, *args, **kwargs):
        if isinstance(host, str) and host in answers:
            calls.append(host)
            seq = answers[host]
            address = seq[min(len(calls) - 1, len(seq) - 1)]
            return real(address, port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(http_mod.socket, "getaddrinfo", fake)
    return calls


def test_a_name_resolving_to_loopback_is_refused(run_tool, make_ctx, counted, monkeypatch):
    base, hits = counted
    _fake_dns(monkeypatch, {"evil.example": ["127.0.0.1"]})
    with pytest.raises(EgressRefused) as info:
        run_tool(HTTP, {"url": f"http://evil.example:{_port(base)}/hello"}, make_ctx(http_allow=()))
    assert info.value.fields == {
        "host": "evil.example",
        "address": "127.0.0.1",
        "kind": "loopback",
        "setting": "TIFFANY_HTTP_ALLOW",
    }
    assert hits == []


def test_dns_rebinding_cannot_switch_the_checked_address(run_tool, make_ctx, counted, monkeypatch):
    # First answer public, every later one loopback: a check-then-connect that
    # resolved twice would reach the server. We resolve once and connect to
    # the checked (public, unroutable here) address, or fail.
    base, hits = counted
    calls = _fake_dns(monkeypatch, {"rebind.example": ["198.51.100.7", "127.0.0.1"]})
    monkeypatch.setattr(
        http_mod, "blocked_kind", lambda ip: None if str(ip) == "198.51.100.7" else "loopback"
    )
    url = f"http://rebind.example:{_port(base)}/hello"
    with pytest.raises(HttpConnectError):
        run_tool(HTTP, {"url": url, "timeout_s": 1}, make_ctx(http_allow=()))
    assert calls == ["rebind.example"]
    assert hits == []


def test_an_allowed_name_keeps_its_host_header(run_tool, make_ctx, counted, monkeypatch):
    base, hits = counted
    _fake_dns(monkeypatch, {"api.internal": ["127.0.0.1"]})
    url = f"http://api.internal:{_port(base)}/hello"
    out = run_tool(HTTP, {"url": url}, make_ctx(http_allow=("API.internal.",)))
    assert out["json"] == {"hello": "world"}
    assert hits == [f"api.internal:{_port(base)}"]


def test_idna_and_trailing_dot_names_are_checked_on_their_address(counted):
    base, hits = counted
    policy = EgressPolicy.parse([])
    for host in ("\uff11\uff12\uff17.0.0.1", "localhost"):  # fullwidth digits: IDNA -> 127
        with pytest.raises(EgressRefused):
            policy.connect((host, _port(base)), timeout=2)
    assert hits == []


def test_allow_cidr_and_bad_entries():
    policy = EgressPolicy.parse(["10.0.0.0/8", " db.local ", "", "[::1]"])
    import ipaddress

    policy.check("x", ipaddress.ip_address("10.9.9.9"))
    policy.check("db.local.", ipaddress.ip_address("192.168.0.1"))
    policy.check("y", ipaddress.ip_address("::1"))
    with pytest.raises(EgressRefused):
        policy.check("y", ipaddress.ip_address("192.168.0.1"))
    with pytest.raises(ValueError, match="not a network"):
        EgressPolicy.parse(["10.0.0.0/33"])


def test_a_bad_allow_setting_is_a_tool_error(run_tool, make_ctx):
    with pytest.raises(EgressRefused, match="not a network"):
        run_tool(HTTP, {"url": "http://example.com/"}, make_ctx(http_allow=("1.2.3.4/99",)))
