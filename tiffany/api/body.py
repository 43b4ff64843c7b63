"""Request bodies: read under a size cap, parse JSON or YAML with limits.

Every route that takes a body (``POST /api/runs``, ``/api/schedules``, a
run's ``rerun`` and ``signals``) reads it here, and no route declares a
body model FastAPI would read for it (whole, with no cap, and answer a
non-UTF-8 or deep body with an undocumented 400): the answers are the same
everywhere, 413 naming the size setting, 422 naming the byte or the path.

The size cap is enforced before anything is buffered: a declared
``Content-Length`` over the cap is refused at once (the body is never
read), and a chunked body is counted while it streams and refused as soon
as it crosses the cap. The refusal names the setting of the cap.

Accepted shapes (after parsing)::

    {"plan": {...} | "<JSON or YAML text>", "inputs": {...}}   # the envelope
    {"name": ..., "steps": [...], ...}                         # a bare plan

A bare plan carries its own default ``inputs`` (a plan field); the envelope's
``inputs`` are the caller's and the engine merges them over the plan's.

Parsing is bounded (:mod:`tiffany.wire.documents`: depth, values with YAML
aliases expanded, integer and float range, string length, valid Unicode,
no NUL): a refused body answers 422 naming the path of the value at fault.

Discussion:
    Tiny JSON bodies (up to :data:`INLINE_BODY_BYTES`: a typical
    submission, a few hundred bytes) are parsed on the event loop: a
    fraction of a millisecond, less than the hand-over to a thread and back
    costs, and a thread would hold the GIL for the same parse anyway
    (``bench/api.py``: under load the API's thread hops were a large share
    of its loop's time). Other small bodies (up to :data:`BIG_BODY_BYTES`, and
    YAML, whose parser is several times slower) are parsed in a worker
    thread: a millisecond, interleaved with the loop by the GIL's switch
    interval. Bigger ones go to a worker *process*
    (:data:`PARSE_WORKERS`, started by forkserver on first use, its address
    space capped at :data:`WORKER_MEMORY_BYTES`): a thread parsing a large
    YAML body holds the GIL for the whole parse, and ``bench/hostile.py``
    showed the loop starving behind it (normal submissions several times
    slower beside hostile clients with parse threads, about half as much
    with the worker process). In a
    process the parse costs the API no GIL time and no memory but the
    bytes sent and the checked tree pickled back (bounded by the document
    limits); hostile bodies queue behind one another, not
    in front of small ones. A worker that dies (the memory cap) costs its
    request a 422 and the pool is started again.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.to_thread

from tiffany.errors import TiffanyError
from tiffany.wire.documents import (
    YAML_MEDIA_TYPES,
    DocumentError,
    Limits,
    Loc,
    did_you_mean,
    load,
    load_reply,
    load_text,
)

__all__ = [
    "YAML_MEDIA_TYPES",
    "BodyTooLarge",
    "InvalidBody",
    "Submission",
    "parse_document_off_loop",
    "parse_json_off_loop",
    "parse_off_loop",
    "parse_submission",
    "read_capped",
]

#: JSON bodies up to this size are parsed on the event loop (see the Discussion above).
INLINE_BODY_BYTES: Final = 4 * 1024
#: Bodies larger than this are parsed one at a time (see the Discussion above).
BIG_BODY_BYTES: Final = 64 * 1024

#: Worker processes parsing big bodies (one: a parse is tens of milliseconds at most).
PARSE_WORKERS: Final = 1

#: Address-space cap of a parse worker, in bytes.
WORKER_MEMORY_BYTES: Final = 1 << 30

#: The limits of a submitted document (depth, values, numbers, strings).
LIMITS: Final = Limits()


class BodyTooLarge(TiffanyError):
    """The request body is larger than ``max_plan_bytes`` (HTTP 413)."""

    code = "request.too_large"


class InvalidBody(DocumentError):
    """The body is not a readable submission (HTTP 422).

    Attributes:
        detail: ``[{"loc": [...], "msg": ...}]``, as FastAPI reports validation errors.
    """

    code = "request.invalid"


@dataclass(frozen=True, slots=True)
class Submission:
    """A parsed submission: the plan object and the caller's inputs."""

    plan: dict[str, Any]
    inputs: dict[str, Any]
    #: A workflow's name (``{"workflow": NAME, "inputs": ...}``); then ``plan`` is empty.
    workflow: str | None = None


