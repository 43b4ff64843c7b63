"""Connection bounds of the API's HTTP server: header and body deadlines, a connection cap.

uvicorn's HTTP protocols time out only an idle keep-alive connection
(between two requests): a connection that never sends anything, or sends
its request headers a byte at a time (slowloris), or sends a body that
trickles, holds its socket and file descriptor for ever, and no token is
needed, since authentication runs once the headers are complete. Some
21,000 of them used every descriptor of an API process (its
``RLIMIT_NOFILE``) and nothing else could connect.

The API's uvicorn runs :class:`GuardedHttpProtocol` (uvicorn's httptools
protocol with three bounds, each a setting):

* **header deadline** (``TIFFANY_HTTP_HEADER_TIMEOUT_S``): a request's
  headers must be complete within it, counted from the connection's
  opening (its first request) or from the request's first byte (the next
  ones: between requests uvicorn's keep-alive timeout applies). Otherwise
  the answer is 408 ``http.header_timeout`` and the connection is closed.
* **body deadline** (``TIFFANY_HTTP_BODY_TIMEOUT_S``): a request's body
  must be complete within it, counted from the end of its headers; the
  time reading is paused because the app has not taken what it has (flow
  control) is not the client's and re-arms it. Otherwise 408
  ``http.body_timeout`` (when no answer has started) and close.
* **connection cap** (``TIFFANY_HTTP_MAX_CONNECTIONS``): connections at
  once, HTTP and websockets, per API process; one more is answered 503
  ``http.too_many_connections`` and closed at once, so the process keeps
  descriptors for its store, engines and files. The cap is lowered to the
  process's descriptor limit less :data:`FD_RESERVE` when that is lower
  (logged at start).

Invariants:
    - Every connection is either reading a request whose deadline is armed,
      idle between requests under uvicorn's keep-alive timeout, running a
      request in the app, or a websocket (the feed's own bounds): none
      waits on a client for ever.
    - A timeout writes its 408 only when no other answer is on the wire
      (a pipelined request's headers may trickle while the previous answer
      is written): otherwise it only closes.

Discussion: deadlines are per request, not per read as nginx's
``client_header_timeout`` and ``client_body_timeout`` are (the time between
two reads): a client that sends a byte every few seconds meets a per-read
timeout never, and a total one at its end. A 1 MiB plan (the default
``TIFFANY_MAX_PLAN_BYTES``) within 60 s asks 17 KiB/s of a client.

Per-address limits are a reverse proxy's job (docs/security.md, "Connections
and slow clients"): the cap here keeps the process alive, but one address
can still fill it for the header deadline's length.

Rejected: uvicorn's ``limit_concurrency`` (a 503 once the headers are
complete: a slowloris connection never gets there); an h11 subclass as
well (httptools is a dependency, so uvicorn's ``auto`` never picks h11).
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import structlog
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

__all__ = [
    "FD_RESERVE",
    "ConnectionLimits",
    "GuardedHttpProtocol",
    "effective_max_connections",
    "guarded_protocol",
]

log = structlog.get_logger("tiffany.api")

#: File descriptors the cap leaves for everything but client connections
#: (store, engines' sockets, WAL and log files, the body worker's pipes).
FD_RESERVE: Final = 256
#: Refusals and timeouts are logged as one line per this many seconds, with counts.
TALLY_LOG_EVERY_S: Final = 10.0


def effective_max_connections(wanted: int) -> int:
    """``wanted``, lowered to the process's descriptor limit less :data:`FD_RESERVE`."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    room = max(1, soft - FD_RESERVE)
    if wanted > room:
        log.warning(
            "api.max_connections_lowered",
            wanted=wanted,
            used=room,
            nofile=soft,
            setting="TIFFANY_HTTP_MAX_CONNECTIONS",
            hint="raise the process's open-file limit (ulimit -n) to allow more",
        )
        return room
    return wanted


