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
                                                     (the WAL seq of the run's RUN_START; the
                                                     same for a repeated key)
``rerun``      ``rerun_of`` (a finished run),        as ``submit``
               ``from_step`` (optional), ``inputs``
               (override the run's), ``key``
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

Each request is a typed command (:data:`Command`, a msgspec tagged union on
``op``: :class:`Status`, :class:`Submit`, :class:`Rerun`, :class:`Cancel`,
:class:`Signal`, :class:`Verify`, :class:`WaitProjected`, :class:`CheckPlan`,
:class:`Metrics`, :class:`Tools`), decoded once where it enters the engine
(:func:`decode_command`) and dispatched by its type. A field of the wrong
type is refused naming the field (:class:`~tiffany.errors.InvalidCommand`).
The answers of the commands with a fixed shape are typed too
(:class:`Submitted`, :class:`Cancelling`, :class:`Signalled`,
:class:`Projected`, :class:`PlanChecked`, :class:`MetricsText`); each
command names its answer's type (``answer``), since the request ``id``
already ties an answer to its command. ``status``, ``verify`` and ``tools``
answer a free-form object.

A refused request answers ``{"id", "ok": false, "kind", "error", "field",
"detail"}``: the :class:`~tiffany.errors.Refusal`'s kind (``run_not_found``,
``run_finished``, ``invalid``, ``not_ready``...), its message, the field it
names and its structured ``detail`` (for ``invalid``: a list of ``{"loc",
"msg"}``). The engine says nothing of HTTP: the API maps the kinds to
statuses (``tiffany/api/problems.py``), the CLI to exit codes.

``submit`` answers only once the run's first record is durable in the WAL
(write-ahead: the 201 means the run will happen, even across a crash).
``wait_projected`` is how a reader waits for its own writes (docs/clock.md):
the engine answers it when its projector reports the store past ``seq``,
without holding a worker thread meanwhile.

A request is refused on its own, never by dropping the connection other
requests share: the client refuses to send a frame over
:data:`MAX_FRAME_BYTES` (``too_large``) or one it cannot encode
(``invalid``); the engine answers an over-cap or undecodable line with the
request's ``id`` (read from the line's head, where :func:`encode_frame` puts
it), skips to the next newline and goes on reading.

Compatibility: the requests' JSON is what it was (``op`` and the same
fields), but for a re-run, now its own ``op`` (``rerun``) rather than a
``submit`` with ``rerun_of``; answers carry a refusal's ``kind`` instead of
an HTTP ``status``. The API, the CLI and the engines of one server are one
version.
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
from typing import Annotated, Any, ClassVar, Final, TypeAlias

import msgspec

from tiffany.errors import (
    CommandTooLarge,
    EngineFault,
    EngineUnavailable,
    InvalidCommand,
    MalformedCommand,
    Refusal,
    refusal,
)

__all__ = [
    "CONTROL_SOCKET",
    "MAX_FRAME_BYTES",
    "MAX_WAIT_PROJECTED_S",
    "AsyncControlClient",
    "Cancel",
    "Cancelling",
    "CheckPlan",
    "Command",
    "ControlError",
    "ControlUnavailable",
    "Metrics",
    "MetricsText",
    "PlanChecked",
    "Projected",
    "Rerun",
    "Signal",
    "Signalled",
    "Status",
    "Submit",
    "Submitted",
    "Tools",
    "Verify",
    "WaitProjected",
    "Waits",
    "answer_of",
    "call",
    "decode_command",
    "refusal_fields",
    "socket_path",
]

#: File name of the control socket inside the data dir.
CONTROL_SOCKET: Final = "control.sock"

#: Largest request or answer line (plans are capped well below this by the API).
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024

#: Longest a ``wait_projected`` request may wait, in seconds.
MAX_WAIT_PROJECTED_S: Final = 30.0

#: The old names: a refusal of the engine, and no engine to ask.
ControlError = Refusal
ControlUnavailable = EngineUnavailable

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

#: The ``id`` at the head of a frame (``{"id":12,...``), read without decoding the rest.
_FRAME_ID: Final = re.compile(rb'\s*\{\s*"id"\s*:\s*(\d{1,18})\s*[,}]')

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]


# -- Answers ---------------------------------------------------------------------------


