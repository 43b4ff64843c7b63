"""A websocket's backlog: bytes sent to it that its client has not taken yet.

The activity feed pauses a subscriber whose client stopped reading instead
of writing every event into its buffers until they fill (see
:mod:`tiffany.api.feed`). ASGI hides the connection, so the API's uvicorn
runs :class:`BacklogWebSocketProtocol`, which adds one server extension to
each websocket's scope (the way ASGI lets servers offer more)::

    scope["extensions"]["tiffany.backlog"] = {"backlog": <callable() -> int>}

The callable answers the bytes still queued for the client: asyncio's
write buffer plus the kernel's unsent queue (``SIOCOUTQ``). A client that
reads keeps it near zero on loopback and a LAN; one that stopped lets it
grow to the socket's send buffer and beyond. Under another server the
extension is absent and the feed simply never pauses.

Rejected: the transport's high-water mark alone (``pause_writing``): it
trips only once the kernel buffer *and* 64 KiB of asyncio's are full, after
some 300 events each sent in vain; reaching through Starlette's ``send``
wrappers to uvicorn's protocol object (a private chain that changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import struct
import termios
from collections.abc import Callable, Mapping
from typing import Any, Final

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

__all__ = ["BACKLOG_EXTENSION", "BacklogWebSocketProtocol", "backlog_of", "transport_backlog"]

#: The ASGI scope extension that carries a websocket's backlog callable.
BACKLOG_EXTENSION: Final = "tiffany.backlog"

_INT = struct.Struct("i")
_ZERO = bytes(_INT.size)


def transport_backlog(transport: asyncio.WriteTransport) -> int:
    """Bytes written to ``transport`` that the peer has not taken (buffer + kernel queue)."""
    queued = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):  # closed meanwhile
            queued += _INT.unpack(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, _ZERO))[0]
    return queued


def backlog_of(scope: Mapping[str, Any]) -> Callable[[], int] | None:
    """Return the websocket's backlog callable, or None when the server offers none."""
    ext = scope.get("extensions") or {}
    entry = ext.get(BACKLOG_EXTENSION)
    return entry.get("backlog") if isinstance(entry, dict) else None


class BacklogWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol, with the :data:`BACKLOG_EXTENSION` in each scope."""

    def handle_connect(self, event: Any) -> None:
        """Accept the handshake as uvicorn does, then offer the backlog (the app starts later)."""
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][BACKLOG_EXTENSION] = {"backlog": self.backlog}

    def backlog(self) -> int:
        """Bytes sent to this websocket that its client has not taken yet."""
        return transport_backlog(self.transport)
