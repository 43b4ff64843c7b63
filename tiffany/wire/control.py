"""The control channel: commands from the API side-process to the engine.

The engine process listens on a Unix socket (``<data dir>/control.sock``,
mode 0600); the API process is its client. Framing is one JSON object per
line in both directions. A request carries an ``id`` the answer repeats, so
one connection carries any number of requests in flight (the asyncio client
below pipelines them).

Requests (``op`` and its fields) and the answers' fields:

=============  ====================================  ==========================================
op             request fields                        answer (``ok: true``)
=============  ====================================  ==========================================
``status``     --                                    ``ready`` (false while recovering),
                                                     ``recovering`` (runs still replaying),
                                                     ``pid``, ``started_at``, ``runs_active``
``submit``     ``plan`` (object), ``inputs``,        ``run_id``, ``created`` (false when the
               ``key`` (idempotency key or null)     key named an earlier submission), ``seq``
               or, for a re-run, ``rerun_of`` (a     (the WAL seq of the run's RUN_START; the
               finished run), ``from_step``          same for a repeated key)
               (optional) and ``inputs``
``wait_``      ``seq``, ``wait_s`` (at most          ``last_seq`` (the store's watermark),
``projected``  :data:`MAX_WAIT_PROJECTED_S`); or     ``reached`` (``last_seq >= seq``); answered
               ``written: true`` for all the engine  as soon as the projector reports it, or
               has written (answered with its seq,   after ``wait_s`` with ``reached: false``
               ``written_seq``)
``cancel``     ``run_id``                            ``run_id``, ``status: "cancelling"``
``signal``     ``run_id``, ``name``, ``payload``     ``run_id``, ``name``, ``signal_id``,
               (any JSON), ``signal_id`` (optional;  ``seq`` (the WAL seq of the signal's
               the same id is journaled once)        record); answered once it is durable
``verify``     ``run_id``                            the replay report (``tiffany replay --verify
                                                     --json``, computed in a process pool), its
                                                     verdict as ``identical``
``export``     ``run_id``                            ``run_id``, ``records``, ``export``: the
                                                     run's export file (docs/replay.md), base64
                                                     (413 past ``MAX_EXPORT_BYTES``)
``metrics``    --                                    ``text``: the engine's registry in the
                                                     Prometheus text format
``tools``      --                                    ``tools`` (the enabled ones: ``name``,
                                                     ``description``, ``durable``, ``args`` and
                                                     ``output`` JSON Schemas), ``disabled``
                                                     (names), ``python_functions`` (names)
=============  ====================================  ==========================================

A refused request answers ``{"id", "ok": false, "status", "error", "detail"}``
where ``status`` is the HTTP status the API should give (404 unknown run,
409 conflict, 422 invalid plan with ``detail`` a list of ``{"loc", "msg"}``,
503 not ready) and ``error`` a short message.

``submit`` answers only once the run's first record is durable in the WAL
(write-ahead: the 201 means the run will happen, even across a crash).
``wait_projected`` is how a reader waits for its own writes (docs/clock.md):
the engine answers it when its projector reports the store past ``seq``,
without holding a worker thread meanwhile.

A request is refused on its own, never by dropping the connection other
requests share: the client refuses to send a frame over
:data:`MAX_FRAME_BYTES` (413) or one it cannot encode (422); the engine
answers an over-cap or undecodable line with the request's ``id`` (read
from the line's head, where :func:`encode_frame` puts it) and 413/422, skips
to the next newline and goes on reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import re
import socket
from pathlib import Path
from typing import Any, Final

import msgspec

from tiffany.errors import TiffanyError

__all__ = [
    "CONTROL_SOCKET",
    "MAX_FRAME_BYTES",
    "MAX_WAIT_PROJECTED_S",
    "AsyncControlClient",
    "ControlError",
    "ControlUnavailable",
    "call",
    "socket_path",
]

#: File name of the control socket inside the data dir.
CONTROL_SOCKET: Final = "control.sock"

#: Largest request or answer line (plans are capped well below this by the API).
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024

#: Longest a ``wait_projected`` request may wait, in seconds.
MAX_WAIT_PROJECTED_S: Final = 30.0

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

#: The ``id`` at the head of a frame (``{"id":12,...``), read without decoding the rest.
_FRAME_ID: Final = re.compile(rb'\s*\{\s*"id"\s*:\s*(\d{1,18})\s*[,}]')


class ControlError(TiffanyError):
    """The engine refused a request.

    Attributes:
        status: The HTTP status the API answers with.
        detail: Structured detail (for 422: a list of ``{"loc", "msg"}``).
    """

    code = "control.refused"

    def __init__(self, status: int, message: str, detail: Any = None) -> None:
        super().__init__(message, status=status, detail=detail)
        self.status = status
        self.detail = detail


class ControlUnavailable(TiffanyError):
    """The engine process is not reachable (not started, restarting, or gone)."""

    code = "control.unavailable"


def submission_digest(plan: Any, inputs: Any) -> str:
    """The digest an ``Idempotency-Key`` is tied to: the same key for another body is refused."""
    body = json.dumps({"plan": plan, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def socket_path(data_dir: str | os.PathLike[str]) -> Path:
    """Return the control socket's path for a data dir."""
    return Path(data_dir) / CONTROL_SOCKET


