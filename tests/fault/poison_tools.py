"""Python tools whose output the journal cannot take as it is (the poison-output rows).

Loaded by the served engine through a ``tiffany.tools`` entry point, as
``fault_tools.py`` is (``test_poison_outputs.py`` adds the lines).
"""

from __future__ import annotations

from typing import Any

#: A lone surrogate: what a JSON ``"\\ud800"`` escape decodes to; UTF-8 has no form for it.
POISON = "x\ud800y"


def surrogate() -> dict[str, Any]:
    """A result holding a lone surrogate."""
    return {"text": POISON}


def cyclic() -> list[Any]:
    """A result holding itself."""
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


class _Opaque:
    def __repr__(self) -> str:
        return f"<opaque {POISON}>"


def unencodable() -> dict[str, Any]:
    """A result holding an object with no journaled form (its repr holds a surrogate)."""
    return {"n": 1, "obj": _Opaque()}


def raise_surrogate() -> None:
    """An error whose message holds a lone surrogate."""
    raise ValueError(f"remote said {POISON}")