async def read_capped(
    content_length: str | None,
    chunks: AsyncIterator[bytes],
    max_bytes: int,
    setting: str = "TIFFANY_MAX_PLAN_BYTES",
) -> bytes:
    """Return the body, refusing it before buffering when it exceeds ``max_bytes``.

    Args:
        content_length: The ``Content-Length`` header (None for a chunked body).
        chunks: The body as it streams (``request.stream()``); not touched
            when the declared length is already too large.
        max_bytes: The cap.
        setting: The environment variable that sets the cap (named in the 413).

    Raises:
        BodyTooLarge: Declared or streamed size over the cap.
        InvalidBody: A ``Content-Length`` that is not a number.
    """
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            msg = "Content-Length is not a number"
            raise InvalidBody(["header", "content-length"], msg) from None
        if declared > max_bytes:
            raise BodyTooLarge(
                f"the body is {declared} bytes; the limit is {max_bytes} ({setting})",
                limit_bytes=max_bytes,
                size_bytes=declared,
                setting=setting,
            )
    buf = bytearray()
    async for chunk in chunks:
        buf += chunk
        if len(buf) > max_bytes:
            raise BodyTooLarge(
                f"the body is over the limit of {max_bytes} bytes ({setting})",
                limit_bytes=max_bytes,
                setting=setting,
            )
    return bytes(buf)


_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _limit_worker() -> None:
    """Initializer of a parse worker: cap its address space (a runaway parse dies alone)."""
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))


def _parse_pool() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            ctx = multiprocessing.get_context("forkserver")
            _pool = ProcessPoolExecutor(PARSE_WORKERS, mp_context=ctx, initializer=_limit_worker)
        return _pool


def _reset_pool(broken: ProcessPoolExecutor) -> None:
    global _pool
    with _pool_lock:
        if _pool is broken:
            _pool = None
    broken.shutdown(wait=False, cancel_futures=True)


async def parse_off_loop(body: bytes, content_type: str | None) -> Submission:
    """Parse a submission off the event loop (see the Discussion above).

    Tiny JSON bodies: :func:`parse_submission` on the loop; other small
    bodies: in a worker thread. Bodies over :data:`BIG_BODY_BYTES`: parsed in
    a worker process, its reply shaped here.
    """
    if len(body) <= INLINE_BODY_BYTES and not _is_yaml(content_type):
        return parse_submission(body, content_type)
    if len(body) <= BIG_BODY_BYTES:
        return await anyio.to_thread.run_sync(parse_submission, body, content_type)
    if not body.strip():
        raise InvalidBody(["body"], "the body is empty; send a plan")
    return _shape(await _parse_in_worker(body, content_type, ["body"], ("plan",)))


async def parse_document_off_loop(body: bytes, content_type: str | None, loc: Loc) -> Any:
    """Parse a body of any shape (JSON, or YAML by its type) under the limits; empty is None.

    Where :func:`parse_off_loop` would: tiny JSON bodies on the loop, small
    ones in a worker thread, bigger ones in the worker process.
    """
    if not body.strip():
        return None
    if len(body) <= INLINE_BODY_BYTES and not _is_yaml(content_type):
        return _load(body, content_type, loc)
    if len(body) <= BIG_BODY_BYTES:
        return await anyio.to_thread.run_sync(_load, body, content_type, loc)
    return await _parse_in_worker(body, content_type, loc, ())


async def parse_json_off_loop(body: bytes, loc: Loc) -> Any:
    """Parse a JSON body of any shape (a signal's payload) under the limits; empty is null.

    :func:`parse_document_off_loop` whatever the ``Content-Type`` says (its
    size is capped by the caller: a signal's at ``max_signal_bytes``).
    """
    return await parse_document_off_loop(body, "application/json", loc)


