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

A hello ``{"head": true}`` is a question, not a subscription: the server
answers one line ``{"type": "head", "last_seq": N}`` (the last seq its hub
gave an event, or the seq it starts after) and closes. The API asks it of a
websocket's ``since`` beyond the last event it relayed: a ``since`` above
``last_seq`` names an event this feed never sent, and is refused
(:func:`feed_head`).

The engine side (:class:`FeedServer`) runs in its own threads and reads only
from the hub's subscriptions: the scheduler thread never writes to a socket.
The API side (:func:`follow`) reconnects with the last seq it saw
(:class:`Reconnects`: tenacity, transient errors only), so an API restart
resumes without gaps; an engine restart starts a new, empty ring whose seqs
continue above the old engine's (``hub.py``): a client that had every event
of the old engine goes on from there, an older one gets ``gone``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import msgspec
import tenacity

from tiffany.feed.events import Event
from tiffany.feed.hub import Hub

__all__ = [
    "FEED_SOCKET",
    "MAX_RECONNECT_DELAY_S",
    "RECONNECT_DELAY_S",
    "FeedClosed",
    "FeedServer",
    "FrameHead",
    "Lines",
    "Reconnects",
    "feed_head",
    "follow",
    "follow_lines",
    "frame_head",
    "is_transient",
    "line_of",
]

#: File name of the feed socket inside the data dir (engine and API agree on it).
FEED_SOCKET: Final = "feed.sock"

#: An idle connection gets a ping this often, in seconds.
PING_INTERVAL_S: Final = 5.0
#: How long a client waits before reconnecting, in seconds (the first time).
RECONNECT_DELAY_S: Final = 0.2
#: The longest wait between two reconnects, in seconds (the backoff's cap).
MAX_RECONNECT_DELAY_S: Final = 2.0
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
            if req.get("head"):
                conn.sendall(json.dumps({"type": "head", "last_seq": self.hub.last_seq}).encode())
                return
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


