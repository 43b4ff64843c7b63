r"""Bounded documents: parse JSON and YAML request bodies, and check value trees.

Every document a client sends (a ``POST /api/runs`` body, a plan given as
text inside it, a ``submit`` over the control socket) passes through here
before anything else looks at it. :func:`load` parses bytes into plain
values; :func:`check` walks a value tree and refuses what Tiffany cannot
store or journal. Both raise :class:`DocumentError` naming the path of the
value at fault (``["body", "plan", "steps", 0, "args", "x"]``) and, where
the parser gives one, the byte offset.

Invariants (each a :class:`Limits` field):

* nesting depth at most ``max_depth`` (containers; the root is depth 1),
  of the value as built: a YAML merge key's mappings are merged into the
  mapping that holds it and add no level, so a chain of merges (``b``
  merges ``a``, ``c`` merges ``b``...) is judged by its expanded size, not
  refused as nesting; an error under a merge key names it ``<<``;
* at most ``max_nodes`` values (every scalar, key and container), counted
  with YAML aliases and merge keys EXPANDED, as the value will be encoded;
* at most ``max_string_chars`` characters in one string and
  ``max_total_chars`` in all strings and keys together (expanded);
* integers fit in signed 64 bits (the WAL's msgpack and SQL columns); a
  literal with more digits than any such integer is refused without ever
  calling ``int()`` on it (Python's 4,300-digit limit never surfaces);
* floats are finite (JSON ``NaN``/``Infinity``, YAML ``.nan``/``.inf`` and
  overflowing literals such as ``1e400`` are refused);
* mapping keys are strings (YAML ``yes:``, ``1:``, ``? [a]`` are refused)
  and differ within a mapping (a key given twice is refused, naming it and,
  in YAML, its line: the parsers would keep the last one silently, and a
  plan with a misspelt line would run something other than what it says);
* strings are valid Unicode (no lone surrogate such as JSON ``"\\ud800"``)
  and hold no NUL character (PostgreSQL cannot store one);
* only null, bool, int, float, str, list and dict (str-keyed) occur.

Nothing here recurses: a document nested a million deep costs a scan, not a
``RecursionError``.

Discussion:
    JSON: :func:`json.loads` is a recursive C parser, so the text is first
    scanned, in C loops only (strings blanked by one regex substitution,
    then counts of commas, colons and brackets, and a running sum of the
    brackets for the depth): refused past ``max_depth`` or ``max_nodes``
    before the parser sees it (cheap next to parsing), the parser then runs on at
    most ``max_depth`` levels and ``max_nodes`` values.
    ``parse_int`` keeps long integer literals as :class:`_BigInt` markers
    (so :func:`check` can name their path) and ``parse_constant`` lets
    ``NaN`` through to be refused with its path too. Rejected: msgspec's
    decoder (fast, with its own depth guard) reports a lone surrogate as
    "Input data was truncated" with no position and decodes 30-digit
    integers as Python ints; hand-writing an iterative JSON parser in
    Python is an order of magnitude slower than the scan plus the C parser.
    A ``str.translate`` table for the bracket scan was rejected too: a
    table of every code point is too large to hold in every process.

    YAML: PyYAML's composer and constructor recurse, and its constructor
    materializes aliases (the billion-laughs body that drove the API to
    10 GB). Here the value is built from libyaml's parser *events*
    (:func:`yaml.parse`, a state machine without recursion) with an
    explicit stack. An alias adds its anchor's memoized expanded size and
    height to the budget and shares the built value instead of copying it,
    so a nine-level alias bomb is refused after a few hundred events,
    without materializing anything. Scalars are resolved and constructed
    with PyYAML's own safe resolver and constructor (the same types as
    ``yaml.safe_load``), timestamps kept as their text.

    :func:`check` walks the tree with an explicit stack and a node budget,
    so a shared (aliased) subtree is checked as often as it will be encoded
    and the walk stops at the budget: it cannot be made to loop long.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import yaml

from tiffany.errors import TiffanyError

__all__ = [
    "DEFAULT_LIMITS",
    "SIGNAL_NAME_PATTERN",
    "YAML_MEDIA_TYPES",
    "DocumentError",
    "Limits",
    "check",
    "did_you_mean",
    "load",
    "load_reply",
    "load_text",
]

#: What a signal's name may be (``signal.wait``'s ``name``; it travels in a URL path).
SIGNAL_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"

#: How close a misspelt name must be to a known one to be suggested (difflib ratio).
SUGGEST_CUTOFF: Final = 0.6

#: Content types read as YAML (anything else is read as JSON).
YAML_MEDIA_TYPES: Final = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"}
)

#: Smallest and largest integer Tiffany stores (signed 64 bits).
INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**63 - 1
#: Longest integer literal converted with ``int()`` (any int64 has at most 20 characters).
_INT_LITERAL_MAX: Final = 24

Loc = list[str | int]


@dataclass(frozen=True, slots=True)
class Limits:
    """What one document may hold.

    Attributes:
        max_depth: Deepest nesting of lists and mappings (the root is 1).
        max_nodes: Most values (scalars, keys, containers), aliases expanded
            (a plan of the most steps, 10,000, holds about 130,000).
        max_string_chars: Longest string (or key), in characters.
        max_total_chars: Most characters in all strings and keys, aliases expanded.
    """

    max_depth: int = 64
    max_nodes: int = 250_000
    max_string_chars: int = 1_048_576
    max_total_chars: int = 4_194_304


#: The limits used unless a caller passes its own.
DEFAULT_LIMITS: Final = Limits()


class DocumentError(TiffanyError):
    """A document is malformed or over a limit (HTTP 422).

    Attributes:
        loc: Path of the value at fault (``["body", "plan", "steps", 0]``).
        msg: What is wrong there.
        detail: ``[{"loc": loc, "msg": msg, ...}]`` (FastAPI's shape).
    """

    code = "request.invalid"

    def __init__(self, loc: Loc, msg: str, **fields: Any) -> None:
        where = ".".join(str(p) for p in loc)
        super().__init__(f"{where}: {msg}" if where else msg, **fields)
        self.loc = loc
        self.msg = msg
        self.detail = [{"loc": loc, "msg": msg, **fields}]


class _BigInt:
    """An integer literal too long to be an int64 (kept as text, refused by :func:`check`)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _parse_int(text: str) -> int | _BigInt:
    return int(text) if len(text) <= _INT_LITERAL_MAX else _BigInt(text)


class _Duplicate:
    """A JSON object that gives a key twice (kept in its place, refused by :func:`check`)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Duplicate:
    """``object_pairs_hook``: the object as a dict, or a :class:`_Duplicate` naming its key."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Duplicate(key)
        seen.add(key)
    return obj  # pragma: no cover - a shorter dict has a repeated key


def _byte_offset(text: str, index: int) -> int:
    """Return the UTF-8 byte offset of character ``index`` (parsers count characters)."""
    return len(text[:index].encode("utf-8", "surrogatepass"))


# -- check ------------------------------------------------------------------------------------


class _Path:
    """A path built lazily: a parent link and a key, materialized only for an error."""

    __slots__ = ("key", "parent")

    def __init__(self, parent: _Path | None, key: str | int) -> None:
        self.parent = parent
        self.key = key

    def loc(self, base: Loc) -> Loc:
        parts: list[str | int] = []
        node: _Path | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        return [*base, *reversed(parts)]


def _at(base: Loc, path: _Path | None) -> Loc:
    return path.loc(base) if path is not None else list(base)


def _string_problem(s: str, limit: int) -> str | None:
    if len(s) > limit:
        return f"string of {len(s)} characters; the limit is {limit}"
    if "\x00" in s:
        return f"NUL character at index {s.index(chr(0))} (not storable)"
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"lone surrogate {s[exc.start]!r} at index {exc.start} (not valid Unicode)"
    return None


def check(value: Any, limits: Limits = DEFAULT_LIMITS, loc: Loc | None = None) -> None:
    """Check a parsed value tree against ``limits`` (iteratively; see the module docstring).

    Args:
        value: The tree (dicts, lists, scalars), possibly with shared subtrees.
        limits: The limits.
        loc: Path prefix of error locations (``["body"]``).

    Raises:
        DocumentError: The first problem found, naming its path.
    """
    base: Loc = list(loc or [])
    nodes = 0
    chars = 0
    stack: list[tuple[Any, _Path | None, int]] = [(value, None, 1)]
    while stack:
        v, path, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise DocumentError(
                _at(base, path), f"more than {limits.max_nodes} values in the document"
            )
        if v is None or v is True or v is False:
            continue
        t = type(v)
        if t is str:
            chars += len(v)
            problem = _string_problem(v, limits.max_string_chars)
            if problem is None and chars > limits.max_total_chars:
                problem = f"more than {limits.max_total_chars} characters of strings in all"
            if problem is not None:
                raise DocumentError(_at(base, path), problem)
        elif t is int:
            if not INT_MIN <= v <= INT_MAX:
                raise DocumentError(_at(base, path), "integer out of the signed 64-bit range")
        elif t is float:
            if not math.isfinite(v):
                raise DocumentError(_at(base, path), f"{v} is not allowed (numbers are finite)")
        elif t is dict:
            if depth > limits.max_depth:
                raise DocumentError(_at(base, path), f"nested deeper than {limits.max_depth}")
            for k, item in v.items():
                if type(k) is not str:
                    raise DocumentError(
                        _at(base, path),
                        f"key {_show(k)} is a {_kind(k)}; keys must be strings",
                    )
                nodes += 1
                chars += len(k)
                problem = _string_problem(k, limits.max_string_chars)
                if problem is not None:
                    raise DocumentError(_at(base, path), f"key {_show(k)}: {problem}")
                stack.append((item, _Path(path, k), depth + 1))
        elif t is list:
            if depth > limits.max_depth:
                raise DocumentError(_at(base, path), f"nested deeper than {limits.max_depth}")
            for i in range(len(v) - 1, -1, -1):
                stack.append((v[i], _Path(path, i), depth + 1))
        elif t is _Duplicate:
            raise DocumentError(_at(base, _Path(path, v.key)), _DUPLICATE)
        elif t is _BigInt:
            raise DocumentError(
                _at(base, path),
                f"integer of {len(v.text.lstrip('+-'))} digits is out of the signed 64-bit range",
            )
        else:
            raise DocumentError(_at(base, path), f"a {_kind(v)} is not a JSON value")
        if nodes > limits.max_nodes:
            raise DocumentError(
                _at(base, path), f"more than {limits.max_nodes} values in the document"
            )


#: What a key given twice in one mapping is told.
_DUPLICATE: Final = "key given twice in the same mapping (remove one: the last would win)"


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | _BigInt):
        return "number"
    if isinstance(v, float):
        return "number"
    if isinstance(v, list | tuple):
        return "list"
    if isinstance(v, dict):
        return "mapping"
    return type(v).__name__


