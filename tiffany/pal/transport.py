"""The PAL feed between processes: a Unix socket from the engine to the API.

Protocol (newline-delimited JSON, one connection per subscriber):

* the client sends one line: ``{"since": SEQ | null, "run_id": ID | null}``
  (``null``: from now on; a number: every event after it that the ring
  still holds, then live);
* the server answers with frames, one per line: activity events (schema v2,
  see ``events.py``), or control frames ``{"type": "gone", ...}`` (the resume
  point is older than the ring: reload state over HTTP) and
  ``{"type": "cutoff", "last_seq": ...}`` (the subscriber fell behind and is
  disconnected: reconnect with ``since``);
* ``{"type": "ping"}`` every ``PING_INTERVAL_S`` when idle, so each side sees
  a dead peer.

The engine side (:class:`FeedServer`) runs in its own threads and reads only
from the hub's subscriptions: the scheduler thread never writes to a socket.
The API side (:func:`follow`) reconnects with the last seq it saw, so an API
restart resumes without gaps; an engine restart starts a new, empty ring
whose seqs continue above the old engine's (``hub.py``): a client that had
every event of the old engine goes on from there, an older one gets ``gone``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import msgspec

from tiffany.pal.events import Event
from tiffany.pal.hub import Hub

__all__ = ["FEED_SOCKET", "FeedServer", "follow"]

#: File name of the feed socket inside the data dir (engine and API agree on it).
FEED_SOCKET: Final = "feed.sock"

#: An idle connection gets a ping this often, in seconds.
PING_INTERVAL_S: Final = 5.0
#: How long a client waits before reconnecting, in seconds.
RECONNECT_DELAY_S: Final = 0.2
#: Longest hello line a server accepts, in bytes.
MAX_HELLO_BYTES: Final = 4096

_PING = b'{"type":"ping"}\n'


class FeedServer:
    """Serve the hub's events on a Unix socket (engine side)."""

    def __init__(self, hub: Hub, path: str | os.PathLike[str]) -> None:
        self.hub = hub
        self.path = Path(path)
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.clients = 0

    def start(self) -> None:
        """Bind the socket and start accepting subscribers."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        sock.listen(16)
        sock.settimeout(0.2)
        self._sock = sock
        t = threading.Thread(target=self._accept, name="tiffany-pal-feed", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Close the socket and every connection."""
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        for t in self._threads:
            t.join(timeout=2)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(
                target=self._serve, args=(conn,), name="tiffany-pal-client", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        self.clients += 1
        try:
            conn.settimeout(5)
            hello = _read_line(conn)
            req = json.loads(hello) if hello else {}
            since = req.get("since")
            run_id = req.get("run_id")
            flt: Callable[[Event], bool] | None = (lambda e: e.run_id == run_id) if run_id else None
            sub = self.hub.subscribe(since=int(since) if since is not None else None, flt=flt)
            conn.settimeout(None)
            idle_since = time.monotonic()
            try:
                while not self._stop.is_set():
                    frames = sub.get(timeout=0.2)
                    if frames:
                        conn.sendall(b"\n".join(frames) + b"\n")
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > PING_INTERVAL_S:
                        conn.sendall(_PING)
                        idle_since = time.monotonic()
                    if sub.closed:
                        return
            finally:
                sub.close()
        except (OSError, ValueError):
            return  # the client went away or spoke nonsense: drop it
        finally:
            self.clients -= 1
            conn.close()


def _read_line(conn: socket.socket) -> bytes:
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(1024)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_HELLO_BYTES:
            raise ValueError("hello line too long")
    return buf.split(b"\n", 1)[0]


async def follow(
    path: str | os.PathLike[str],
    since: int | None = None,
    run_id: str | None = None,
    *,
    reconnect: bool = True,
) -> AsyncIterator[dict[str, Any]]:
    """Yield the feed's frames (API side, asyncio); resume after every disconnect.

    Events update the resume point, so a reconnect asks for exactly what was
    missed. Pings are not yielded.
    """
    import asyncio

    last = since
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
        except OSError:
            if not reconnect:
                raise
            await asyncio.sleep(RECONNECT_DELAY_S)
            continue
        try:
            writer.write(json.dumps({"since": last, "run_id": run_id}).encode() + b"\n")
            await writer.drain()
            while True:
                line = await reader.readline()
                if not line:
                    break
                frame = msgspec.json.decode(line)
                kind = frame.get("type")
                if kind == "ping":
                    continue
                if "seq" in frame:
                    last = frame["seq"]
                yield frame
                if kind == "cutoff":
                    break
        finally:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()
        if not reconnect:
            return
        await asyncio.sleep(RECONNECT_DELAY_S)
