"""References in plan arguments: ``${inputs.x}`` and ``${steps.ID.output.path}``.

A string that is exactly one reference resolves to the referenced value
itself (a list stays a list); a reference inside a longer string is
interpolated as text (JSON for containers). Paths after ``output`` walk
dict keys and list indexes: ``${steps.fetch.output.items[0].name}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tiffany.errors import TiffanyError

__all__ = ["Ref", "RefError", "find_refs", "resolve"]

_REF = re.compile(r"\$\{\s*([^}]+?)\s*\}")
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


class RefError(TiffanyError):
    """A reference cannot be resolved (missing key, index out of range...)."""

    code = "plan.ref"


@dataclass(frozen=True, slots=True)
class Ref:
    """One parsed reference."""

    text: str
    scope: str  # "inputs" or "steps"
    name: str  # input name or step id
    path: tuple[str | int, ...]  # after the name (for steps: after "output")


def _parse(expr: str) -> Ref:
    parts: list[str | int] = []
    for m in _PART.finditer(expr):
        parts.append(int(m.group(2)) if m.group(2) is not None else m.group(1))
    if len(parts) < 2 or parts[0] not in ("inputs", "steps"):
        raise RefError(
            f"bad reference ${{{expr}}}: use inputs.NAME or steps.ID.output...", ref=expr
        )
    scope, name = str(parts[0]), str(parts[1])
    rest = tuple(parts[2:])
    if scope == "steps":
        if not rest or rest[0] != "output":
            raise RefError(
                f"bad reference ${{{expr}}}: step references read steps.ID.output", ref=expr
            )
        rest = rest[1:]
    return Ref(expr, scope, name, rest)


def find_refs(value: Any) -> list[Ref]:
    """Return the references inside a string (or nested dicts/lists of strings)."""
    out: list[Ref] = []
    if isinstance(value, str):
        if "${" not in value:  # most strings: no regex search
            return out
        for m in _REF.finditer(value):
            try:
                out.append(_parse(m.group(1)))
            except RefError:
                out.append(Ref(m.group(1), "invalid", m.group(1), ()))
    elif isinstance(value, Mapping):
        for v in value.values():
            out.extend(find_refs(v))
    elif isinstance(value, list):
        for v in value:
            out.extend(find_refs(v))
    return out


def _walk(value: Any, path: Iterable[str | int], ref: Ref) -> Any:
    for p in path:
        try:
            value = (
                value[p] if not isinstance(value, Mapping) or isinstance(p, str) else value[str(p)]
            )
        except (KeyError, IndexError, TypeError):
            raise RefError(
                f"${{{ref.text}}}: no {p!r} in the referenced value", ref=ref.text
            ) from None
    return value


def _lookup(ref: Ref, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    if ref.scope == "inputs":
        if ref.name not in inputs:
            raise RefError(f"${{{ref.text}}}: unknown input {ref.name!r}", ref=ref.text)
        return _walk(inputs[ref.name], ref.path, ref)
    if ref.scope == "steps":
        if ref.name not in outputs:
            raise RefError(f"${{{ref.text}}}: step {ref.name!r} has no output", ref=ref.text)
        return _walk(outputs[ref.name], ref.path, ref)
    raise RefError(f"bad reference ${{{ref.text}}}", ref=ref.text)


def resolve(value: Any, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    """Return ``value`` with every reference replaced."""
    if isinstance(value, str):
        whole = _REF.fullmatch(value.strip()) if value.strip().startswith("${") else None
        if whole is not None and whole.group(0) == value.strip():
            return _lookup(_parse(whole.group(1)), inputs, outputs)

        def sub(m: re.Match[str]) -> str:
            v = _lookup(_parse(m.group(1)), inputs, outputs)
            return v if isinstance(v, str) else json.dumps(v)

        return _REF.sub(sub, value)
    if isinstance(value, Mapping):
        return {k: resolve(v, inputs, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, inputs, outputs) for v in value]
    return value