class FeedClosed(EOFError):
    """The engine ended the feed (EOF, or a ``cutoff``): a reconnect resumes it."""


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` means "the engine is not there right now": worth reconnecting.

    Refused, reset, broken pipe, the socket file missing (the engine is
    restarting), the stream ended (:class:`EOFError`). Everything else (a
    frame that is not JSON, a permission error, a bug) fails the same way
    on every attempt and is raised instead of retried.
    """
    return isinstance(exc, ConnectionError | FileNotFoundError | EOFError)


class Reconnects:
    """The feed clients' reconnect policy, on tenacity.

    Transient errors (:func:`is_transient`) are retried forever, with an
    exponential backoff from :data:`RECONNECT_DELAY_S` up to
    :data:`MAX_RECONNECT_DELAY_S`; the backoff starts over once a connection
    has delivered (:meth:`progressed`), so an engine restart after a day up
    is met after 0.2 s, not 2 s. :meth:`at_once` makes the next reconnect
    immediate (after a cutoff). Anything else is raised at once.

    Args:
        on_retry: Called with the error and the wait before each reconnect.
        sleep: The coroutine that waits (tests pass one that does not).
        first_s: The first wait, in seconds.
        max_s: The longest wait, in seconds.
        transient: Which errors are retried (the rest are raised at once).
    """

    def __init__(
        self,
        on_retry: Callable[[BaseException, float], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        *,
        first_s: float = RECONNECT_DELAY_S,
        max_s: float = MAX_RECONNECT_DELAY_S,
        transient: Callable[[BaseException], bool] | None = None,
    ) -> None:
        self._on_retry = on_retry
        self._sleep = sleep
        self._first, self._max = first_s, max_s
        self._transient = transient or is_transient
        self._base = 0
        self._now = False

    def attempts(self) -> tenacity.AsyncRetrying:
        """The attempts (``async for attempt in policy.attempts(): with attempt: ...``)."""
        extra: dict[str, Any] = {} if self._sleep is None else {"sleep": self._sleep}
        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(self._transient),
            wait=self._wait,
            before_sleep=self._before_sleep,
            reraise=True,
            **extra,
        )

    def progressed(self, attempt: tenacity.AttemptManager) -> None:
        """Note that ``attempt``'s connection delivered: the backoff starts over."""
        self._base = attempt.retry_state.attempt_number - 1

    def at_once(self) -> None:
        """Reconnect without waiting, once."""
        self._now = True

    def _wait(self, state: tenacity.RetryCallState) -> float:
        if self._now:
            self._now = False
            return 0.0
        failures = max(1, state.attempt_number - self._base)
        return float(min(self._max, self._first * 2 ** (failures - 1)))

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        if self._on_retry is not None and state.outcome is not None:
            exc = state.outcome.exception()
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            if exc is not None:
                self._on_retry(exc, wait)


async def _session(
    path: str | os.PathLike[str], since: int | None, run_id: str | None
) -> AsyncGenerator[dict[str, Any], None]:
    """One connection: the hello, then the frames until EOF or a cutoff (pings skipped)."""
    import asyncio

    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(json.dumps({"since": since, "run_id": run_id}).encode() + b"\n")
        await writer.drain()
        while line := await reader.readline():
            frame = msgspec.json.decode(line)
            kind = frame.get("type")
            if kind == "ping":
                continue
            yield frame
            if kind == "cutoff":
                return
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()


async def feed_head(path: str | os.PathLike[str]) -> int:
    """Ask the feed at ``path`` for its last seq (a ``head`` hello; module docstring).

    Raises:
        OSError: The feed cannot be reached.
        EOFError: It closed without an answer (an engine without ``head``).
    """
    import asyncio

    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(b'{"head": true}\n')
        await writer.drain()
        line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()
    frame = msgspec.json.decode(line) if line.strip() else {}
    last = frame.get("last_seq") if isinstance(frame, dict) else None
    if frame.get("type") != "head" or not isinstance(last, int):
        raise EOFError(f"the feed at {path} did not answer its head")
    return last


class FrameHead(msgspec.Struct):
    """What a relay reads of a feed frame: its type, seq and run (the rest is passed on as text)."""

    type: Any = None
    seq: Any = None
    run_id: Any = None
    oldest: Any = None


#: ``[(head, text), ...]``: the frames one read brought, each with its JSON text.
Lines = list[tuple[FrameHead, str]]

_decode_head = msgspec.json.Decoder(FrameHead).decode

#: Largest frame a lines session takes, in bytes (the hub's frames are far smaller).
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024


def frame_head(text: str | bytes) -> FrameHead:
    """Decode what a relay reads of one frame's JSON text (its type, seq and run)."""
    return _decode_head(text)


def line_of(frame: dict[str, Any]) -> tuple[FrameHead, str]:
    """Return ``frame`` as a lines session yields it (for relays fed by hand)."""
    text = msgspec.json.encode(frame)
    return _decode_head(text), text.decode()


async def follow_lines(
    path: str | os.PathLike[str], since: int | None = None, run_id: str | None = None
) -> AsyncGenerator[Lines, None]:
    """One connection to the feed, for a relay: frames a read at a time, each with its text.

    Like ``follow(reconnect=False)``, but each item is every whole frame one
    read of the socket brought, as ``(head, text)``: the head (type, seq,
    run) decoded and the rest left as the engine wrote it. A relay that
    passes events on as text thus neither builds nor re-encodes them, and
    pays one ``await`` per read instead of one per event (at 300 runs/s the
    API spent a fifth of its time reading its feed a line at a time). Pings
    are dropped; a cutoff ends the batch and the stream.

    Raises:
        FeedClosed: A frame longer than :data:`MAX_FRAME_BYTES`.
    """
    import asyncio

    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(json.dumps({"since": since, "run_id": run_id}).encode() + b"\n")
        await writer.drain()
        rest = b""
        while chunk := await reader.read(1 << 16):
            lines = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
            rest = lines.pop()
            if len(rest) > MAX_FRAME_BYTES:
                raise FeedClosed(f"a feed frame longer than {MAX_FRAME_BYTES} bytes")
            batch: Lines = []
            for line in lines:
                if not line:
                    continue
                head = _decode_head(line)
                if head.type == "ping":
                    continue
                batch.append((head, line.decode()))
                if head.type == "cutoff":
                    yield batch
                    return
            if batch:
                yield batch
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()


def follow(
    path: str | os.PathLike[str],
    since: int | None = None,
    run_id: str | None = None,
    *,
    reconnect: bool = True,
) -> AsyncGenerator[dict[str, Any], None]:
    """Return the feed's frames (API side, asyncio); pings are not yielded.

    With ``reconnect`` (the default), follow for ever: after EOF, a cutoff
    or a transient error the connection is made again (:class:`Reconnects`)
    with the last seq seen, so a resume asks for exactly what was missed;
    other errors are raised. Without it, one connection: its errors are
    raised and its end is the end (the connection's own generator, with no
    layer in between: the API's relay reads every event through it).
    """
    if not reconnect:
        return _session(path, since, run_id)
    return _reconnecting(path, since, run_id)


async def _reconnecting(
    path: str | os.PathLike[str], since: int | None, run_id: str | None
) -> AsyncGenerator[dict[str, Any], None]:
    last = since
    policy = Reconnects()
    async for attempt in policy.attempts():
        with attempt:
            async with contextlib.aclosing(_session(path, last, run_id)) as frames:
                async for frame in frames:
                    policy.progressed(attempt)
                    if "seq" in frame:
                        last = frame["seq"]
                    yield frame
            raise FeedClosed(f"the engine closed {path}")
