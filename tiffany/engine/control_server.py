"""The engine's end of the control channel (protocol: :mod:`tiffany.wire.control`).

One thread accepts connections on the Unix socket; one thread per
connection reads request lines and hands each to a small worker pool, so a
pipelined client gets answers as they are ready (a ``verify`` waits for its
replay, a ``cancel`` for the loop) without holding up the others. Answers
are written under a per-connection lock. Requests reach the loop through
the service's inbox.

A handler may answer later: it returns a :class:`~concurrent.futures.Future`
instead of the answer's fields, and the answer is sent when the future is
done. ``submit`` (waiting for its group commit) and ``wait_projected``
(waiting for the store) answer this way, so what waits holds no worker
thread: sixteen waiting requests would otherwise hold up every other one
(``engine/timeouts.py``).

The hot path takes no thread hop it can avoid. A request ``quick(request)``
says never blocks (a ``submit`` checks and queues its plan; a
``wait_projected`` registers a future) is handled on its connection's
thread, not handed to the pool. A deferred answer is written by the thread
that completes its future (the scheduler thread, at the group commit that
makes a submission durable) when it can be without waiting: the
connection's lock is free and the socket takes the whole line at once
(``MSG_DONTWAIT``). Otherwise, or for a refusal (which may be logged), the
pool writes it. So the scheduler thread never waits on a socket: it makes
one non-blocking ``send`` a submission, where each hop to another thread
cost the answer a wait for the GIL (a visible share of the mean and of the
tail at high rates; bench/README.md).

Each line is decoded once, here, into its typed command
(:func:`~tiffany.wire.control.decode_command`); the handler dispatches it by
type. A bad request line (over :data:`~tiffany.wire.control.MAX_FRAME_BYTES`,
not JSON, no command, a field of the wrong type) is refused on its own, with its ``id``
when the line's head names one, and the connection goes on: other requests
pipelined on it (the API's submissions) never see a reset. An over-cap line
is not buffered: its bytes are skipped up to the next newline.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog

from tiffany.errors import (
    CommandTooLarge,
    EngineFault,
    EngineNotReady,
    Refusal,
    TiffanyError,
)
from tiffany.wire.control import (
    MAX_FRAME_BYTES,
    Command,
    answer_fields,
    command_name,
    decode_command,
    encode_frame,
    frame_id,
    refusal_fields,
)

__all__ = ["ControlServer"]

log = structlog.get_logger(__name__)

#: Requests handled at once (the rest queue in the pool).
WORKERS: Final = 16

#: ``handle(command)``: the answer (typed, or its fields), or a future of it (answered when done).
Handler = Callable[[Command], Any]
#: ``quick(command)``: whether ``handle`` answers it without blocking (no pool needed).
Quick = Callable[[Command], bool]


class ControlServer:
    """Serve control commands on ``path`` with ``handle(command) -> answer``.

    ``handle`` raises a :class:`~tiffany.errors.Refusal` to refuse; any other
    exception answers as an :class:`~tiffany.errors.EngineFault` with its
    message (and is logged).
    """

    def __init__(
        self, path: str | os.PathLike[str], handle: Handler, quick: Quick | None = None
    ) -> None:
        self.path = Path(path)
        self.handle = handle
        self.quick = quick
        self._sock: socket.socket | None = None
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="tiffany-control")
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        """Bind (replacing a stale socket file) and start accepting."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket file is the owner's only
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        sock.listen(64)
        self._sock = sock
        self._thread = threading.Thread(
            target=self._accept, name="tiffany-control-accept", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, close connections, remove the socket file."""
        self._closed = True
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept(self) -> None:
        while not self._closed and self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="tiffany-control-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        write_lock = threading.Lock()
        buf = bytearray()
        skipping: bytes | None = None  # the head of an over-cap line being skipped
        try:
            while True:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    return
                if skipping is not None:
                    end = chunk.find(b"\n")
                    if end < 0:
                        continue
                    self._refuse_long(conn, write_lock, skipping)
                    skipping = None
                    chunk = chunk[end + 1 :]
                buf += chunk
                while True:
                    end = buf.find(b"\n")
                    if end < 0:
                        break
                    line = bytes(buf[:end])
                    del buf[: end + 1]
                    if line.strip():
                        self._submit(conn, write_lock, line)
                if len(buf) > MAX_FRAME_BYTES:
                    skipping = bytes(buf[:64])
                    buf.clear()
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _refuse_long(self, conn: socket.socket, write_lock: threading.Lock, head: bytes) -> None:
        log.warning("control.frame_too_large", limit=MAX_FRAME_BYTES)
        error = CommandTooLarge(f"request line over the limit of {MAX_FRAME_BYTES} bytes")
        self._send(conn, write_lock, _refusal(frame_id(head), error))

    def _submit(self, conn: socket.socket, write_lock: threading.Lock, line: bytes) -> None:
        try:
            command = decode_command(line)
        except Refusal as exc:  # not JSON, no command, a field of the wrong type
            self._send(conn, write_lock, _refusal(frame_id(line[:64]), exc))
            return
        if self.quick is not None and self.quick(command):
            self._answer(conn, write_lock, command)
            return
        try:
            self._pool.submit(self._answer, conn, write_lock, command)
        except RuntimeError:  # shutting down
            stopping = EngineNotReady("the engine is stopping")
            self._send(conn, write_lock, _refusal(command.id, stopping))

    def _answer(self, conn: socket.socket, write_lock: threading.Lock, command: Command) -> None:
        try:
            result = self.handle(command)
        except Exception as exc:  # noqa: BLE001 - answered as a refusal below
            self._send(conn, write_lock, self._envelope(command, None, exc))
            return
        if isinstance(result, Future):
            result.add_done_callback(lambda fut: self._answer_later(conn, write_lock, command, fut))
            return
        self._send(conn, write_lock, self._envelope(command, result, None))

    def _answer_later(
        self,
        conn: socket.socket,
        write_lock: threading.Lock,
        command: Command,
        fut: Future[Any],
    ) -> None:
        """Send a deferred answer now if that cannot block, else from the pool (module doc)."""
        if not fut.cancelled() and fut.exception() is None:
            data = self._frame(self._envelope(command, fut.result(), None))
            if write_lock.acquire(blocking=False):
                try:
                    sent = conn.send(data, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:  # the peer is gone: so is the answer (as in _send)
                    sent = len(data)
                if sent == len(data):
                    write_lock.release()
                    return
                if sent:  # the line's head is out: its tail goes next, lock held till then
                    try:
                        self._pool.submit(self._send_rest, conn, write_lock, data[sent:])
                    except RuntimeError:  # shutting down: the connection goes too
                        write_lock.release()
                    return
                write_lock.release()
            with contextlib.suppress(RuntimeError):  # shutting down: the connection goes too
                self._pool.submit(self._send_line, conn, write_lock, data)
            return

        def send() -> None:  # a refusal: its envelope may log
            self._send(conn, write_lock, self._envelope(command, None, fut.exception()))

        with contextlib.suppress(RuntimeError):  # shutting down: the connection goes too
            self._pool.submit(send)

    @staticmethod
    def _send_rest(conn: socket.socket, write_lock: threading.Lock, rest: bytes) -> None:
        """Finish a line another thread began to send (it holds ``write_lock`` for us)."""
        try:
            with contextlib.suppress(OSError):
                conn.sendall(rest)
        finally:
            write_lock.release()

    def _envelope(self, command: Command, answer: Any, exc: BaseException | None) -> dict[str, Any]:
        """The answer line's object: ``{"id", "ok": true, ...}`` or a refusal."""
        if exc is None:
            return {"id": command.id, "ok": True, **answer_fields(answer)}
        return _refusal(command.id, as_refusal(exc, command_name(command)))

    @staticmethod
    def _frame(answer: dict[str, Any]) -> bytes:
        """The answer's line, or a fault naming why it cannot be sent."""
        try:
            data = encode_frame(answer)
            if len(data) > MAX_FRAME_BYTES:
                raise ValueError(f"{len(data)} bytes, over the limit of {MAX_FRAME_BYTES}")
        except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
            fault = EngineFault(f"answer not encodable: {exc}")
            data = encode_frame(_refusal(answer.get("id"), fault))
        return data

    def _send(
        self, conn: socket.socket, write_lock: threading.Lock, answer: dict[str, Any]
    ) -> None:
        self._send_line(conn, write_lock, self._frame(answer))

    @staticmethod
    def _send_line(conn: socket.socket, write_lock: threading.Lock, data: bytes) -> None:
        with write_lock, contextlib.suppress(OSError):
            conn.sendall(data)


def as_refusal(exc: BaseException, op: str) -> Refusal:
    """What a handler of ``op`` raised, as the refusal the caller gets (a bug is logged)."""
    if isinstance(exc, Refusal):
        return exc
    if isinstance(exc, TiffanyError):
        return EngineFault(exc.message, detail=exc.to_dict())
    log.error("control.failed", op=op, exc_info=exc)
    return EngineFault(repr(exc))


def _refusal(rid: int | None, exc: Refusal) -> dict[str, Any]:
    return {"id": rid, "ok": False, **refusal_fields(exc)}
