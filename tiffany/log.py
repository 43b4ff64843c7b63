"""Logging setup: one :func:`configure_logging` for the whole process.

Follows the structlog documentation's "standard library" recipe: structlog
loggers and foreign stdlib loggers (uvicorn, SQLAlchemy, Alembic) share one
processor chain and one renderer, so every line looks the same:

* shared processors: ``merge_contextvars`` (per-task context bound with
  ``structlog.contextvars.bind_contextvars``), logger name, level, and an ISO
  UTC timestamp;
* renderer: ``ConsoleRenderer`` on a terminal, otherwise ``dict_tracebacks`` and
  ``JSONRenderer`` (one JSON object a line);
* output: one stdlib handler on the root logger writing to stderr, so that
  standard output stays free for command output (``tiffany version``, dumps).

Secrets never reach a line (docs/security.md): the last processor before
the renderer, :func:`redact_secrets`, masks credentials in URLs (the
userinfo of ``scheme://user:password@host`` and ``?token=``-style query
parameters: :mod:`tiffany.wire.redaction`; uvicorn logs websocket URLs with their
query), ``Authorization``
header values, ``Bearer`` credentials, values of secret-named keys, and the
literal values of the configured secrets (the API token, the LLM key)
wherever they appear, tracebacks included. uvicorn's "returned without
completing handshake" after a refused websocket (a 401 denial response is
not a server error) is logged at INFO, not ERROR.

Logs are best effort. They are not the PAL (observable product events) nor the
WAL (the durability contract): never rely on a log line for either.

Discussion:
    ``cache_logger_on_first_use`` is off. Caching saves a dictionary lookup per
    log call, but a cached logger ignores later reconfiguration, which breaks
    ``structlog.testing.capture_logs()`` in tests. Hot paths (the kernel loop)
    must not log per iteration anyway; they report through instruments.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from tiffany.wire.redaction import REDACTED, redact_url_credentials

if TYPE_CHECKING:
    from tiffany.config import LogFormat, Settings

#: Stdlib loggers that install handlers of their own; we strip those and let
#: records propagate to the root handler so they are rendered like ours.
#: (uvicorn must also be started with ``log_config=None``.)
FOREIGN_LOGGERS: tuple[str, ...] = (
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "sqlalchemy",
    "alembic",
)

_HANDLER_NAME = "tiffany"

_REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization: Bearer xyz / "authorization": "Basic xyz"
    (
        re.compile(
            r"((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:[A-Za-z]+\s+)?)[^\s\"',}]+",
            re.IGNORECASE,
        ),
        rf"\1{REDACTED}",
    ),
    (re.compile(r"(\bbearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE), rf"\1{REDACTED}"),
)
#: Text none of the redactions can match: no ``=``, no ``@``, no "authoriz",
#: no "bearer" (each needs one). Most values of a line (paths, ids, times)
#: are such text, and one search instead of three substitutions each halved
#: the cost of the API's line per request.
_MAYBE_SECRET = re.compile(r"=|@|authoriz|bearer", re.IGNORECASE)
_SECRET_KEY = re.compile(r"(token|authorization|api_key|password|passwd|secret)$", re.IGNORECASE)
#: Literal secret values of this process (set by :func:`configure_logging`).
_SECRETS: set[str] = set()
#: uvicorn messages that are not errors of ours: a refused websocket ends
#: "without completing handshake" (the 401 went out as a denial response).
_UVICORN_NOT_ERRORS: frozenset[str] = frozenset(
    {
        "ASGI callable returned without completing handshake.",
        "ASGI callable returned without sending handshake.",
    }
)


def register_secret(value: str | None) -> None:
    """Mask this literal value wherever it appears in a log line (from now on)."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


def redact_text(text: str) -> str:
    """Return ``text`` with secrets masked (see the module docstring)."""
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, REDACTED)
    if _MAYBE_SECRET.search(text) is None:
        return text
    text = redact_url_credentials(text)
    for pattern, repl in _REDACTIONS:
        text = pattern.sub(repl, text)
    return text


