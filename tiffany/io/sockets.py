"""Socket coroutines over ``ReadWait``/``WriteWait``.

Each helper puts the socket in non-blocking mode, tries the call, and parks
the task on the selector only when the call would block (``BlockingIOError``).
Errors other than "would block" propagate to the calling task.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Generator
from typing import Any

from tiffany.kernel import ReadWait, WriteWait

__all__ = ["accept", "connect", "listen", "recv", "send_all"]

Co = Generator[Any, Any, Any]


def listen(host: str = "127.0.0.1", port: int = 0, backlog: int = 1024) -> socket.socket:
    """Return a non-blocking TCP listener bound to ``(host, port)`` (port 0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def accept(sock: socket.socket) -> Co:
    """Wait for and accept one connection; returns ``(client, addr)``."""
    sock.setblocking(False)
    while True:
        try:
            client, addr = sock.accept()
        except BlockingIOError:
            yield ReadWait(sock)
        else:
            client.setblocking(False)
            return client, addr


def recv(sock: socket.socket, nbytes: int) -> Co:
    """Receive up to ``nbytes``; ``b""`` means the peer closed."""
    while True:
        try:
            return sock.recv(nbytes)
        except BlockingIOError:
            yield ReadWait(sock)


def send_all(sock: socket.socket, data: bytes) -> Co:
    """Send all of ``data``, waiting for buffer space as needed."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            yield WriteWait(sock)
        else:
            view = view[sent:]
    return len(data)


def connect(address: tuple[str, int]) -> Co:
    """Open a non-blocking TCP connection to ``address``; return the socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        err = sock.connect_ex(address)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            raise OSError(err, f"connect to {address}: {errno.errorcode.get(err, err)}")
        if err:
            yield WriteWait(sock)
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, f"connect to {address}: {errno.errorcode.get(err, err)}")
    except BaseException:
        sock.close()
        raise
    return sock
