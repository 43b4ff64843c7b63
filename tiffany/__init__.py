"""Tiffany: durable agent-task orchestration on a generator kernel.

The public names are imported on first use (module ``__getattr__``), so
``import tiffany`` stays instant and pulls in nothing: the SDK
(``Client``, ``AsyncClient``, and its errors and models) from
:mod:`tiffany.sdk`, and ``python_tool`` (register a function plans call
with the ``python`` tool) from :mod:`tiffany.agents.tools.python`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["ApiError", "AsyncClient", "Client", "__version__", "python_tool", "workflow"]

if TYPE_CHECKING:
    from tiffany.agents.tools.python import python_tool
    from tiffany.sdk import ApiError, AsyncClient, Client
    from tiffany.workflows import workflow

#: Public name -> the module that defines it.
_LAZY = {
    "Client": "tiffany.sdk",
    "AsyncClient": "tiffany.sdk",
    "ApiError": "tiffany.sdk",
    "python_tool": "tiffany.agents.tools.python",
    "workflow": "tiffany.workflows",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tiffany' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
