"""``http``: one HTTP(S) request with the standard library's ``urllib``.

Only ``http`` and ``https`` URLs (also after a redirect). The response body
is read up to ``max_body_bytes`` (more is dropped and ``truncated`` is
True); ``timeout_s`` bounds the whole exchange, not each socket operation.
:func:`request` is shared with the ``llm`` tool's OpenAI-compatible client.

Egress policy (:class:`EgressPolicy`, docs/security.md): a plan-chosen URL
may not reach loopback, private (RFC 1918, CGNAT ``100.64/10``, ULA
``fc00::/7``), link-local, multicast, unspecified, reserved or broadcast
addresses, nor IPv6 forms that embed one (``::ffff:a.b.c.d``,
``::a.b.c.d``, 6to4, NAT64), unless ``TIFFANY_HTTP_ALLOW`` names the host
or a network holding the address (``*``: everything). A refusal is
``tool.http.egress``.

Discussion:
    The check is on the address the socket connects to, not on the URL's
    spelling: the connection classes resolve the host once, check every
    address, and connect to the checked one (``_create_connection``), so
    ``127.1``, ``2130706433``, ``0x7f.0.0.1``, ``localhost.``, IDNA names and
    a DNS answer that changes between a check and a connect (rebinding) all
    meet the same test; redirects open new connections through the same
    classes. TLS keeps the URL's host for SNI and certificate checks, and the
    ``Host`` header is the URL's. Proxies from the environment are ignored
    under the policy (a proxy would connect on our behalf, unchecked). The
    ``llm`` tool's base URL is the operator's: it is exempt (no policy).
    Rejected: checking the URL's host string (every spelling above gets
    through, and DNS can answer differently at connect time).
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import json as jsonlib
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, field_validator, model_validator

from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolError, ToolOutput

__all__ = [
    "EgressPolicy",
    "EgressRefused",
    "HttpArgs",
    "HttpConnectError",
    "HttpOutput",
    "HttpResponse",
    "HttpStatusError",
    "HttpTimeout",
    "HttpTool",
    "request",
]

#: Bytes read from the socket per call.
READ_CHUNK_BYTES = 1 << 16
#: Default timeout of a request, in seconds.
DEFAULT_TIMEOUT_S = 30.0
#: Longest timeout a plan may ask for, in seconds.
MAX_TIMEOUT_S = 3600.0
_SCHEMES = ("http", "https")


class HttpStatusError(ToolError):
    """The server answered with a status >= 400 (fields: the response)."""

    code = "tool.http.status"


class HttpConnectError(ToolError):
    """No response: DNS, refused connection, TLS, reset."""

    code = "tool.http.connect"


class HttpTimeout(HttpConnectError):
    """No complete response within ``timeout_s``."""

    code = "tool.http.timeout"


class EgressRefused(ToolError):
    """The egress policy refused the address a URL resolves to (fields: host, address)."""

    code = "tool.http.egress"


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, 6to4, NAT64)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if int(ip) >> 32 == 0 and int(ip) > 1:  # deprecated IPv4-compatible ::a.b.c.d
        return ipaddress.IPv4Address(int(ip))
    return None


def blocked_kind(ip: IPAddress) -> str | None:
    """Return why ``ip`` is not a public address (``"loopback"``...), or None if it is."""
    inner = _embedded_v4(ip)
    if inner is not None:
        kind = blocked_kind(inner)
        return f"{kind} (embedded in {ip})" if kind else None
    for kind, flag in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if flag:
            return kind
    if not ip.is_global:  # CGNAT 100.64/10 and the other special-purpose blocks
        return "non-global"
    return None


def _normal_host(host: str) -> str:
    host = host.strip().rstrip(".").lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Which non-public destinations the ``http`` tool may reach anyway.

    Attributes:
        hosts: Host names (normalised: lower case, no trailing dot, IDNA).
        networks: Networks whose addresses are allowed.
        everything: ``*`` was given: no restriction.
    """

    hosts: frozenset[str] = frozenset()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    everything: bool = False

    @classmethod
    def parse(cls, entries: tuple[str, ...] | list[str]) -> EgressPolicy:
        """Build the policy from ``TIFFANY_HTTP_ALLOW`` entries (hosts, IPs, CIDRs, ``*``).

        Raises:
            ValueError: An entry with a ``/`` is not a network.
        """
        hosts: set[str] = set()
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        everything = False
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            if entry == "*":
                everything = True
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                if "/" in entry:
                    raise ValueError(f"TIFFANY_HTTP_ALLOW: {entry!r} is not a network") from None
                hosts.add(_normal_host(entry))
        return cls(frozenset(hosts), tuple(networks), everything)

    def check(self, host: str, ip: IPAddress) -> None:
        """Raise :class:`EgressRefused` unless ``host`` at ``ip`` may be reached."""
        if self.everything or _normal_host(host) in self.hosts:
            return
        kind = blocked_kind(ip)
        if kind is None:
            return
        for net in self.networks:
            if ip.version == net.version and ip in net:
                return
        raise EgressRefused(
            f"refusing to connect to {host} ({ip}): a {kind} address; "
            "allow it with TIFFANY_HTTP_ALLOW (a host or CIDR)",
            host=host,
            address=str(ip),
            kind=kind,
            setting="TIFFANY_HTTP_ALLOW",
        )

    def connect(
        self,
        address: tuple[str, int],
        timeout: float | None = None,
        source_address: tuple[str, int] | None = None,
    ) -> socket.socket:
        """Resolve once, check every address, connect to a checked one.

        What ``http.client`` calls instead of :func:`socket.create_connection`.
        """
        host, port = address
        try:
            infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve {host!r}: {exc}") from exc
        for info in infos:  # any refused address refuses the host (no partial trust)
            self.check(host, ipaddress.ip_address(str(info[4][0]).split("%")[0]))
        error: OSError | None = None
        for family, kind, proto, _, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                if timeout is not None:
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)  # the checked address itself: no second lookup
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError(f"cannot connect to {host!r}")


