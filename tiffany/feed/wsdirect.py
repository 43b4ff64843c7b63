"""Direct writes to a websocket: what the activity fan-out needs below ASGI.

ASGI sends one message per ``await send(...)``: through every middleware's
``send`` wrapper, uvicorn's framing (and per-connection compression) and
one write, in the sender's own task. For the activity feed that is the
cost of fan-out: a hundred websockets following the engine cost the API
more CPU per submission than the submission itself (bench/fanout.py). The
relay (:mod:`tiffany.feed.relay`) instead frames each message once and writes
the same bytes to every subscriber that is due it, in one pass, from the
relay's callback: no task switch, no framing per subscriber.

The API's uvicorn runs :class:`DirectWebSocketProtocol` (uvicorn's own
websockets protocol plus one server extension in each websocket's scope,
the way ASGI lets servers offer more)::

    scope["extensions"]["tiffany.direct"] = <DirectWriter>

Under another server the extension is absent and the feed sends through
ASGI as any app would.

Frames written this way are complete, unmasked text frames with RSV1 unset
(:func:`text_frame`, by the ``websockets`` library): valid whether or not
the client negotiated permessage-deflate, since an uncompressed message is
allowed on such a connection (RFC 7692, section 6). The API turns
compression off for its websockets anyway (``server.uvicorn_config``):
compressing every message once per subscriber is the fan-out cost this
module removes.

Rejected: the feed on public APIs only (each message built once for every
subscriber at a ring position and sent with ASGI ``websocket.send``, the
per-connection bounds set on the listening sockets with
``TCP_NOTSENT_LOWAT`` and ``TCP_USER_TIMEOUT``). Every feed behaviour held,
but a message per event through ASGI is framed and written per socket: the
fan-out cost the API several times its CPU a submission beside stalled
one-event-a-message sockets, and more beside batch readers (bench/README.md,
"Figures behind design choices in the code"). This module builds on uvicorn's
protocol internals, so the dependency is pinned to the minor it is tested
with (pyproject.toml).
"""

from __future__ import annotations

import contextlib
import socket
from asyncio import BaseTransport
from collections.abc import Callable, Mapping
from typing import Any, Final

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.protocol import State

__all__ = [
    "DIRECT_EXTENSION",
    "DirectWebSocketProtocol",
    "DirectWriter",
    "bound_send_buffer",
    "direct_writer_of",
    "text_frame",
]

#: The ASGI scope extension that carries a websocket's :class:`DirectWriter`.
DIRECT_EXTENSION: Final = "tiffany.direct"

#: The kernel send buffer of the API's websockets, in bytes (the kernel doubles it).
SOCKET_SEND_BUFFER_BYTES: Final = 64 * 1024

#: At the API's shutdown, how long a websocket's socket may take to accept what is
#: queued for it (its close frame last) before it is reset, in seconds. Below the
#: server's graceful-shutdown deadline (``server.GRACEFUL_SHUTDOWN_S``).
SHUTDOWN_LINGER_S: Final = 2.0


def bound_send_buffer(transport: BaseTransport) -> None:
    """Fix the kernel send buffer of a websocket's connection.

    Discussion: Linux grows a TCP socket's send buffer up to ``tcp_wmem``'s
    maximum (4 MiB by default), so a websocket whose client never reads
    took megabytes, thousands of events, before a send blocked: until then
    it cost the API as much as a reading one, and a few hundred of them held
    hundreds of megabytes of kernel memory. With the buffer fixed, a stalled
    client blocks after some 200 KB (twice this buffer, and asyncio's 64 KiB)
    and is cut off by the feed's send deadline.

    Not smaller: a fixed buffer turns the kernel's tuning of it off, and one
    of 32 KiB or less (16 KiB asked, doubled) is smaller than a loopback
    segment (64 KiB), so a large write waits for delayed acknowledgements,
    hundreds of times longer than with 64 KiB asked (small writes do not
    show it; bench/HISTORY.md, ``fanout.py``). The relay writes a burst
    of events in one write, so with 16 KiB a client reading 4 KiB events
    as fast as they came fell behind and was cut off as a stalled one.
    Only websockets: HTTP answers keep the kernel's tuned buffer (a large
    run page took some fifty times longer to download when the listening
    socket had the bound and every connection inherited it).
    """
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BUFFER_BYTES)


def text_frame(text: str) -> bytes:
    """Return ``text`` as one complete, unmasked websocket text frame (a server's)."""
    return Frame(Opcode.TEXT, text.encode()).serialize(mask=False)


