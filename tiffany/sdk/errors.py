"""What the SDK raises: the API's error answers as exceptions, and the client's own failures.

Every error answer of the API is JSON ``{"code", "message", "detail", ...}``
(``tiffany/api/problems.py``); a 422's ``detail`` lists the fields at fault
as ``[{"loc": [...], "msg": ...}]``. :class:`ApiError` carries all of it:
the HTTP ``status``, the stable ``code``, the ``message``, the ``detail``,
the field errors as :class:`FieldError` (``.errors``, with a
``path`` such as ``steps[0].args.url``) and the whole ``body``. A
subclass per status lets callers catch what they handle::

    try:
        client.submit(plan)
    except InvalidRequest as exc:
        for field in exc.errors:
            print(field.path, field.msg)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiffany.errors import TiffanyError
from tiffany.wire.redaction import redact_url_credentials

__all__ = [
    "ApiError",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "FieldError",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "error_from_answer",
]


class ClientError(TiffanyError):
    """Root of what the SDK raises.

    Its message and its string fields never show a credential of a URL (a
    password in ``Client("http://user:pw@host")``, a ``?token=``): they are
    masked (:func:`tiffany.wire.redaction.redact_url_credentials`), since an
    error's words end up in logs and on terminals.
    """

    code = "client.error"

    def __init__(self, message: str, **fields: Any) -> None:
        masked = {k: redact_url_credentials(v) for k, v in fields.items() if isinstance(v, str)}
        super().__init__(redact_url_credentials(message), **{**fields, **masked})


class ConnectionFailed(ClientError):
    """The server could not be reached (refused, reset, timed out, bad URL)."""

    code = "client.connection_failed"


class WaitTimeout(ClientError, TimeoutError):
    """``wait`` gave up: the run had not finished within its ``timeout``.

    Attributes:
        run: The run as last read (a :class:`~tiffany.sdk.models.RunDetail`), or None.
    """

    code = "client.wait_timeout"

    def __init__(self, message: str, run: Any = None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.run = run


@dataclass(frozen=True, slots=True)
class FieldError:
    """One field at fault in a 422: where (``loc``, and as a ``path``) and why."""

    loc: tuple[str | int, ...]
    msg: str
    type: str | None = None

    @property
    def path(self) -> str:
        """The location as the API's messages write it (``steps[0].args.url``)."""
        out = ""
        for part in self.loc:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
        return out

    def __str__(self) -> str:
        return f"{self.path or '(body)'}: {self.msg}"


class ApiError(ClientError):
    """The API answered with an error.

    Attributes:
        status: The HTTP status (404, 409, 422...).
        code: The API's stable error code (``run.not_found``, ``plan.invalid``...).
        message: The API's message.
        detail: The API's ``detail`` (for a 422: the field errors as sent).
        errors: The field errors, parsed (empty unless the answer named fields).
        body: The whole error answer (it may hold more fields, e.g. ``run_id``).
        retry_after: A 503's ``Retry-After``, in seconds, or None.
    """

    #: The status this class stands for (None: any).
    status_code: int | None = None

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        detail: Any = None,
        *,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=status, detail=detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body if body is not None else {"code": code, "message": message}
        self.retry_after = retry_after
        self.errors = _field_errors(detail)

    @property
    def field(self) -> str | None:
        """The path of the first field at fault (``steps[0].args.url``), or None."""
        return self.errors[0].path if self.errors else None

    def __str__(self) -> str:
        text = f"{self.status} {self.code}: {self.message}"
        extra = [str(f) for f in self.errors if f.msg not in self.message]
        return "; ".join([text, *extra])


class Unauthorized(ApiError):
    """401: a missing or wrong bearer token (``Client(token=...)``, ``TIFFANY_API_TOKEN``)."""

    status_code = 401


class NotFound(ApiError):
    """404: no such run (or route)."""

    status_code = 404


class Conflict(ApiError):
    """409: the run has already finished (or has not, for a re-run), or a reused key."""

    status_code = 409


class PayloadTooLarge(ApiError):
    """413: the plan or payload is larger than the server accepts."""

    status_code = 413


class InvalidRequest(ApiError):
    """422: an invalid plan, input or request; ``errors`` name the fields at fault."""

    status_code = 422


class Unavailable(ApiError):
    """503: the engine or the store is not available (``retry_after`` says when to retry)."""

    status_code = 503


_BY_STATUS: dict[int, type[ApiError]] = {
    cls.status_code: cls
    for cls in (Unauthorized, NotFound, Conflict, PayloadTooLarge, InvalidRequest, Unavailable)
    if cls.status_code is not None
}


def _field_errors(detail: Any) -> list[FieldError]:
    if not isinstance(detail, list):
        return []
    out: list[FieldError] = []
    for item in detail:
        if not isinstance(item, dict) or "loc" not in item:
            continue
        loc = item["loc"]
        if isinstance(loc, str):
            parts = loc.replace("[", ".").replace("]", "").split(".")
            loc = [int(p) if p.isdigit() else p for p in parts if p]
        elif not isinstance(loc, list | tuple):
            loc = [str(loc)]
        kind = item.get("type")
        out.append(FieldError(tuple(loc), str(item.get("msg", "")), kind))
    return out


def error_from_answer(
    status: int, body: Any, *, text: str = "", retry_after: str | None = None
) -> ApiError:
    """Return the exception for an error answer (``body``: its JSON, or None if not JSON)."""
    doc = body if isinstance(body, dict) else {}
    code = str(doc.get("code") or f"http.{status}")
    message = str(doc.get("message") or text.strip()[:500] or f"HTTP {status}")
    after: float | None = None
    if retry_after is not None:
        try:
            after = float(retry_after)
        except ValueError:
            after = None
    cls = _BY_STATUS.get(status, ApiError)
    return cls(
        status,
        code,
        message,
        doc.get("detail"),
        body=doc or {"code": code, "message": message},
        retry_after=after,
    )
