"""Error answers: every error is JSON ``{"code", "message", "detail", ...}``.

* the engine's refusals (:class:`~tiffany.errors.Refusal`): the one table of
  their HTTP statuses, :data:`REFUSAL_STATUS` (404 unknown run, 409 finished,
  422 invalid command with ``detail`` ``[{"loc", "msg"}]``, 503 not ready
  with ``Retry-After``...); the engine itself knows nothing of HTTP;
* :class:`~tiffany.errors.EngineUnavailable`: 503 with ``Retry-After``;
* the memory's refusals (:mod:`tiffany.memory`): their table,
  :data:`MEMORY_STATUS` (422 naming the field, as the request's ``path``,
  ``query`` or ``body`` has it; 404 an unknown item; 429 a full namespace);
* the body's :class:`~tiffany.api.body.BodyTooLarge` (413) and
  :class:`~tiffany.api.body.InvalidBody` (422), and any other
  :class:`~tiffany.wire.documents.DocumentError` (422, naming the path);
* any other :class:`~tiffany.errors.TiffanyError`: its ``to_dict()``;
* FastAPI's validation errors (422, a websocket's as its handshake's answer)
  and HTTP errors (404 route, 405...) in
  the same shape, and anything unexpected as a logged 500. A 405's
  ``Allow`` lists every method the path takes (all its routes').
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import structlog
from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError, WebSocketRequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Scope

from tiffany.api.body import BodyTooLarge, InvalidBody
from tiffany.api.deps import StoreBehind, StoreUnavailable
from tiffany.errors import (
    CommandTooLarge,
    EngineFault,
    EngineNotReady,
    EngineUnavailable,
    InvalidCommand,
    MalformedCommand,
    MemoryFull,
    MemoryInvalid,
    MemoryNotFound,
    Refusal,
    RunConflict,
    RunNotFound,
    SignalBytesHeldFull,
    SignalsHeldFull,
    TiffanyError,
    VerifyTimedOut,
)
from tiffany.wire.documents import DocumentError

__all__ = [
    "MEMORY_STATUS",
    "REFUSAL_STATUS",
    "RETRY_AFTER_S",
    "AllowedMethods",
    "error_response",
    "install",
    "status_of",
]

log = structlog.get_logger("tiffany.api")

#: What a 503 tells the client to wait before retrying, in seconds.
RETRY_AFTER_S: Final = 2

#: The HTTP status of each of the engine's refusals: the one place a domain
#: refusal becomes an HTTP code (a refusal's subclasses take its row, the
#: most derived row wins). The body's ``code`` is the refusal's own.
REFUSAL_STATUS: Final[dict[type[Refusal], int]] = {
    Refusal: 500,
    MalformedCommand: 400,
    RunNotFound: 404,
    RunConflict: 409,  # finished, not finished, exists, key reused
    CommandTooLarge: 413,
    SignalBytesHeldFull: 413,
    InvalidCommand: 422,
    SignalsHeldFull: 429,
    EngineFault: 500,
    EngineNotReady: 503,
    VerifyTimedOut: 504,
}


#: The HTTP status of each of the memory's refusals (``tiffany/memory``): the
#: same rule, a table of its own (they are the store's, not the engine's).
MEMORY_STATUS: Final[dict[type[TiffanyError], int]] = {
    MemoryInvalid: 422,
    MemoryNotFound: 404,
    MemoryFull: 429,
}


def status_of(exc: Refusal) -> int:
    """The HTTP status of a refusal (:data:`REFUSAL_STATUS`, by its nearest class)."""
    for cls in type(exc).__mro__:
        status = REFUSAL_STATUS.get(cls)
        if status is not None:
            return status
    return 500


def error_response(
    status: int,
    code: str,
    message: str,
    detail: Any = None,
    *,
    headers: Mapping[str, str] | None = None,
    **fields: Any,
) -> JSONResponse:
    """Return the JSON error answer every route uses."""
    body = {"code": code, "message": message, "detail": detail, **fields}
    return JSONResponse(body, status_code=status, headers=headers)


def _retry_after() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}


async def _refusal(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Refusal)
    status = status_of(exc)
    detail = exc.detail
    if isinstance(exc, InvalidCommand) and isinstance(detail, list):
        detail = [_loc_msg(d) for d in detail]
    headers = _retry_after() if isinstance(exc, EngineNotReady) else None
    code = exc.code
    if isinstance(detail, dict) and isinstance(detail.get("code"), str):
        code = detail["code"]  # a refusal that names itself (a bound: limit.<setting>)
    elif isinstance(detail, list) and detail and isinstance(detail[0], dict):
        named = detail[0].get("code")  # its fields name it (a payload: signal.payload_invalid)
        code = named if isinstance(named, str) else code
    return error_response(status, code, exc.message, detail, headers=headers)


def _loc_msg(item: Any) -> Any:
    """Normalize one 422 detail item to ``{"loc": [...], "msg": ...}``."""
    if not isinstance(item, dict):
        return {"loc": ["body"], "msg": str(item)}
    loc = item.get("loc", ["body"])
    if isinstance(loc, str):
        loc = [part for part in loc.replace("[", ".").replace("]", "").split(".") if part]
        loc = [int(p) if p.isdigit() else p for p in loc]
    return {**item, "loc": loc, "msg": str(item.get("msg", ""))}


#: A memory refusal's field as the request names it, where the names differ.
_MEMORY_PARAM: Final = {"query": "q"}


async def _memory_refusal(request: Request, exc: Exception) -> JSONResponse:
    """A memory refusal; a 422 names its field where the request had it (path, query, body)."""
    assert isinstance(exc, TiffanyError)
    status = next((MEMORY_STATUS[c] for c in type(exc).__mro__ if c in MEMORY_STATUS), 500)
    body = exc.to_dict()
    code, message = body.pop("code"), body.pop("message")
    detail = body.pop("detail", None)
    field = getattr(exc, "field", None)
    if status == 422 and isinstance(field, str):
        name = _MEMORY_PARAM.get(field, field)
        where = (
            "path"
            if name in request.path_params
            else "query"
            if name in request.query_params
            else "body"
        )
        detail = [{"loc": [where, name], "msg": message, "type": "value_error"}]
        body["field"] = name
    return error_response(status, code, message, detail, **body)


async def _engine_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EngineUnavailable)
    # What failed (a socket's path under the data dir, a database's host and
    # user) is the operator's to read in this log, not every client's.
    log.warning("engine unavailable", error=exc.message)
    message = "the engine is not reachable (starting, restarting or stopped): try again"
    return error_response(503, "engine.unavailable", message, headers=_retry_after())


async def _too_large(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BodyTooLarge)
    # The body was not read: the connection cannot carry another request.
    return error_response(
        413, exc.code, exc.message, None, headers={"Connection": "close"}, **exc.fields
    )


async def _invalid_body(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DocumentError)
    # FastAPI's shape in full (its ValidationError schema requires a "type"),
    # as the 422s of every route declare it.
    detail = exc.detail
    if isinstance(detail, list):
        detail = [
            {**e, "type": e.get("type") or "value_error"} if isinstance(e, dict) else e
            for e in detail
        ]
    return error_response(422, exc.code, exc.message, detail)


async def _store_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StoreUnavailable)
    log.warning("store unavailable", error=exc.message)
    body = exc.to_dict()
    code, message = body.pop("code"), body.pop("message")
    if not isinstance(exc, StoreBehind):  # the driver's words name hosts and users: logged only
        message = "the store cannot be read"
    return error_response(503, code, message, headers=_retry_after(), **body)


async def _tiffany_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TiffanyError)
    body = exc.to_dict()
    status = int(getattr(exc, "http_status", 500))
    if status >= 500:
        log.error("request failed", error=exc.message, code=exc.code)
    body.setdefault("detail", None)
    return JSONResponse(body, status_code=status)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _invalid_request(exc.errors())


def _invalid_request(errors: Any) -> JSONResponse:
    detail = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type")}
        for e in errors
    ]
    first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return error_response(422, "request.invalid", f"{where}: {first['msg']}", detail)


async def _websocket_validation_error(websocket: WebSocket, exc: Exception) -> None:
    """A websocket's bad query (``?since=abc``): an HTTP request's 422, as the handshake's answer.

    FastAPI's own handler closed the socket before accepting it, which
    uvicorn answers with a bare 403: nothing said which parameter was bad.
    Where the server cannot answer a handshake with a response, the close
    (1008) carries the message.
    """
    assert isinstance(exc, WebSocketRequestValidationError)
    response = _invalid_request(exc.errors())
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:
        message = str(json.loads(bytes(response.body))["message"])
        await websocket.close(code=1008, reason=message.encode()[:120].decode("utf-8", "ignore"))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else "error"
    detail = None if isinstance(exc.detail, str) else exc.detail
    headers = exc.headers
    methods: AllowedMethods | None = getattr(request.app.state, "allowed_methods", None)
    if exc.status_code == 405 and methods is not None:
        allowed = methods.at(request.scope)
        if allowed:
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
    return error_response(
        exc.status_code, f"http.{exc.status_code}", message, detail, headers=headers
    )


class AllowedMethods:
    """Which methods the app's routes take at a path: a 405's ``Allow`` (RFC 9110, 15.5.6).

    Starlette's router answers 405 from the first route whose path matched,
    and its ``Allow`` lists that route's methods alone: ``/api/runs`` (one
    route for GET, one for POST) said ``Allow: POST``. The table holds every
    route with a method list; a mount (the static files) answers for itself.

    Args:
        routes: The app's routes, those of included routers as well (a
            router included in the app may be one opaque entry of its
            ``routes``: FastAPI's ``_IncludedRouter``).
    """

    def __init__(self, routes: Iterable[BaseRoute]) -> None:
        self._routes = [r for r in routes if isinstance(r, Route) and r.methods]

    def at(self, scope: Scope) -> list[str]:
        """The methods some route takes at ``scope``'s path, sorted (empty: none matches)."""
        methods: set[str] = set()
        for route in self._routes:
            match, _ = route.matches(scope)  # PARTIAL: the path, not the method
            if match is not Match.NONE and route.methods:
                methods |= route.methods
        return sorted(methods)