@dataclass
class _Tally:
    """Counts refusals by kind and logs them at most once per :data:`TALLY_LOG_EVERY_S`."""

    counts: dict[str, int] = field(default_factory=dict)
    logged_at: float = 0.0

    def note(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = time.monotonic()
        if now - self.logged_at >= TALLY_LOG_EVERY_S:
            log.warning("api.connections_refused", **self.counts)
            self.counts = {}
            self.logged_at = now


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds :class:`GuardedHttpProtocol` enforces (from the settings).

    Attributes:
        header_timeout_s: Seconds a request's headers may take.
        body_timeout_s: Seconds a request's body may take after its headers.
        max_connections: Connections at once (HTTP and websockets).
    """

    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


def _answer(status: int, code: str, message: str, setting: str) -> bytes:
    """A complete HTTP/1.1 answer in the API's error shape, closing the connection."""
    body = json.dumps(
        {"code": code, "message": message, "detail": None, "setting": setting}
    ).encode()
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
            b"\r\n",
            body,
        ]
    )


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body deadlines and a connection cap.

    Made per server by :func:`guarded_protocol`, which sets :attr:`limits`.
    """

    limits: ClassVar[ConnectionLimits]
    tally: ClassVar[_Tally]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # Connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Take the connection as uvicorn does; refuse it past the cap, else arm its deadline."""
        super().connection_made(transport)  # type: ignore[arg-type]
        cap = self.limits.max_connections
        if len(self.connections) > cap:
            self.tally.note("too_many_connections")
            self.transport.write(
                _answer(
                    503,
                    "http.too_many_connections",
                    f"this API process has {cap} connections open, its limit: try again later",
                    "TIFFANY_HTTP_MAX_CONNECTIONS",
                )
            )
            self.transport.close()
            return
        self._arm_header()

    def connection_lost(self, exc: Exception | None) -> None:
        """Disarm both deadlines, then as uvicorn does."""
        self._cancel_header()
        self._cancel_body()
        super().connection_lost(exc)

    # Parser callbacks (httptools calls them from data_received)

    def on_message_begin(self) -> None:
        """A request's first byte: its header deadline starts (unless the connection's runs)."""
        super().on_message_begin()
        self._arm_header()

    def on_headers_complete(self) -> None:
        """Headers in time: the header deadline is off, the body's starts (not for an upgrade)."""
        self._cancel_header()
        super().on_headers_complete()
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            self._arm_body()

    def on_message_complete(self) -> None:
        """The body is in: its deadline is off."""
        self._cancel_body()
        super().on_message_complete()

    # Deadlines

    def _arm_header(self) -> None:
        if self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._header_timed_out
            )

    def _cancel_header(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _arm_body(self) -> None:
        self._cancel_body()
        self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timed_out)

    def _cancel_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        self.tally.note("header_timeout")
        if self.cycle is None or self.cycle.response_complete:  # nothing else on the wire
            self.transport.write(
                _answer(
                    408,
                    "http.header_timeout",
                    f"the request's headers were not complete within "
                    f"{self.limits.header_timeout_s:g} s",
                    "TIFFANY_HTTP_HEADER_TIMEOUT_S",
                )
            )
        self.transport.close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # the app has not taken what came: not the client's time
            self._arm_body()
            return
        self.tally.note("body_timeout")
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            # The app (waiting in receive()) gets http.disconnect; its answer is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
            self.transport.write(
                _answer(
                    408,
                    "http.body_timeout",
                    f"the request's body was not complete within "
                    f"{self.limits.body_timeout_s:g} s of its headers",
                    "TIFFANY_HTTP_BODY_TIMEOUT_S",
                )
            )
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpProtocol]:
    """Return a :class:`GuardedHttpProtocol` class bound to ``limits`` (uvicorn's ``http``)."""
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {"limits": limits, "tally": _Tally(), "__module__": __name__},
    )
