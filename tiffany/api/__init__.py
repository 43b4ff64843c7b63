"""The API side-process: FastAPI app, websocket fan-out, dashboard files.

Public API::

    from tiffany.api import create_app, run_api

    app = create_app(settings)          # an ASGI app (tests, other servers)
    run_api(settings, ready_file=path)  # uvicorn in this process, until SIGTERM

See ``app.py`` for what the app holds and docs/architecture.md ("HTTP API") for
the routes' contract.

The names are imported on first use (a module ``__getattr__``): a process that
needs only a part of the package (the CLI submitting through the database,
``ports/pg.py``) does not pay for FastAPI's import (most of a start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiffany.api.app import create_app
    from tiffany.api.server import run_api

__all__ = ["create_app", "run_api"]

_WHERE = {"create_app": "tiffany.api.app", "run_api": "tiffany.api.server"}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
