"""A failed step told on a terminal: its user's traceback, as Python prints one.

``tiffany run``, ``tiffany replay`` and ``tiffany status RUN`` print the
run's result as JSON on standard output (what a script reads); the frames a
failed ``python`` step's error carries (``traceback``:
``tiffany/agents/tracebacks.py``) go to standard error beside it, in the
shape a Python user reads without thinking::

    step parse failed: Traceback (most recent call last):
      File "/src/mytools.py", line 12, in word_count
        return parse(text)
      File "/src/mytools.py", line 5, in parse
        raise ValueError("empty text")
    tool.python.error: python tool 'word_count' raised ValueError: empty text

Every text goes through :func:`~tiffany.cli.remote.printable`: a file name
or a source line is the user's, and must not drive the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import typer

from tiffany.cli.remote import printable

__all__ = ["print_failures", "traceback_lines"]


def traceback_lines(step_id: str, error: Mapping[str, Any]) -> list[str]:
    """The lines that tell step ``step_id``'s ``error``, its frames first (none without them)."""
    frames = error.get("traceback")
    if not isinstance(frames, list) or not frames:
        return []
    lines = [f"step {printable(step_id)} failed: Traceback (most recent call last):"]
    omitted = error.get("traceback_omitted")
    if isinstance(omitted, int) and omitted > 0:
        lines.append(f"  ... {omitted} earlier frames left out (TIFFANY_TRACEBACK_FRAMES)")
    for frame in frames:
        if not isinstance(frame, Mapping):
            continue
        where = f'  File "{printable(frame.get("file"))}", line {printable(frame.get("line"))}'
        lines.append(f"{where}, in {printable(frame.get('function'))}")
        if frame.get("code"):
            lines.append(f"    {printable(frame.get('code'))}")
    head = error.get("code") or error.get("type") or "error"
    lines.append(f"{printable(head)}: {printable(error.get('message'))}")
    return lines


def print_failures(steps: Mapping[str, Any] | None) -> None:
    """Print, on standard error, the traceback of every failed step that has one.

    ``steps``: step id -> ``{"status", "error"}`` (the result ``run`` prints).
    """
    for step_id, step in (steps or {}).items():
        if not isinstance(step, Mapping) or step.get("status") != "failed":
            continue
        error = step.get("error")
        if isinstance(error, Mapping):
            for line in traceback_lines(str(step_id), error):
                typer.echo(line, err=True)