class DirectWriter:
    """Writes whole frames to one websocket's transport, and says when it can take more.

    Attributes:
        on_writable: Called when the transport drains below its low-water
            mark after it had paused writing (set by the relay).
    """

    def __init__(self, protocol: DirectWebSocketProtocol) -> None:
        self._protocol = protocol
        self.on_writable: Callable[[], Any] | None = None

    def open(self) -> bool:
        """True while frames may be written (accepted, no close sent, connected)."""
        p = self._protocol
        return (
            p.handshake_complete
            and not p.close_sent
            and not p.disconnected
            and not p.transport.is_closing()
        )

    def writable(self) -> bool:
        """False while the transport's buffer is above its high-water mark (flow control)."""
        return self._protocol.writable.is_set()

    def write(self, frames: bytes) -> None:
        """Write complete frames (:func:`text_frame`); the caller checked :meth:`open`."""
        self._protocol.transport.write(frames)

    def close_after(self, frames: bytes, code: int, reason: str, linger_s: float) -> bool:
        """Write ``frames`` and a close frame behind what is queued, whatever the flow control.

        What a cut-off subscriber gets (``cutoff`` then close 1013): the
        frames go after every byte already queued for the client, so a
        client that reads again gets all it was sent, then them. A client
        that echoes the close ends the connection cleanly (uvicorn's own
        closing handshake); one whose socket has not taken them within
        ``linger_s`` is reset (``abort``): it sees the connection drop with
        no close frame (1006) and resumes with ``since`` as after any drop.
        False when the websocket is no longer open (nothing written).

        Discussion: an ASGI send waits until the transport drains below its
        high-water mark, which a stalled client's never does: the cutoff
        frame and the close timed out unsent, the handler returned, the
        server closed the transport, and a client that read again got its
        backlog and a drop (1006) with no ``cutoff``. The two frames are a
        hundred bytes; the buffer they join is bounded by the relay's
        budgets.
        """
        p = self._protocol
        if not self.open():
            return False
        try:
            p.conn.send_close(code, reason)
        except InvalidState:
            return False
        p.transport.write(frames + b"".join(p.conn.data_to_send()))
        p.close_sent = True
        if p.read_paused:  # read the client's close echo
            p.read_paused = False
            p.transport.resume_reading()
        if p.close_timer is None:
            # uvicorn cancels this timer when the client echoes the close (and
            # closes the transport itself), and when the connection is lost.
            p.close_timer = p.loop.call_later(linger_s, p.transport.abort)
        return True


class DirectWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol with a :class:`DirectWriter` in each websocket's scope.

    Its connections' send buffers are bounded (:func:`bound_send_buffer`).
    """

    def connection_made(self, transport: BaseTransport) -> None:
        """Take the (upgraded) connection as uvicorn does, its send buffer bounded."""
        bound_send_buffer(transport)
        super().connection_made(transport)

    def handle_connect(self, event: Any) -> None:
        """Accept the handshake as uvicorn does, then offer the writer (the app starts later)."""
        super().handle_connect(event)
        self.direct = DirectWriter(self)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][DIRECT_EXTENSION] = self.direct

    def shutdown(self) -> None:
        """Close this websocket at the server's shutdown, whatever its closing handshake's state.

        As uvicorn does, a websocket open both ways is sent close 1012
        (service restart); then whatever is queued for it, that close frame
        last, gets ``SHUTDOWN_LINGER_S`` to reach the client before the
        connection is reset.

        Discussion: uvicorn sends its 1012 unless it sent a close itself,
        and a websocket whose client sent the close first is past ``OPEN``
        (its protocol echoed the close): a second close raised
        ``InvalidState`` out of the server's shutdown, which stopped there
        and exited 1 with a traceback, the API's clean SIGTERM included.
        Such a websocket stays in the server's connections as long as its
        transport holds bytes, which a client that stopped reading (a tab
        being closed, a stalled feed subscriber) never takes; it is closed
        like one that sent its close, no frame added. The linger, not the
        server's graceful-shutdown deadline, bounds the wait for such a
        client: uvicorn's own close path cancels the timer that would
        reset it (``DirectWriter.close_after``'s) and waits for the flush.
        """
        if self.transport.is_closing():  # going already: nothing more to write
            self.stop_keepalive()
        elif self.close_sent or not self.handshake_complete or self.conn.state is State.OPEN:
            super().shutdown()  # a close 1012, or the 500 a handshake under way gets
        else:  # the client's close came first: the protocol echoed it
            self.stop_keepalive()
            self.transport.close()
        if self.close_timer is None and not self.disconnected:
            # connection_lost cancels it when the client takes all in time.
            self.close_timer = self.loop.call_later(SHUTDOWN_LINGER_S, self.transport.abort)

    def resume_writing(self) -> None:
        """The transport drained: wake ASGI senders, and the relay if it waits on this one."""
        super().resume_writing()
        direct = getattr(self, "direct", None)
        if direct is not None and direct.on_writable is not None:
            direct.on_writable()


def direct_writer_of(scope: Mapping[str, Any]) -> DirectWriter | None:
    """Return the websocket's :class:`DirectWriter`, or None when the server offers none."""
    ext = scope.get("extensions") or {}
    writer = ext.get(DIRECT_EXTENSION)
    return writer if isinstance(writer, DirectWriter) else None
