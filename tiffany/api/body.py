"""The body of ``POST /api/runs``: read under a size cap, parse JSON or YAML.

The size cap is enforced before anything is buffered: a declared
``Content-Length`` over the cap is refused at once (the body is never
read), and a chunked body is counted while it streams and refused as soon
as it crosses the cap.

Accepted shapes (after parsing)::

    {"plan": {...} | "<JSON or YAML text>", "inputs": {...}}   # the envelope
    {"name": ..., "steps": [...], ...}                         # a bare plan

A bare plan carries its own default ``inputs`` (a plan field); the envelope's
``inputs`` are the caller's and the engine merges them over the plan's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import yaml

from tiffany.errors import TiffanyError

__all__ = [
    "YAML_MEDIA_TYPES",
    "BodyTooLarge",
    "InvalidBody",
    "Submission",
    "parse_submission",
    "read_capped",
]

#: Content types read as YAML (anything else is read as JSON).
YAML_MEDIA_TYPES: Final = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"}
)


#: libyaml's safe loader when PyYAML was built with it (10x faster), else PyYAML's.
_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class BodyTooLarge(TiffanyError):
    """The request body is larger than ``max_plan_bytes`` (HTTP 413)."""

    code = "request.too_large"


class InvalidBody(TiffanyError):
    """The body is not a readable submission (HTTP 422).

    Attributes:
        detail: ``[{"loc": [...], "msg": ...}]``, as FastAPI reports validation errors.
    """

    code = "request.invalid"

    def __init__(self, loc: list[str | int], msg: str, **fields: Any) -> None:
        super().__init__(msg, **fields)
        self.detail = [{"loc": loc, "msg": msg, **fields}]


@dataclass(frozen=True, slots=True)
class Submission:
    """A parsed submission: the plan object and the caller's inputs."""

    plan: dict[str, Any]
    inputs: dict[str, Any]


async def read_capped(
    content_length: str | None, chunks: AsyncIterator[bytes], max_bytes: int
) -> bytes:
    """Return the body, refusing it before buffering when it exceeds ``max_bytes``.

    Args:
        content_length: The ``Content-Length`` header (None for a chunked body).
        chunks: The body as it streams (``request.stream()``); not touched
            when the declared length is already too large.
        max_bytes: The cap.

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
                f"the body is {declared} bytes; the limit is {max_bytes}",
                limit_bytes=max_bytes,
                size_bytes=declared,
            )
    buf = bytearray()
    async for chunk in chunks:
        buf += chunk
        if len(buf) > max_bytes:
            raise BodyTooLarge(
                f"the body is over the limit of {max_bytes} bytes",
                limit_bytes=max_bytes,
            )
    return bytes(buf)


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _byte_offset(text: str, index: int) -> int:
    """Return the UTF-8 byte offset of character ``index`` (parsers count characters)."""
    return len(text[:index].encode("utf-8"))


def _load_json(text: str, loc: list[str | int]) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        offset = _byte_offset(text, exc.pos)
        raise InvalidBody(
            loc,
            f"malformed JSON at byte {offset} (line {exc.lineno}, column {exc.colno}): {exc.msg}",
            offset=offset,
            line=exc.lineno,
            column=exc.colno,
        ) from None


def _load_yaml(text: str, loc: list[str | int]) -> Any:
    try:
        return yaml.load(text, Loader=_YamlLoader)  # a safe loader (C or Python)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is None:
            raise InvalidBody(loc, f"malformed YAML: {problem}") from None
        offset = _byte_offset(text, mark.index)
        raise InvalidBody(
            loc,
            f"malformed YAML at line {mark.line + 1}, column {mark.column + 1}"
            f" (byte {offset}): {problem}",
            offset=offset,
            line=mark.line + 1,
            column=mark.column + 1,
        ) from None
    except yaml.YAMLError as exc:
        raise InvalidBody(loc, f"malformed YAML: {exc}") from None


def _load_text(text: str, loc: list[str | int]) -> Any:
    """Parse a plan given as text: JSON when it looks like JSON, YAML otherwise."""
    if text.lstrip().startswith(("{", "[")):
        return _load_json(text, loc)
    return _load_yaml(text, loc)


def parse_submission(body: bytes, content_type: str | None) -> Submission:
    """Parse a ``POST /api/runs`` body (JSON or YAML) into a :class:`Submission`.

    Raises:
        InvalidBody: Malformed JSON/YAML (naming the position), or a shape
            that is neither the envelope nor a bare plan (naming the field).
    """
    if not body.strip():
        raise InvalidBody(["body"], "the body is empty; send a plan")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBody(
            ["body"], f"the body is not UTF-8 (byte {exc.start})", offset=exc.start
        ) from None
    if _media_type(content_type) in YAML_MEDIA_TYPES:
        doc = _load_yaml(text, ["body"])
    else:
        doc = _load_json(text, ["body"])
    if not isinstance(doc, dict):
        raise InvalidBody(["body"], f"expected an object, got {type(doc).__name__}")

    if "plan" in doc:
        plan = doc["plan"]
        if isinstance(plan, str):
            plan = _load_text(plan, ["body", "plan"])
        if not isinstance(plan, dict):
            raise InvalidBody(["body", "plan"], "the plan must be an object or a JSON/YAML text")
        inputs = doc.get("inputs")
        extra = sorted(set(doc) - {"plan", "inputs"})
        if extra:
            raise InvalidBody(["body", extra[0]], f"unknown field {extra[0]!r} beside the plan")
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
