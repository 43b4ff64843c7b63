"""A websocket's backlog and a direct write: what the feed needs below ASGI.

The activity feed pauses a subscriber whose client stopped reading instead
of writing every event into its buffers until they fill (see
:mod:`tiffany.api.feed`). ASGI hides the connection, so the API's uvicorn
runs :class:`BacklogWebSocketProtocol`, which adds one server extension to
each websocket's scope (the way ASGI lets servers offer more)::

    scope["extensions"]["tiffany.backlog"] = {
        "backlog": <callable() -> int>,
        "send_texts": <callable(list[str]) -> bool>,
    }

``backlog`` answers the bytes still queued for the client: asyncio's write
buffer plus the kernel's unsent queue (``SIOCOUTQ``). A client that reads
keeps it near zero on loopback and a LAN; one that stopped lets it grow to
the socket's send buffer and beyond. ``send_texts`` frames several text
messages and writes them to the transport at once (one system call where
ASGI makes one per message, through every middleware's ``send`` wrapper);
it answers False, sending nothing, when the connection cannot take them
now (writing paused, closing or closed): the caller then uses the ASGI
``send``, which waits or raises as usual. Under another server the
extension is absent: the feed never pauses and sends through ASGI.

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
from websockets.exceptions import InvalidState

__all__ = [
    "BACKLOG_EXTENSION",
    "BacklogWebSocketProtocol",
    "backlog_of",
    "direct_sender_of",
    "transport_backlog",
]

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


def direct_sender_of(scope: Mapping[str, Any]) -> Callable[[list[str]], bool] | None:
    """Return the websocket's ``send_texts`` callable, or None when the server offers none."""
    ext = scope.get("extensions") or {}
    entry = ext.get(BACKLOG_EXTENSION)
    return entry.get("send_texts") if isinstance(entry, dict) else None


class BacklogWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol, with the :data:`BACKLOG_EXTENSION` in each scope."""

    # Rejected: reaching uvicorn's protocol through Starlette's chain of
    # ``send`` wrappers; a subclass the API's server config names is ours.

    def handle_connect(self, event: Any) -> None:
        """Accept the handshake as uvicorn does, then offer the backlog (the app starts later)."""
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][BACKLOG_EXTENSION] = {
                "backlog": self.backlog,
                "send_texts": self.send_texts,
            }

    def backlog(self) -> int:
        """Bytes sent to this websocket that its client has not taken yet."""
        return transport_backlog(self.transport)

    def send_texts(self, texts: list[str]) -> bool:
        """Write ``texts`` as text messages in one write; False (nothing sent) if not now.

        What uvicorn's ``send`` does for ``websocket.send`` (frame with the
        websockets state machine, write its output), for many messages at
        once, and only while the transport takes writes without waiting.
        """
        if (
            not self.handshake_complete
            or self.close_sent
            or self.disconnected
            or not self.writable.is_set()
            or self.transport.is_closing()
        ):
            return False
        try:
            for text in texts:
                self.conn.send_text(text.encode())
        except InvalidState:
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True