def encode_frame(obj: Any) -> bytes:
    """Return ``obj`` as one framed line."""
    return _encode(obj) + b"\n"


def decode_frame(line: bytes) -> Any:
    """Decode one framed line (without or with its newline)."""
    return _decode(line)


def frame_id(head: bytes) -> int | None:
    """Return the request ``id`` at the head of a frame that cannot be decoded, if any."""
    m = _FRAME_ID.match(head)
    return int(m.group(1)) if m else None


def request_frame(rid: int, op: str, fields: dict[str, Any]) -> bytes:
    """Return a request as one framed line, refusing what the engine would not read.

    Raises:
        ControlError: 413 for a frame over :data:`MAX_FRAME_BYTES`, 422 for
            fields that are not encodable (too deep, an integer over 64 bits...).
    """
    try:
        data = encode_frame({"id": rid, "op": op, **fields})
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        raise ControlError(422, f"the request cannot be encoded: {exc}") from None
    if len(data) > MAX_FRAME_BYTES:
        raise ControlError(
            413, f"the request is {len(data)} bytes; the control channel takes {MAX_FRAME_BYTES}"
        )
    return data


def _answer(msg: dict[str, Any]) -> dict[str, Any]:
    """Return an answer's fields without the envelope (``id``, ``ok``), or raise."""
    if msg.get("ok"):
        return {k: v for k, v in msg.items() if k != "id" and k != "ok"}
    raise ControlError(
        int(msg.get("status", 500)), str(msg.get("error", "engine error")), msg.get("detail")
    )


def call(
    data_dir: str | os.PathLike[str], op: str, *, timeout: float = 30.0, **fields: Any
) -> dict[str, Any]:
    """Send one request over a fresh connection and return the answer (blocking).

    Raises:
        ControlUnavailable: No engine listens on the data dir's socket.
        ControlError: The engine refused the request.
    """
    path = socket_path(data_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise ControlUnavailable(f"no engine listens on {path}: {exc}", path=str(path)) from exc
        sock.sendall(request_frame(1, op, fields))
        buf = bytearray()
        while b"\n" not in buf:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ControlUnavailable(f"the engine closed {path} before answering")
            buf += chunk
            if len(buf) > MAX_FRAME_BYTES:
                raise ControlUnavailable("answer too large")
    line, _, _ = bytes(buf).partition(b"\n")
    return _answer(decode_frame(line))


class AsyncControlClient:
    """An asyncio client that pipelines requests over one connection.

    It connects on first use and reconnects after the engine restarts; a
    request in flight when the connection drops fails with
    :class:`ControlUnavailable` (the caller answers 503; a resubmission with
    the same idempotency key is safe).
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        self.path = socket_path(data_dir)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock | None = None

    async def request(
        self, op: str, *, timeout: float | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Send a request and return its answer.

        Raises:
            ControlUnavailable: The engine is not reachable or did not answer in time.
            ControlError: The engine refused the request.
        """
        rid = next(self._ids)
        frame = request_frame(rid, op, fields)  # refused here, before the shared connection
        writer = await self._connect()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            writer.write(frame)
            await writer.drain()
            msg = await asyncio.wait_for(fut, timeout if timeout is not None else self.timeout)
        except (OSError, ConnectionError) as exc:
            self._drop(exc)
            raise ControlUnavailable(f"lost the engine on {self.path}: {exc}") from exc
        except TimeoutError as exc:
            raise ControlUnavailable(f"the engine did not answer {op!r} in time") from exc
        finally:
            self._pending.pop(rid, None)
        return _answer(msg)

    async def close(self) -> None:
        """Close the connection (pending requests fail)."""
        self._drop(ControlUnavailable("client closed"))
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
            self._reader_task = None

    async def _connect(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            try:
                reader, writer = await asyncio.open_unix_connection(
                    str(self.path), limit=MAX_FRAME_BYTES
                )
            except OSError as exc:
                raise ControlUnavailable(
                    f"no engine listens on {self.path}: {exc}", path=str(self.path)
                ) from exc
            self._writer = writer
            self._reader_task = asyncio.create_task(self._read(reader, writer))
            return writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                msg = decode_frame(line)
                fut = self._pending.get(msg.get("id"))
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (OSError, ValueError, msgspec.DecodeError) as exc:
            if self._writer is writer:
                self._drop(exc)
            return
        if self._writer is writer:
            self._drop(ConnectionError("the engine closed the control connection"))

    def _drop(self, exc: BaseException) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ControlUnavailable(f"lost the engine on {self.path}: {exc}"))
