"""``--import MOD`` and ``TIFFANY_TOOL_MODULES``: a user's tool modules, without packaging.

The commands that start an engine (``run``, ``serve``, ``engine``) import
the modules named by ``TIFFANY_TOOL_MODULES`` and their ``--import``
options before the engine starts, so the modules' ``@python_tool``
functions are registered when a plan calls them. The working directory is
made importable first, as ``python -m`` does: a ``mytools.py`` beside the
plan is ``--import mytools``.

``serve`` imports them too (a broken module is told before anything
starts) and passes the list to its engine processes in
``TIFFANY_TOOL_MODULES``, which import them again themselves.

A module that fails to import is one line naming the module and the
exception, and exit code 2 (a usage error), never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from typing import Annotated

import typer

__all__ = ["ImportOption", "import_tool_modules", "tool_modules"]

#: Exit code when a tool module does not import (a usage error).
EXIT_BAD_MODULE = 2

#: ``--import MOD`` (repeatable), for the commands that start an engine.
ImportOption = Annotated[
    list[str] | None,
    typer.Option(
        "--import",
        metavar="MOD",
        help=(
            "Import this Python module first, registering its @python_tool functions "
            "(repeatable; the working directory is importable) [env: TIFFANY_TOOL_MODULES]."
        ),
        show_default=False,
    ),
]


def tool_modules(configured: Iterable[str], given: Iterable[str] | None) -> list[str]:
    """The modules to import: ``TIFFANY_TOOL_MODULES``'s, then ``--import``'s, each once."""
    names = [n.strip() for n in [*configured, *(given or ())]]
    return list(dict.fromkeys(n for n in names if n))


def import_tool_modules(names: Iterable[str]) -> list[str]:
    """Import ``names`` (the working directory importable); return them.

    Raises:
        typer.Exit: Code 2, after one line naming the module that failed and why.
    """
    names = list(names)
    if not names:
        return names
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt in a module's body too
            if isinstance(exc, KeyboardInterrupt):
                raise
            where = _where(exc)
            typer.echo(
                f"tiffany: cannot import tool module {name!r}: {type(exc).__name__}: {exc}{where}",
                err=True,
            )
            raise typer.Exit(EXIT_BAD_MODULE) from None
    return names


def _where(exc: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of the user's module that raised, if any."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename != __file__ and "importlib" not in filename and "<frozen" not in filename:
            last = (filename, tb.tb_lineno)
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) or last is None:
        return ""
    return f" (at {last[0]}:{last[1]})"