def _load(body: bytes, content_type: str | None, loc: Loc) -> Any:
    try:
        return load(body, content_type, LIMITS, loc)
    except DocumentError as exc:
        raise InvalidBody(exc.loc, exc.msg, **exc.fields) from None


async def _parse_in_worker(
    body: bytes, content_type: str | None, loc: Loc, keys: tuple[str, ...]
) -> Any:
    """:func:`~tiffany.wire.documents.load_reply` in the worker process; its error raised here."""
    pool = _parse_pool()
    loop = asyncio.get_running_loop()
    try:
        reply = await loop.run_in_executor(
            pool, load_reply, body, content_type, LIMITS, list(loc), keys
        )
    except BrokenProcessPool:
        _reset_pool(pool)
        raise InvalidBody(list(loc), "the body could not be parsed within the limits") from None
    if reply[0] == "error":
        _, where, msg, fields = reply
        raise InvalidBody(where, msg, **fields)
    return reply[1]


def _is_yaml(content_type: str | None) -> bool:
    """True if ``content_type`` names YAML (as :func:`tiffany.wire.documents.load` tests it)."""
    return (content_type or "").split(";", 1)[0].strip().lower() in YAML_MEDIA_TYPES


def _load_text(text: str, loc: Loc) -> Any:
    """Parse a plan given as text: JSON when it looks like JSON, YAML otherwise."""
    return load_text(text, not text.lstrip().startswith(("{", "[")), LIMITS, loc)


def parse_submission(body: bytes, content_type: str | None) -> Submission:
    """Parse a ``POST /api/runs`` body (JSON or YAML) into a :class:`Submission`.

    Raises:
        InvalidBody: Malformed JSON/YAML (naming the position), or a shape
            that is neither the envelope nor a bare plan (naming the field).
    """
    if not body.strip():
        raise InvalidBody(["body"], "the body is empty; send a plan")
    try:
        return _parse(body, content_type)
    except InvalidBody:
        raise
    except DocumentError as exc:
        raise InvalidBody(exc.loc, exc.msg, **exc.fields) from None


def _parse(body: bytes, content_type: str | None) -> Submission:
    return _shape(load(body, content_type, LIMITS, ["body"]))


def _shape(doc: Any) -> Submission:
    """Return the submission a parsed body holds (the envelope or a bare plan)."""
    if not isinstance(doc, dict):
        raise InvalidBody(["body"], f"expected an object, got {type(doc).__name__}")

    if "workflow" in doc and "plan" not in doc:
        name = doc["workflow"]
        if not isinstance(name, str) or not name:
            raise InvalidBody(["body", "workflow"], "the workflow must be its registered name")
        extra = sorted(set(doc) - {"workflow", "inputs"})
        if extra:
            hint = did_you_mean(extra[0], ("workflow", "inputs"))
            raise InvalidBody(
                ["body", extra[0]], f"unknown field {extra[0]!r} beside the workflow{hint}"
            )
        inputs = doc.get("inputs")
        if inputs is None:
            inputs = {}
        if not isinstance(inputs, dict):
            raise InvalidBody(["body", "inputs"], "inputs must be an object")
        return Submission(plan={}, inputs=inputs, workflow=name)
    if "plan" in doc:
        plan = doc["plan"]
        if isinstance(plan, str):
            plan = _load_text(plan, ["body", "plan"])
        if not isinstance(plan, dict):
            raise InvalidBody(["body", "plan"], "the plan must be an object or a JSON/YAML text")
        inputs = doc.get("inputs")
        extra = sorted(set(doc) - {"plan", "inputs"})
        if extra:
            hint = did_you_mean(extra[0], ("plan", "inputs"))
            raise InvalidBody(
                ["body", extra[0]], f"unknown field {extra[0]!r} beside the plan{hint}"
            )
    elif "steps" in doc:
        plan, inputs = doc, None
    else:
        raise InvalidBody(
            ["body", "plan"],
            'field required: send {"plan": ..., "inputs": {...}} or a plan with "steps"',
        )
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        raise InvalidBody(["body", "inputs"], "inputs must be an object")
    return Submission(plan=plan, inputs=inputs)