class Answer(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An answer's fields (the envelope's ``id`` and ``ok`` are the channel's).

    A field with a default is left out of the line when it has it (a
    signal's ``warning``): what every answer carries has no default.
    """


class Submitted(Answer, kw_only=True):
    """A run started (or the run an idempotency key names): durable once answered."""

    run_id: str
    created: bool
    seq: int


class Cancelling(Answer, kw_only=True):
    """A cancel was requested: the run ends ``cancelled`` shortly."""

    run_id: str
    status: str


class Signalled(Answer, kw_only=True):
    """A signal's record is durable; ``warning`` when no step waits for its name."""

    run_id: str
    name: str
    seq: int
    signal_id: str
    warning: str | None = None


class Projected(Answer, kw_only=True):
    """Where the store is (``last_seq``), and whether it reached the seq asked for."""

    last_seq: int
    reached: bool
    written_seq: int | None = None


class PlanChecked(Answer, kw_only=True):
    """A plan the engine would take, and its name."""

    name: str


class MetricsText(Answer, kw_only=True):
    """The engine's registry in the Prometheus text format."""

    text: str


#: The answers with no fixed shape (an engine's status, a replay report, the tools).
FreeForm: TypeAlias = dict[str, Any]


# -- Commands -----------------------------------------------------------------------------


class _Command(msgspec.Struct, tag_field="op", kw_only=True, omit_defaults=True):
    """A request of the control channel: its ``op`` is its type.

    ``id``: the socket's request id (the answer repeats it); none through the database.
    """

    id: int | None = None
    #: The type the answer's fields decode to.
    answer: ClassVar[type[Any]] = dict
    #: The command names a run (the engine holding it answers).
    for_run: ClassVar[bool] = False


class Status(_Command, tag="status", kw_only=True):
    """The engine's status: ready, recovering, its runs, its journal."""


class Submit(_Command, tag="submit", kw_only=True):
    """Start a run of ``plan`` (or of the registered ``@workflow`` ``workflow``) with ``inputs``.

    ``key``: an idempotency key (the same key and body: the same run).
    ``run_id``: the run's id, named by the caller (through the database).
    ``schedule``: the schedule tick that submits it (``{"id", "tick"}``).
    """

    answer = Submitted
    plan: Any = None
    workflow: str | None = None
    inputs: Any = None
    key: Any = None
    run_id: str | None = None
    schedule: dict[str, Any] | None = None


class Rerun(_Command, tag="rerun", kw_only=True):
    """Run a finished run ``rerun_of`` again from ``from_step`` (default: its failed steps).

    ``inputs`` override the earlier run's; ``key`` and ``run_id`` as for :class:`Submit`.
    """

    answer = Submitted
    rerun_of: str
    from_step: str | None = None
    inputs: dict[str, Any] = msgspec.field(default_factory=dict)
    key: Any = None
    run_id: str | None = None


class Cancel(_Command, tag="cancel", kw_only=True):
    """Cancel a running run. ``live``: only the engine holding it answers (no store lookup)."""

    answer = Cancelling
    for_run = True
    run_id: str = ""
    reason: str = "cancelled"
    live: bool = False


class Signal(_Command, tag="signal", kw_only=True):
    """Journal signal ``name`` with ``payload`` for a run (``signal_id``: sent once)."""

    answer = Signalled
    for_run = True
    run_id: str = ""
    name: str
    payload: Any = None
    signal_id: str | None = None
    live: bool = False


class Verify(_Command, tag="verify", kw_only=True):
    """Replay a finished run against its journal."""

    for_run = True
    run_id: str = ""
    live: bool = False


class Export(_Command, tag="export", kw_only=True):
    """A run's export file (docs/replay.md), read from the journal, base64."""

    for_run = True
    run_id: str = ""
    live: bool = False


class Waits(_Command, tag="waits", kw_only=True):
    """The signals a running run's tasks wait for now, each with its wait's payload schema.

    Answer: ``{"run_id", "signals": [{"name", "schema"}]}``, names sorted,
    ``schema`` null for a wait that declared none. A workflow's waits are
    told to the engine as its code reaches them (``tiffany/workflows/calls.py``):
    the engine, not the store, knows their schemas.
    """

    for_run = True
    run_id: str = ""
    live: bool = False


class WaitProjected(_Command, tag="wait_projected", kw_only=True):
    """Answer once the store holds ``seq`` (``written``: all the engine has written)."""

    answer = Projected
    seq: NonNegativeInt | None = None
    wait_s: NonNegativeFloat = MAX_WAIT_PROJECTED_S
    written: bool = False
    max_seq: int | None = None


class CheckPlan(_Command, tag="check_plan", kw_only=True):
    """Check a plan (or a ``workflow``) and its inputs (a schedule's); nothing starts."""

    answer = PlanChecked
    plan: Any = None
    inputs: Any = None
    workflow: str | None = None


class Metrics(_Command, tag="metrics", kw_only=True):
    """The engine's metrics."""

    answer = MetricsText


class Tools(_Command, tag="tools", kw_only=True):
    """The engine's tools (``GET /api/tools``: the API imports no tools)."""


#: Every command of the control channel, tagged by ``op``.
Command: TypeAlias = (
    Status
    | Submit
    | Rerun
    | Cancel
    | Signal
    | Verify
    | Export
    | Waits
    | WaitProjected
    | CheckPlan
    | Metrics
    | Tools
)

_command_decoder = msgspec.json.Decoder(Command)
_MISSING: Final = re.compile(r"^Object missing required field `([^`]*)`")
_VALIDATION_AT: Final = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def _refused_field(exc: msgspec.ValidationError) -> Refusal:
    """The refusal of a command whose field msgspec refused, naming the field."""
    m = _VALIDATION_AT.match(str(exc))
    msg = m.group("msg") if m else str(exc)
    path = (m.group("path") or "").lstrip(".") if m else ""
    missing = _MISSING.match(msg)
    if missing:  # a required field not given: the field is the one missing
        path = ".".join(p for p in (path, missing.group(1)) if p)
    if path in ("", "op"):  # no object, no op, an op of no command
        what = "no such command" if path == "op" else "a request is a JSON object with an op"
        return MalformedCommand(f"{what}: {msg}")
    return InvalidCommand(f"{path}: {msg}", field=path, detail=[{"loc": path, "msg": msg}])


def decode_command(line: bytes) -> Command:
    """Decode one request line into its command.

    Raises:
        InvalidCommand: Not JSON, or a field of the wrong type or range (naming it).
        MalformedCommand: No object, no ``op``, or an ``op`` of no command.
    """
    try:
        return _command_decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise _refused_field(exc) from None
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:
        raise InvalidCommand(f"bad request line: {exc or type(exc).__name__}") from None


def command_of(fields: dict[str, Any]) -> Command:
    """The command of a request given as an object (a database row's body and op).

    Raises:
        InvalidCommand, MalformedCommand: As :func:`decode_command`.
    """
    try:
        command: Command = msgspec.convert(fields, Command)
        return command
    except msgspec.ValidationError as exc:
        raise _refused_field(exc) from None


def answer_of(command: Command, fields: dict[str, Any]) -> Any:
    """The answer's fields as ``command``'s answer type.

    Raises:
        EngineFault: The fields do not fit it (an engine of another version).
    """
    kind = command.answer
    if kind is dict:
        return fields
    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise EngineFault(f"the engine's answer to {command_name(command)}: {exc}") from None


def command_name(command: Command) -> str:
    """The ``op`` of a command."""
    return str(type(command).__struct_config__.tag)


def answer_fields(answer: Any) -> dict[str, Any]:
    """An answer (typed or free-form) as the fields of its line."""
    if isinstance(answer, dict):
        return answer
    fields: dict[str, Any] = msgspec.to_builtins(answer)
    return fields


def refusal_fields(exc: Refusal) -> dict[str, Any]:
    """A refusal as it crosses the channel: ``kind``, ``error``, ``field``, ``detail``."""
    return {"kind": exc.kind, "error": exc.message, "field": exc.field, "detail": exc.detail}


def refused(fields: dict[str, Any]) -> Refusal:
    """The refusal a channel's answer carries (see :func:`refusal_fields`)."""
    field = fields.get("field")
    return refusal(
        str(fields.get("kind") or "fault"),
        str(fields.get("error") or "engine error"),
        field if isinstance(field, str) else None,
        fields.get("detail"),
    )


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


def request_frame(rid: int, command: Command | str, fields: dict[str, Any] | None = None) -> bytes:
    """Return a request as one framed line, refusing what the engine would not read.

    ``command``: a typed command, or an ``op`` and its ``fields`` as they
    go on the wire (tests and tools that speak the channel's JSON).

    Raises:
        CommandTooLarge: A frame over :data:`MAX_FRAME_BYTES`.
        InvalidCommand: Fields that are not encodable (too deep, an integer over 64 bits...).
    """
    try:
        if isinstance(command, str):
            data = encode_frame({"id": rid, "op": command, **(fields or {})})
        else:
            # The id first, where the engine reads it from a line it cannot decode.
            body = _encode(msgspec.structs.replace(command, id=None) if command.id else command)
            data = b'{"id":%d,%s\n' % (rid, body[1:])
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        raise InvalidCommand(f"the request cannot be encoded: {exc}", detail=None) from None
    if len(data) > MAX_FRAME_BYTES:
        raise CommandTooLarge(
            f"the request is {len(data)} bytes; the control channel takes {MAX_FRAME_BYTES}"
        )
    return data


def _answer(msg: Any) -> dict[str, Any]:
    """Return an answer's fields without the envelope (``id``, ``ok``), or raise its refusal."""
    if not isinstance(msg, dict):
        raise EngineFault(f"the engine's answer is not an object: {msg!r}")
    if msg.get("ok"):
        return {k: v for k, v in msg.items() if k != "id" and k != "ok"}
    raise refused(msg)


def call(
    data_dir: str | os.PathLike[str],
    command: Command | str,
    *,
    timeout: float = 30.0,
    **fields: Any,
) -> dict[str, Any]:
    """Send one request over a fresh connection and return the answer's fields (blocking).

    ``command``: a typed command, or an ``op`` with its ``fields``.

    Raises:
        EngineUnavailable: No engine listens on the data dir's socket.
        Refusal: The engine refused the request.
    """
    path = socket_path(data_dir)
    frame = request_frame(1, command, fields)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise EngineUnavailable(f"no engine listens on {path}: {exc}", path=str(path)) from exc
        sock.sendall(frame)
        buf = bytearray()
        while b"\n" not in buf:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise EngineUnavailable(f"the engine closed {path} before answering")
            buf += chunk
            if len(buf) > MAX_FRAME_BYTES:
                raise EngineUnavailable("answer too large")
    line, _, _ = bytes(buf).partition(b"\n")
    return _answer(decode_frame(line))


class AsyncControlClient:
    """An asyncio client that pipelines requests over one connection.

    It connects on first use and reconnects after the engine restarts; a
    request in flight when the connection drops fails with
    :class:`~tiffany.errors.EngineUnavailable` (the caller answers 503; a
    resubmission with the same idempotency key is safe).
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        self.path = socket_path(data_dir)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock | None = None

    async def send(self, command: Command, *, timeout: float | None = None) -> Any:
        """Send a command and return its answer, typed as the command says (``answer``).

        Raises:
            EngineUnavailable: The engine is not reachable or did not answer in time.
            Refusal: The engine refused the command.
        """
        fields = await self._request(command, {}, command_name(command), timeout)
        return answer_of(command, fields)

    async def request(
        self, op: str, *, timeout: float | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Send a request given as its ``op`` and fields; return its answer's fields.

        Raises:
            EngineUnavailable: The engine is not reachable or did not answer in time.
            Refusal: The engine refused the request.
        """
        return await self._request(op, fields, op, timeout)

    async def _request(
        self, command: Command | str, fields: dict[str, Any], op: str, timeout: float | None
    ) -> dict[str, Any]:
        rid = next(self._ids)
        frame = request_frame(rid, command, fields)  # refused here, before the shared connection
        writer = await self._connect()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            writer.write(frame)
            await writer.drain()
            msg = await asyncio.wait_for(fut, timeout if timeout is not None else self.timeout)
        except (OSError, ConnectionError) as exc:
            self._drop(exc)
            raise EngineUnavailable(f"lost the engine on {self.path}: {exc}") from exc
        except TimeoutError as exc:
            raise EngineUnavailable(f"the engine did not answer {op!r} in time") from exc
        finally:
            self._pending.pop(rid, None)
        return _answer(msg)

    async def close(self) -> None:
        """Close the connection (pending requests fail)."""
        self._drop(EngineUnavailable("client closed"))
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
                raise EngineUnavailable(
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
                fut.set_exception(EngineUnavailable(f"lost the engine on {self.path}: {exc}"))