def _show(k: Any) -> str:
    if isinstance(k, str):
        return repr(k[:40].encode("utf-8", "backslashreplace").decode("ascii", "replace"))
    if isinstance(k, dict | list | tuple):
        return f"<{_kind(k)}>"
    return repr(k)[:40]


# -- JSON -------------------------------------------------------------------------------------

#: A JSON string, escapes included (unrolled: no per-character backtracking state).
_JSON_STRING: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Depth steps of the brackets outside strings.
_DEPTH_STEP: Final = {"[": 1, "{": 1, "]": -1, "}": -1}
#: Everything but brackets (removed to leave the bracket sequence).
_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]+")


def _scan_json(text: str, limits: Limits, loc: Loc) -> None:
    """Refuse JSON nested past ``max_depth`` or holding more than ``max_nodes`` values.

    Iterative and linear, all in C loops: strings are blanked by one regex
    substitution; values are bounded by the commas, colons and brackets left
    (each value but a container's first follows a comma; each key a colon),
    and the depth is the running sum of the brackets.
    """
    blank = _JSON_STRING.sub('""', text)
    opened = blank.count("[") + blank.count("{")
    if opened > limits.max_depth:
        brackets = _NOT_BRACKET.sub("", blank)
        steps = map(_DEPTH_STEP.__getitem__, brackets)
        for i, depth in enumerate(itertools.accumulate(steps)):
            if depth > limits.max_depth:
                offset = _byte_offset(text, _nth_bracket(text, i))
                raise DocumentError(
                    loc, f"nested deeper than {limits.max_depth} (byte {offset})", offset=offset
                )
    values = opened + blank.count(",") + blank.count(":")
    if values > limits.max_nodes:
        raise DocumentError(loc, f"more than {limits.max_nodes} values in the document")


