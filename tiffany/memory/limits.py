"""The MemoryStore's bounds, and the checks that refuse what passes them.

Each check raises :class:`~tiffany.errors.MemoryInvalid` naming the argument
(``field``) before anything is written; docs/memory.md lists the same
bounds (a test holds them equal).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from tiffany.errors import MemoryInvalid

__all__ = [
    "DEFAULT_MAX_ITEMS",
    "KEY_MAX_CHARS",
    "K_MAX",
    "LIMIT_MAX",
    "MAX_DEPTH",
    "MODES",
    "NAMESPACE_RE",
    "OP_MAX_CHARS",
    "PROPS_MAX_BYTES",
    "QUERY_MAX_CHARS",
    "RELATION_RE",
    "RESERVED_KEYS",
    "TEXT_MAX_BYTES",
    "TTL_MAX_S",
    "VALUE_MAX_BYTES",
    "canonical_json",
    "check_depth",
    "check_id",
    "check_k",
    "check_key",
    "check_limit",
    "check_mode",
    "check_namespace",
    "check_op",
    "check_props",
    "check_query",
    "check_relation",
    "check_text",
    "check_ttl",
    "check_value",
    "derive_text",
]

#: A namespace: dots for hierarchy (``users.alice``).
NAMESPACE_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
#: A link's relation.
RELATION_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")
KEY_MAX_CHARS: Final = 256
#: Keys the HTTP routes use for themselves (``/api/memory/{ns}/search``).
RESERVED_KEYS: Final = frozenset({"search"})
#: A value's canonical JSON (UTF-8), and an item's indexed text.
VALUE_MAX_BYTES: Final = 64 * 1024
TEXT_MAX_BYTES: Final = 32 * 1024
PROPS_MAX_BYTES: Final = 4 * 1024
OP_MAX_CHARS: Final = 512
#: A run or step id an item records.
ID_MAX_CHARS: Final = 200
QUERY_MAX_CHARS: Final = 4096
K_MAX: Final = 100
MAX_DEPTH: Final = 3
LIMIT_MAX: Final = 1000
#: Ten years: a longer time-to-live is a mistake, not a wish.
TTL_MAX_S: Final = 10 * 365 * 86_400.0
DEFAULT_MAX_ITEMS: Final = 100_000
MODES: Final = ("hybrid", "text", "vector")


def _refuse(field: str, message: str) -> MemoryInvalid:
    return MemoryInvalid(message, field=field, detail=[{"loc": field, "msg": message}])


def check_namespace(namespace: Any, field: str = "namespace") -> str:
    """Return ``namespace`` if it is a valid namespace, else refuse naming ``field``."""
    if not isinstance(namespace, str) or NAMESPACE_RE.fullmatch(namespace) is None:
        raise _refuse(
            field,
            f"{field} must match {NAMESPACE_RE.pattern} (letters, digits, '._:@-', "
            f"at most 128 characters), not {namespace!r:.80}",
        )
    return namespace


def check_key(key: Any, field: str = "key") -> str:
    """Return ``key`` if it is a valid key, else refuse naming ``field``."""
    if not isinstance(key, str) or not 1 <= len(key) <= KEY_MAX_CHARS:
        raise _refuse(field, f"{field} must be a string of 1..{KEY_MAX_CHARS} characters")
    if not key.isprintable() or key != key.strip():
        raise _refuse(
            field, f"{field} must be printable, without leading or trailing space: {key!r:.80}"
        )
    if key in RESERVED_KEYS:
        raise _refuse(field, f"{field} {key!r} is reserved")
    return key


def check_relation(relation: Any, field: str = "relation") -> str:
    """Return ``relation`` if valid, else refuse naming ``field``."""
    if not isinstance(relation, str) or RELATION_RE.fullmatch(relation) is None:
        raise _refuse(field, f"{field} must match {RELATION_RE.pattern}, not {relation!r:.80}")
    return relation


def canonical_json(value: Any, field: str = "value") -> str:
    """The canonical JSON text of ``value`` (sorted keys, no spaces); refuse what is not JSON.

    Strict: what would not come back equal from the JSON (a tuple, a
    non-string key, NaN, an object) is refused, not coerced.
    """
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise _refuse(field, f"{field} is not JSON: {exc}") from None
    if json.loads(text) != value:
        raise _refuse(field, f"{field} is not plain JSON (tuples, non-string keys...)")
    return text


def check_value(value: Any) -> str:
    """Return the canonical JSON of ``value``; refuse a non-JSON or too large value."""
    text = canonical_json(value)
    size = len(text.encode("utf-8"))
    if size > VALUE_MAX_BYTES:
        raise _refuse("value", f"value is {size} bytes of JSON, over {VALUE_MAX_BYTES}")
    return text


def check_text(text: Any) -> str:
    """Return ``text`` if it is a string within its bound, else refuse."""
    if not isinstance(text, str):
        raise _refuse("text", "text must be a string")
    size = len(text.encode("utf-8"))
    if size > TEXT_MAX_BYTES:
        raise _refuse("text", f"text is {size} bytes, over {TEXT_MAX_BYTES}")
    return text


def _leaves(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k in sorted(value):
            _leaves(value[k], out)
    elif isinstance(value, list):
        for v in value:
            _leaves(v, out)


def derive_text(value: Any) -> str:
    """The text indexed for ``value`` when a put gives none.

    A string is itself; a dict or list, its string leaves (keys sorted)
    joined with newlines; anything else, nothing. Cut to the text bound at a
    character boundary.
    """
    parts: list[str] = []
    _leaves(value, parts)
    text = "\n".join(parts)
    raw = text.encode("utf-8")
    if len(raw) > TEXT_MAX_BYTES:
        text = raw[:TEXT_MAX_BYTES].decode("utf-8", errors="ignore")
    return text


def check_op(op: Any) -> str:
    """Return ``op`` if it is a printable string of 1..512 characters, else refuse."""
    if not isinstance(op, str) or not 1 <= len(op) <= OP_MAX_CHARS or not op.isprintable():
        raise _refuse("op", f"op must be a printable string of 1..{OP_MAX_CHARS} characters")
    return op


def check_id(value: Any, field: str) -> str | None:
    """Return a run or step id (or None) if printable and within its bound, else refuse."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= ID_MAX_CHARS or not value.isprintable():
        raise _refuse(field, f"{field} must be a printable string of 1..{ID_MAX_CHARS} characters")
    return value