class _Checked:
    """Mixin: the connection's socket comes from :meth:`EgressPolicy.connect`."""

    def __init__(self, *args: Any, policy: EgressPolicy, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = policy.connect


class _CheckedHTTP(_Checked, http.client.HTTPConnection):
    pass


class _CheckedHTTPS(_Checked, http.client.HTTPSConnection):
    pass


class _CheckedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, policy: EgressPolicy) -> None:
        super().__init__()
        self.policy = policy

    def http_open(self, req: Any) -> Any:
        return self.do_open(functools.partial(_CheckedHTTP, policy=self.policy), req)


class _CheckedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, policy: EgressPolicy) -> None:
        super().__init__()
        self.policy = policy

    def https_open(self, req: Any) -> Any:
        return self.do_open(
            functools.partial(_CheckedHTTPS, policy=self.policy),
            req,
            context=self._context,  # type: ignore[attr-defined]
        )


@dataclass(slots=True)
class HttpResponse:
    """What :func:`request` returns."""

    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool
    url: str


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http(s) URLs only (urllib would also follow ftp://)."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        if urlsplit(newurl).scheme not in _SCHEMES:
            raise HttpConnectError(f"refusing redirect to {newurl!r}", url=newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None  # the 3xx response itself is returned


def _headers(message: Message) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in message.items():
        k = key.lower()
        out[k] = f"{out[k]}, {value}" if k in out else value
    return out


def request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    data: bytes | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_body_bytes: int = 10 << 20,
    follow_redirects: bool = True,
    egress: EgressPolicy | None = None,
) -> HttpResponse:
    """Send one request and read the response (blocking: call it in a thread).

    Statuses >= 400 are returned, not raised. With ``egress``, every
    connection (redirects too) is checked against that policy; without (the
    ``llm`` tool's operator-set URL), none is.

    Raises:
        HttpTimeout: ``timeout_s`` passed before the body was complete.
        HttpConnectError: No response (or a refused redirect).
        EgressRefused: The policy refused an address.
    """
    if urlsplit(url).scheme not in _SCHEMES:
        raise HttpConnectError(f"only http and https URLs, not {url!r}", url=url)
    handler = _Redirects() if follow_redirects else _NoRedirects()
    handlers: list[Any] = [handler]
    if egress is not None:
        handlers += [
            urllib.request.ProxyHandler({}),
            _CheckedHTTPHandler(egress),
            _CheckedHTTPSHandler(egress),
        ]
    opener = urllib.request.build_opener(*handlers)
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    deadline = time.monotonic() + timeout_s
    try:
        try:
            resp = opener.open(req, timeout=timeout_s)
        except urllib.error.HTTPError as exc:  # a status >= 400 (or an unfollowed 3xx)
            resp = exc
        try:
            body, truncated = _read_body(resp, deadline, max_body_bytes)
        finally:
            resp.close()
    except TimeoutError as exc:
        raise HttpTimeout(f"{method} {url}: no response within {timeout_s} s", url=url) from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise HttpTimeout(f"{method} {url}: no response within {timeout_s} s", url=url) from exc
        raise HttpConnectError(f"{method} {url}: {exc.reason}", url=url) from exc
    except (OSError, ValueError, http.client.HTTPException) as exc:  # reset, bad status line...
        raise HttpConnectError(f"{method} {url}: {exc}", url=url) from exc
    return HttpResponse(resp.status or 0, _headers(resp.headers), body, truncated, resp.geturl())


def _read_body(resp: Any, deadline: float, max_body_bytes: int) -> tuple[bytes, bool]:
    """Read up to ``max_body_bytes`` (True if there was more) before ``deadline``."""
    sock = _socket_of(resp)
    # read1: what has arrived (one recv), so the deadline is checked between
    # receives; read(n) would block until n bytes came, however slowly.
    read = getattr(resp, "read1", resp.read)
    chunks: list[bytes] = []
    kept = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if sock is not None and sock.fileno() != -1:  # -1: the body is complete, closed
            sock.settimeout(left)
        chunk = read(min(READ_CHUNK_BYTES, max_body_bytes + 1 - kept))
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
        kept += len(chunk)
        if kept > max_body_bytes:
            return b"".join(chunks)[:max_body_bytes], True


def _socket_of(resp: Any) -> socket.socket | None:
    """Return the response's socket (to shrink its timeout to the time left), if found."""
    obj = resp
    for _ in range(4):  # HTTPError -> HTTPResponse -> BufferedReader -> SocketIO
        sock = getattr(obj, "_sock", None)
        if isinstance(sock, socket.socket):
            return sock
        obj = getattr(obj, "fp", None) or getattr(obj, "raw", None)
        if obj is None:
            return None
    return None


def is_json(content_type: str | None) -> bool:
    """Return True for ``application/json`` and ``*/*+json`` content types."""
    mime = (content_type or "").split(";")[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")


def charset_of(content_type: str | None) -> str:
    """Return the charset a content type names (UTF-8 when it names none or a bad one)."""
    msg = Message()
    msg["content-type"] = content_type or "text/plain"
    charset = msg.get_content_charset() or "utf-8"
    try:
        "".encode(charset)
    except LookupError:
        return "utf-8"
    return charset


class HttpArgs(ToolArgs):
    """Arguments of ``http``.

    Attributes:
        method: The HTTP method.
        url: An ``http://`` or ``https://`` URL.
        headers: Request headers.
        body: A text body (UTF-8); give this or ``json``, not both.
        json: A JSON body (sets ``Content-Type: application/json``).
        timeout_s: Bound on the whole request, in seconds.
        max_body_bytes: Keep at most this many bytes of the response body
            (default and ceiling: the operator's ``http_max_body_bytes``).
        raise_for_status: Raise ``tool.http.status`` on a status >= 400.
        follow_redirects: Follow 3xx redirects (to http/https only).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] = "GET"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None
    json_body: Any = Field(default=None, alias="json")
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    max_body_bytes: int | None = Field(default=None, ge=0)
    raise_for_status: bool = True
    follow_redirects: bool = True

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in _SCHEMES or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return url

    @model_validator(mode="after")
    def _one_body(self) -> HttpArgs:
        if self.body is not None and "json_body" in self.model_fields_set:
            raise ValueError("give either body or json, not both")
        return self


class HttpOutput(ToolOutput):
    """What ``http`` returns (also the fields of ``tool.http.status`` on a status >= 400)."""

    status: int = Field(description="The HTTP status of the last response.")
    headers: dict[str, str] = Field(description="Response headers, names in lower case.")
    body: str = Field(description="The body as text, decoded with the response's charset.")
    json_body: Any = Field(
        alias="json",
        description="The parsed body when it is JSON and complete, else null.",
    )
    truncated: bool = Field(description="The body went past max_body_bytes and was cut.")


class HttpTool:
    """Send a request: ``{"status", "headers", "body", "json", "truncated"}``.

    ``headers`` has lower-case names; ``body`` is text decoded with the
    response's charset (``errors="replace"``); ``json`` is the parsed body
    when the content type is JSON and the body complete and valid, else None.
    """

    name: ClassVar[str] = "http"
    Args: ClassVar[type[ToolArgs]] = HttpArgs
    Output: ClassVar[type[ToolOutput]] = HttpOutput
    durable: ClassVar[bool] = True

    def run(self, args: HttpArgs, ctx: ToolContext) -> dict[str, Any]:
        """Send the request (in the thread pool)."""
        cap = ctx.settings.http_max_body_bytes
        if args.max_body_bytes is not None:
            cap = min(cap, args.max_body_bytes)
        headers = dict(args.headers)
        data: bytes | None = None
        if "json_body" in args.model_fields_set:
            data = jsonlib.dumps(args.json_body).encode("utf-8")
            if not any(k.lower() == "content-type" for k in headers):
                headers["Content-Type"] = "application/json"
        elif args.body is not None:
            data = args.body.encode("utf-8")
        try:
            egress = EgressPolicy.parse(ctx.settings.http_allow)
        except ValueError as exc:
            raise EgressRefused(str(exc), setting="TIFFANY_HTTP_ALLOW") from None
        resp = request(
            args.method,
            args.url,
            headers=headers,
            data=data,
            timeout_s=args.timeout_s,
            max_body_bytes=cap,
            follow_redirects=args.follow_redirects,
            egress=egress,
        )
        content_type = resp.headers.get("content-type")
        text = resp.body.decode(charset_of(content_type), errors="replace")
        parsed: Any = None
        if is_json(content_type) and not resp.truncated:
            try:
                parsed = jsonlib.loads(text)
            except ValueError:
                parsed = None
        result = {
            "status": resp.status,
            "headers": resp.headers,
            "body": text,
            "json": parsed,
            "truncated": resp.truncated,
        }
        if args.raise_for_status and resp.status >= 400:
            raise HttpStatusError(f"{args.method} {args.url}: HTTP {resp.status}", **result)
        return result