def _nth_bracket(text: str, n: int) -> int:
    """Return the index in ``text`` of the ``n``-th bracket outside strings (for an offset)."""
    seen = -1
    for m in re.finditer(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', text):
        if text[m.start()] != '"':
            seen += 1
            if seen == n:
                return m.start()
    return 0


def _load_json(text: str, limits: Limits, loc: Loc) -> Any:
    _scan_json(text, limits, loc)
    try:
        return json.loads(
            text, parse_int=_parse_int, parse_constant=float, object_pairs_hook=_json_object
        )
    except json.JSONDecodeError as exc:
        offset = _byte_offset(text, exc.pos)
        raise DocumentError(
            loc,
            f"malformed JSON at byte {offset} (line {exc.lineno}, column {exc.colno}): {exc.msg}",
            offset=offset,
            line=exc.lineno,
            column=exc.colno,
        ) from None
    except RecursionError:  # pragma: no cover - the scan bounds the depth first
        raise DocumentError(loc, f"nested deeper than {limits.max_depth}") from None


# -- YAML -------------------------------------------------------------------------------------

_Parser: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_RESOLVER: Final = yaml.resolver.Resolver()
_CONSTRUCTOR: Final = yaml.constructor.SafeConstructor()

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS: Final = {f"{_TAG}{t}" for t in ("null", "bool", "int", "float", "str")}
_TEXT_TAGS: Final = {f"{_TAG}timestamp", f"{_TAG}value"}
_MERGE: Final = f"{_TAG}merge"
_INT: Final = f"{_TAG}int"


class _Frame:
    """An open YAML collection while its events arrive."""

    __slots__ = (
        "anchor",
        "has_key",
        "height",
        "is_map",
        "key",
        "key_mark",
        "level",
        "merges",
        "nodes_at_start",
        "path",
        "transparent",
        "value",
    )

    def __init__(
        self,
        is_map: bool,
        anchor: str | None,
        path: _Path | None,
        nodes: int,
        level: int = 1,
        transparent: bool = False,
    ) -> None:
        self.is_map = is_map
        #: The nesting level of its entries in the value built (the root's: 1).
        self.level = level
        #: A list that is a merge key's value: its mappings' entries are merged
        #: into the mapping above, so it adds no level.
        self.transparent = transparent
        self.value: Any = {} if is_map else []
        self.anchor = anchor
        self.path = path
        self.nodes_at_start = nodes
        self.height = 1
        self.has_key = False
        self.key: Any = None
        self.key_mark: Any = None
        self.merges: list[Any] = []


class _YamlBuilder:
    """Build a value from parser events under a node and depth budget (no recursion)."""

    def __init__(self, text: str, limits: Limits, loc: Loc) -> None:
        self.text = text
        self.limits = limits
        self.loc = loc
        self.nodes = 0
        #: anchor -> (value, expanded size in nodes, height in levels)
        self.anchors: dict[str, tuple[Any, int, int]] = {}
        self.stack: list[_Frame] = []

    def fail(self, path: _Path | None, msg: str, mark: Any) -> DocumentError:
        fields: dict[str, Any] = {}
        if mark is not None:
            offset = _byte_offset(self.text, mark.index)
            msg = f"{msg} (line {mark.line + 1}, column {mark.column + 1}, byte {offset})"
            fields = {"offset": offset, "line": mark.line + 1, "column": mark.column + 1}
        return DocumentError(_at(self.loc, path), msg, **fields)

    def child_path(self) -> _Path | None:
        if not self.stack:
            return None
        top = self.stack[-1]
        if top.is_map:
            if not top.has_key:  # a key being built: errors name the mapping
                return top.path
            key = top.key
            if key is _MERGE_KEY:
                return _Path(top.path, "<<")
            return _Path(top.path, key if isinstance(key, str) else _show(key))
        return _Path(top.path, len(top.value))

    def _slot(self) -> tuple[int, bool]:
        """The level a container that starts now gets, and whether it is merged away.

        A mapping that is a merge key's value (or an item of a list that is)
        is merged into the mapping above: its entries are that mapping's, on
        its level, and so is a list that is a merge key's value. Any other
        container is a level below the one it is in.
        """
        if not self.stack:
            return 1, False
        top = self.stack[-1]
        merged = top.transparent or (top.is_map and top.has_key and top.key is _MERGE_KEY)
        return (top.level, True) if merged else (top.level + 1, False)

    def charge(self, size: int, path: _Path | None, mark: Any) -> None:
        self.nodes += size
        if self.nodes > self.limits.max_nodes:
            raise self.fail(
                path,
                f"more than {self.limits.max_nodes} values in the document"
                " (aliases and merges counted expanded)",
                mark,
            )

    def build(self, events: Iterator[Any]) -> Any:
        root: Any = None
        done = False
        for ev in events:
            kind = type(ev)
            if kind is yaml.ScalarEvent:
                self.nodes += 1
                if self.nodes > self.limits.max_nodes:
                    self.charge(0, self.child_path(), ev.start_mark)
                value = self.scalar(ev)
                if ev.anchor is not None:
                    self.anchors[ev.anchor] = (value, 1, 0)
                root, done = self.add(value, 0, ev, root, done)
            elif kind is yaml.AliasEvent:
                path = self.child_path()
                if ev.anchor not in self.anchors:
                    raise self.fail(path, f"unknown alias *{ev.anchor}", ev.start_mark)
                value, size, height = self.anchors[ev.anchor]
                self.charge(size, path, ev.start_mark)
                if self._slot()[0] + height - 1 > self.limits.max_depth:
                    raise self.fail(
                        path, f"nested deeper than {self.limits.max_depth}", ev.start_mark
                    )
                root, done = self.add(value, height, ev, root, done)
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                is_map = kind is yaml.MappingStartEvent
                path = self.child_path()
                tag = ev.tag
                if tag is not None and tag not in (f"{_TAG}map", f"{_TAG}seq", "!"):
                    raise self.fail(path, f"unsupported tag {tag}", ev.start_mark)
                level, merged_away = self._slot()
                if level > self.limits.max_depth:
                    raise self.fail(
                        path, f"nested deeper than {self.limits.max_depth}", ev.start_mark
                    )
                self.charge(1, path, ev.start_mark)
                transparent = merged_away and not is_map and not self.stack[-1].transparent
                frame = _Frame(is_map, ev.anchor, path, self.nodes - 1, level, transparent)
                self.stack.append(frame)
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                frame = self.stack.pop()
                value = frame.value
                if frame.merges:
                    merged: dict[str, Any] = {}
                    for m in reversed(frame.merges):
                        merged.update(m)
                    merged.update(value)
                    value = merged
                if frame.anchor is not None:
                    size = self.nodes - frame.nodes_at_start
                    self.anchors[frame.anchor] = (value, size, frame.height)
                root, done = self.add(value, frame.height, ev, root, done)
            # Stream/document start and end events carry no value.
        return root

    def add(self, value: Any, height: int, ev: Any, root: Any, done: bool) -> tuple[Any, bool]:
        if not self.stack:
            if done:
                raise self.fail(None, "more than one document in the stream", ev.start_mark)
            return value, True
        top = self.stack[-1]
        if not top.is_map:
            top.height = max(top.height, height + 1)
            top.value.append(value)
            return root, done
        if not top.has_key:
            top.height = max(top.height, height + 1)
            top.key, top.key_mark, top.has_key = value, ev.start_mark, True
            return root, done
        key, top.has_key = top.key, False
        if key is _MERGE_KEY:
            items = value if isinstance(value, list) else [value]
            for item in items:
                if not isinstance(item, dict):
                    raise self.fail(
                        _Path(top.path, "<<"), "a merge key needs a mapping", ev.start_mark
                    )
            # Merged, a mapping's entries are this mapping's: no level of its
            # own (a list of them, one level less). A chain of merges (b
            # merges a, c merges b...) is as deep as its deepest entry, and
            # as large as its entries expanded (charged at each alias).
            top.height = max(top.height, height - 1 if isinstance(value, list) else height)
            top.merges.extend(items)
            return root, done
        top.height = max(top.height, height + 1)
        if not isinstance(key, str):
            raise self.fail(
                top.path,
                f"key {_show(key)} is a {_kind(key)}; keys must be strings (quote it: 'yes', '1')",
                top.key_mark,
            )
        if key in top.value:
            raise self.fail(_Path(top.path, key), _DUPLICATE, top.key_mark)
        top.value[key] = value
        return root, done

    def scalar(self, ev: Any) -> Any:
        text: str = ev.value
        tag = ev.tag
        if tag is None or tag == "!":
            implicit = ev.implicit
            if len(text) <= _CACHED_SCALAR_CHARS:
                tag = _resolve(text, implicit)
            else:
                tag = _RESOLVER.resolve(yaml.ScalarNode, text, implicit)
        if tag == _MERGE and self.stack and self.stack[-1].is_map and not self.stack[-1].has_key:
            return _MERGE_KEY
        if tag in _TEXT_TAGS or tag == f"{_TAG}str":
            return text
        if tag not in _SCALAR_TAGS:
            raise self.fail(self.child_path(), f"unsupported tag {tag}", ev.start_mark)
        if tag == _INT and len(text) > _INT_LITERAL_MAX:
            return _BigInt(text)
        node = yaml.ScalarNode(tag, text, ev.start_mark, ev.end_mark, ev.style)
        try:
            return _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, node)
        except (ValueError, yaml.YAMLError) as exc:
            msg = f"bad {tag.removeprefix(_TAG)} {text[:40]!r}: {exc}"
            raise self.fail(self.child_path(), msg, None) from None


