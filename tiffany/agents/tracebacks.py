"""The frames of the user's code in an exception: what a failed step shows of where it failed.

A ``python`` step runs a function the operator registered; when it raises,
the step's error carries the frames the exception went through *outside the
tiffany package* (the user's module, and the libraries it called), as a
list of ``{"file", "line", "function", "code"}`` dicts, outermost first
("most recent call last", as Python prints them). The API, the dashboard's
step card and the CLI show them.

Invariants:

* The frames are taken where the exception is caught, in the thread that
  ran the function (the pool's, or the scheduler's for an inline or a
  generator function): the traceback object lives there. Only the list of
  dicts goes on, into the error's ``fields``: it is journaled with the
  error, so a replay hands back the same frames (the traceback object is
  never journaled, and a replay has none to read).
* Bounded: at most ``TIFFANY_TRACEBACK_FRAMES`` frames (the innermost
  ones, where it failed; ``traceback_omitted`` counts those left out) and
  ``TIFFANY_TRACEBACK_CHARS`` characters per text (a path keeps its end,
  the rest their start), so a deep recursion or a minified line cannot
  swell the journal.
* Every text is as the journal keeps text (:func:`~tiffany.wire.values.journal_text`):
  a source line or a name holding a lone surrogate is escaped, not refused.

Discussion: the source line is read through :mod:`linecache`, which reads
the module's file the first time (then keeps it). For an inline or a
generator function that happens on the scheduler's thread, once per failure,
from a file the interpreter has just imported (in the page cache): a read of
a local file, not a wait on anything remote.

Rejected: keeping only the frames of "the user's own" modules (dropping the
standard library and site-packages): the line of ``json`` or ``httpx`` that
raised is what tells a reader why, and the bound keeps the list short
anyway. Rejected too: the exception's ``__cause__`` and ``__context__``
chains: the step's error is the exception that left the function; its
message already names its type.
"""

from __future__ import annotations

import linecache
import os
import traceback
from dataclasses import dataclass
from typing import Any, Final

from tiffany.wire.values import journal_text

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TRACEBACK_CHARS",
    "DEFAULT_TRACEBACK_FRAMES",
    "TracebackLimits",
    "traceback_fields",
    "user_frames",
]

#: Frames a step's error keeps by default (``TIFFANY_TRACEBACK_FRAMES``): the innermost.
DEFAULT_TRACEBACK_FRAMES: Final = 30
#: Characters a frame's file, function or source line keeps by default
#: (``TIFFANY_TRACEBACK_CHARS``).
DEFAULT_TRACEBACK_CHARS: Final = 240
#: The package's own directory: a frame under it is tiffany's, not the user's.
_PACKAGE_DIR: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: What marks a text that was cut.
_CUT: Final = "..."


@dataclass(frozen=True, slots=True)
class TracebackLimits:
    """How much of a traceback a step's error keeps (settings ``traceback_*``)."""

    frames: int = DEFAULT_TRACEBACK_FRAMES
    chars: int = DEFAULT_TRACEBACK_CHARS


#: The bounds without the operator's settings (a tool run outside an engine).
DEFAULT_LIMITS: Final = TracebackLimits()


def _cut(text: str, chars: int, *, keep_end: bool = False) -> str:
    text = journal_text(text)
    if len(text) <= chars:
        return text
    room = max(chars - len(_CUT), 0)
    return _CUT + text[len(text) - room :] if keep_end else text[:room] + _CUT


def user_frames(
    exc: BaseException, limits: TracebackLimits = DEFAULT_LIMITS
) -> tuple[list[dict[str, Any]], int]:
    """Return the frames of ``exc``'s traceback outside tiffany, and how many were left out.

    Args:
        exc: An exception just caught (its ``__traceback__`` is read).
        limits: The bounds (:class:`TracebackLimits`).

    Returns:
        ``(frames, omitted)``: ``frames`` outermost first, each ``{"file",
        "line", "function", "code"}`` (``code``: the stripped source line,
        ``""`` when the source cannot be read); ``omitted``: the outer
        frames past ``limits.frames`` that were dropped.
    """
    picked = [
        (frame, line)
        for frame, line in traceback.walk_tb(exc.__traceback__)
        if not os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR)
    ]
    omitted = max(len(picked) - limits.frames, 0)
    frames = []
    for frame, line in picked[omitted:]:
        code = frame.f_code
        name = code.co_filename
        source = linecache.getline(name, line or 0, frame.f_globals).strip() if line else ""
        frames.append(
            {
                "file": _cut(name, limits.chars, keep_end=True),
                "line": line or 0,
                "function": _cut(code.co_qualname, limits.chars),
                "code": _cut(source, limits.chars),
            }
        )
    return frames, omitted


def traceback_fields(
    exc: BaseException, limits: TracebackLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """Return the error fields that carry ``exc``'s user frames (none when it has none).

    ``{"traceback": [...]}``, with ``"traceback_omitted": N`` when frames
    were left out; ``{}`` when every frame is tiffany's own.
    """
    frames, omitted = user_frames(exc, limits)
    if not frames:
        return {}
    fields: dict[str, Any] = {"traceback": frames}
    if omitted:
        fields["traceback_omitted"] = omitted
    return fields