#: The status a request's log line shows when its client went away before
#: the answer (nginx's "client closed request"); the client never sees it.
CLIENT_CLOSED: Final = 499


async def _client_gone(_request: Request, _exc: Exception) -> Response:
    """The client closed its connection while its body was being read: nothing to answer.

    Not a server error: no traceback, no ``error`` line; the request's log
    line says ``status: 499``. (Handled here, it never reaches uvicorn,
    which logged it as an exception in the application.)
    """
    return Response(status_code=CLIENT_CLOSED)


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return error_response(500, "internal", f"internal error: {type(exc).__name__}")


def install(app: FastAPI) -> None:
    """Register the handlers on ``app`` (most specific first)."""
    app.add_exception_handler(Refusal, _refusal)
    for memory_refusal in MEMORY_STATUS:
        app.add_exception_handler(memory_refusal, _memory_refusal)
    app.add_exception_handler(EngineUnavailable, _engine_unavailable)
    app.add_exception_handler(BodyTooLarge, _too_large)
    app.add_exception_handler(InvalidBody, _invalid_body)
    app.add_exception_handler(DocumentError, _invalid_body)
    app.add_exception_handler(StoreUnavailable, _store_unavailable)
    app.add_exception_handler(TiffanyError, _tiffany_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(WebSocketRequestValidationError, _websocket_validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected)