#: Longest scalar whose resolved tag is cached (the cache must not hold big strings).
_CACHED_SCALAR_CHARS: Final = 40


@functools.lru_cache(maxsize=4096)
def _resolve(text: str, implicit: tuple[bool, bool]) -> str:
    """The tag PyYAML's safe resolver gives a scalar (cached: hostile bodies repeat)."""
    tag: str = _RESOLVER.resolve(yaml.ScalarNode, text, implicit)
    return tag


#: Marks a ``<<`` merge key while its mapping is built.
_MERGE_KEY: Final = object()


def _load_yaml(text: str, limits: Limits, loc: Loc) -> Any:
    builder = _YamlBuilder(text, limits, loc)
    try:
        return builder.build(yaml.parse(text, Loader=_Parser))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is None:
            raise DocumentError(loc, f"malformed YAML: {problem}") from None
        if "nesting depth" in problem and mark.index > 0:
            _deeper_than_allowed(text[: mark.index], limits, loc)
        offset = _byte_offset(text, mark.index)
        raise DocumentError(
            loc,
            f"malformed YAML at line {mark.line + 1}, column {mark.column + 1}"
            f" (byte {offset}): {problem}",
            offset=offset,
            line=mark.line + 1,
            column=mark.column + 1,
        ) from None
    except yaml.YAMLError as exc:
        raise DocumentError(loc, f"malformed YAML: {exc}") from None