def _redact(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if depth > 4:
        return value
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and _SECRET_KEY.search(k) and v
                else _redact(v, depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact(v, depth + 1) for v in value]
    return value


def redact_secrets(
    logger: Any, method: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    """Processor: mask secrets in every value of the event (nested ones too)."""
    out: structlog.types.EventDict = _redact(dict(event))
    return out


class _UvicornLevels(logging.Filter):
    """Lower uvicorn's "without completing handshake" (a refused websocket) to INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.msg in _UVICORN_NOT_ERRORS:
            record.levelno = logging.INFO
            record.levelname = "INFO"
        return True


def _drop_color_message(
    logger: Any, method: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    # uvicorn passes a second, ANSI-coloured copy of its message as an extra.
    event.pop("color_message", None)
    return event


def shared_processors() -> list[structlog.types.Processor]:
    """Return the processors run on every record, structlog's and stdlib's."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.stdlib.ExtraAdder(),
        _drop_color_message,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on whatever ``sys.stderr`` is when a record is emitted.

    A process that swaps its standard error later (pytest's capture does, per
    test) keeps logging to the live one; a handler that held the first one
    wrote to a closed file from threads that outlived it.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def configure_logging(
    settings: Settings | None = None,
    *,
    log_format: LogFormat | None = None,
    log_level: str | int | None = None,
    stream: TextIO | None = None,
) -> None:
    """Configure structlog and stdlib logging for this process.

    Call it once at an entry point. Calling it again replaces the previous
    configuration (no handler is added twice), so it is idempotent.

    Args:
        settings: Source of ``log_format`` and ``log_level``; explicit keyword
            arguments override it. Without either, ``auto`` and ``INFO``.
        log_format: ``console``, ``json`` or ``auto`` (console when ``stream``
            is a terminal).
        log_level: Minimum level, as a name (``"debug"``) or a number.
        stream: Where lines go; standard error by default.
    """
    fmt: LogFormat = log_format or (settings.log_format if settings else "auto")
    level = _level_number(
        log_level if log_level is not None else (settings.log_level if settings else "INFO")
    )
    out = stream if stream is not None else sys.stderr

    if settings is not None:
        for secret in (settings.api_token, settings.llm_api_key, settings.embeddings_api_key):
            register_secret(secret.get_secret_value() if secret is not None else None)
    if fmt == "auto":
        fmt = "console" if _isatty(out) else "json"
    renderers: list[structlog.types.Processor]
    if fmt == "console":
        # plain_traceback: rich's pretty tracebacks take seconds for a deep
        # trampolined stack, and a crash is logged on the scheduler thread.
        renderers = [
            redact_secrets,
            structlog.dev.ConsoleRenderer(
                colors=_isatty(out), exception_formatter=structlog.dev.plain_traceback
            ),
        ]
    else:
        renderers = [
            # structlog's ``dict_tracebacks`` with ``show_locals=False``: local
            # variables may hold tokens or payloads, which logs must not carry.
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            redact_secrets,
            structlog.processors.JSONRenderer(),
        ]

    shared = shared_processors()
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *renderers,
        ],
    )
    handler = logging.StreamHandler(out) if stream is not None else _StderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)

    for name in FOREIGN_LOGGERS:
        foreign = logging.getLogger(name)
        foreign.handlers.clear()
        foreign.propagate = True
    uvicorn_error = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _UvicornLevels) for f in uvicorn_error.filters):
        uvicorn_error.addFilter(_UvicornLevels())
    # Alembic narrates every start ("Context impl SQLiteImpl", each plugin):
    # only its warnings, unless the operator asked for DEBUG.
    logging.getLogger("alembic").setLevel(level if level <= logging.DEBUG else logging.WARNING)

    logging.captureWarnings(True)


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelNamesMapping().get(level.strip().upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r}")
    return number


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