def check_ttl(ttl_s: Any) -> float | None:
    """Return ``ttl_s`` (seconds, or None for no expiry) if within (0, ten years], else refuse."""
    if ttl_s is None:
        return None
    if (
        isinstance(ttl_s, bool)
        or not isinstance(ttl_s, int | float)
        or not math.isfinite(ttl_s)
        or not 0 < ttl_s <= TTL_MAX_S
    ):
        raise _refuse("ttl_s", f"ttl_s must be a number of seconds within (0, {TTL_MAX_S:.0f}]")
    return float(ttl_s)


def check_props(props: Any) -> str | None:
    """Return the canonical JSON of a link's ``props`` (an object, or None), else refuse."""
    if props is None:
        return None
    if not isinstance(props, dict):
        raise _refuse("props", "props must be a JSON object")
    text = canonical_json(props, "props")
    if len(text.encode("utf-8")) > PROPS_MAX_BYTES:
        raise _refuse("props", f"props is over {PROPS_MAX_BYTES} bytes of JSON")
    return text


def check_query(query: Any) -> str:
    """Return ``query`` if it is a non-empty string within its bound, else refuse."""
    if not isinstance(query, str) or not query.strip():
        raise _refuse("query", "query must be a non-empty string")
    if len(query) > QUERY_MAX_CHARS:
        raise _refuse("query", f"query is over {QUERY_MAX_CHARS} characters")
    return query


def _int_within(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _refuse(field, f"{field} must be an integer within {low}..{high}")
    return value


def check_k(k: Any) -> int:
    """Return ``k`` if within 1..100, else refuse."""
    return _int_within(k, "k", 1, K_MAX)


def check_depth(depth: Any) -> int:
    """Return ``depth`` if within 1..3, else refuse."""
    return _int_within(depth, "depth", 1, MAX_DEPTH)


def check_limit(limit: Any) -> int:
    """Return ``limit`` if within 1..1000, else refuse."""
    return _int_within(limit, "limit", 1, LIMIT_MAX)


def check_mode(mode: Any) -> str:
    """Return ``mode`` if it is one of ``hybrid``, ``text``, ``vector``, else refuse."""
    if mode not in MODES:
        raise _refuse("mode", f"mode must be one of {', '.join(MODES)}, not {mode!r:.40}")
    return str(mode)