def _deeper_than_allowed(prefix: str, limits: Limits, loc: Loc) -> None:
    """Raise the limit's own error (with its path) for a document libyaml found too deep.

    Discussion: libyaml (0.2.6, PyYAML 6.0.3 on) refuses nesting beyond its
    own maximum while its scanner looks ahead for a key, before it hands out
    the events of the first levels; so the builder never sees the level
    where ``max_depth`` is passed. The prefix up to libyaml's error holds
    that level: built alone, it raises the limit's error naming the path.
    Anything else it raises, or none, and the caller reports libyaml's error.
    """
    try:
        _YamlBuilder(prefix, limits, loc).build(yaml.parse(prefix, Loader=_Parser))
    except DocumentError as exc:
        if "nested deeper" in exc.msg:
            raise
    except yaml.YAMLError:
        pass


# -- entry points -----------------------------------------------------------------------------


def load_text(
    text: str, yaml_syntax: bool, limits: Limits = DEFAULT_LIMITS, loc: Loc | None = None
) -> Any:
    """Parse ``text`` as YAML or JSON under ``limits`` and :func:`check` the value.

    Raises:
        DocumentError: Malformed (naming the byte offset) or over a limit (naming the path).
    """
    where: Loc = list(loc or [])
    value = _load_yaml(text, limits, where) if yaml_syntax else _load_json(text, limits, where)
    check(value, limits, where)
    return value


