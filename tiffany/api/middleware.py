"""ASGI middleware of the API: bearer-token auth and request logging.

Both are plain ASGI callables (not ``BaseHTTPMiddleware``), so they cover
websockets as well as HTTP and never buffer a body.
"""

from __future__ import annotations

import hmac
import os
import re
import time
from typing import Final
from urllib.parse import parse_qs

import structlog
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

__all__ = ["PUBLIC_PATHS", "RequestLog", "TokenAuth", "is_public"]

log = structlog.get_logger("tiffany.api")

#: Paths served without the token: liveness, and the dashboard's files and the
#: status vocabulary it reads at start (the page has to load before it can ask
#: the user for the token; they hold no data).
PUBLIC_PATHS: Final = frozenset({"/healthz", "/", "/favicon.ico", "/api/meta"})
_PUBLIC_PREFIX: Final = "/static/"

_RUN_PATH = re.compile(r"^/api/runs/([^/]+)")


def is_public(path: str) -> bool:
    """True for the paths that need no token (see :data:`PUBLIC_PATHS`)."""
    return path in PUBLIC_PATHS or path.startswith(_PUBLIC_PREFIX)


class TokenAuth:
    """Require ``Authorization: Bearer <token>`` on every non-public route.

    Websockets may pass the token as ``?token=`` instead (browsers cannot
    set headers on a websocket). The comparison is constant-time. A refused
    HTTP request gets 401 with a JSON body; a refused websocket gets the same
    401 as its handshake answer (or close code 1008 where the server cannot
    send one).

    Args:
        app: The wrapped application.
        token: The expected token; None lets everything through.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer 401."""
        kind = scope["type"]
        if self.token is None or kind not in ("http", "websocket") or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        presented = self._presented(scope)
        if presented is not None and hmac.compare_digest(presented, self.token):
            await self.app(scope, receive, send)
            return
        message = (
            "missing bearer token: send Authorization: Bearer <token>"
            if presented is None
            else "invalid bearer token"
        )
        response = JSONResponse(
            {"code": "auth.unauthorized", "message": message, "detail": None},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
        if kind == "http":
            await response(scope, receive, send)
            return
        ws = WebSocket(scope, receive, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            await ws.send_denial_response(response)
        else:
            await ws.close(code=1008, reason=message)

    @staticmethod
    def _presented(scope: Scope) -> bytes | None:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                if scheme.lower() == b"bearer" and credentials.strip():
                    return bytes(credentials.strip())
                return b""
        if scope["type"] == "websocket":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            tokens = query.get("token")
            if tokens:
                return str(tokens[0]).encode()
        return None


class RequestLog:
    """Bind request context for structlog and log one line per HTTP request.

    Every log line written while a request is handled carries
    ``request_id``, ``method`` and ``path``, and ``run_id`` for
    ``/api/runs/{run_id}...``. A route adds its outcome to the request's
    line by binding it (a submission binds ``run_id`` and ``created``)
    rather than writing a line of its own: a log line costs the API tens of
    microseconds of its loop (structlog, the stdlib handler, redaction).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Bind the request's context, run it, log its outcome."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        structlog.contextvars.clear_contextvars()
        context = {"request_id": os.urandom(6).hex(), "path": path}
        if scope["type"] == "http":
            context["method"] = scope["method"]
        match = _RUN_PATH.match(path)
        if match:
            context["run_id"] = match.group(1)
        structlog.contextvars.bind_contextvars(**context)
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return

        status = 500
        started = time.monotonic()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed_ms = round((time.monotonic() - started) * 1000, 2)
            level = "warning" if status >= 500 else "info"
            if path not in ("/healthz", "/metrics") or status >= 400:
                getattr(log, level)("request", status=status, duration_ms=elapsed_ms)