def load(
    body: bytes,
    media_type: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    loc: Loc | None = None,
) -> Any:
    """Parse a request body (YAML for the :data:`YAML_MEDIA_TYPES`, else JSON) and check it.

    Args:
        body: The raw bytes (UTF-8).
        media_type: The ``Content-Type`` (parameters are ignored).
        limits: The limits.
        loc: Path prefix of error locations (default ``["body"]``).

    Raises:
        DocumentError: Not UTF-8, malformed, or over a limit; names path and byte offset.
    """
    where: Loc = ["body"] if loc is None else list(loc)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            where, f"the body is not UTF-8 (byte {exc.start})", offset=exc.start
        ) from None
    media = (media_type or "").split(";", 1)[0].strip().lower()
    return load_text(text, media in YAML_MEDIA_TYPES, limits, where)


def load_reply(
    body: bytes,
    media_type: str | None,
    limits: Limits = DEFAULT_LIMITS,
    loc: Loc | None = None,
    text_keys: tuple[str, ...] = (),
) -> tuple[Any, ...]:
    """:func:`load` for a worker process: a picklable reply instead of an exception.

    A top-level mapping's ``text_keys`` that hold a string are parsed too
    (JSON when the text starts with ``{`` or ``[``, YAML otherwise), so a
    document given as text inside the body is parsed in the worker as well.

    Returns:
        ``("ok", value)`` or ``("error", loc, msg, fields)``.
    """
    where: Loc = ["body"] if loc is None else list(loc)
    try:
        value = load(body, media_type, limits, where)
        if isinstance(value, dict):
            for key in text_keys:
                text = value.get(key)
                if isinstance(text, str):
                    yaml_syntax = not text.lstrip().startswith(("{", "["))
                    value[key] = load_text(text, yaml_syntax, limits, [*where, key])
    except DocumentError as exc:
        return ("error", exc.loc, exc.msg, exc.fields)
    return ("ok", value)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""``.

    The one rule for a name a document (or a command line) misspells: a
    plan's field, a tool, an argument, an input, a step.
    """
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=SUGGEST_CUTOFF)
    return f"; did you mean {close[0]!r}?" if close else ""
