"""The effect the stop tests count (loaded with ``--import stop_effects``).

``stop_effect`` appends ``start <step> <time>`` to ``<dir>/effects.log``
as it begins, sleeps, then appends ``end <step> <time>`` (one ``write`` on
an ``O_APPEND`` descriptor each: lines never interleave). The times are the
wall clock's, as the engine's log lines are, so a test can tell an effect
that started after the engine's stop from one that was in flight.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tiffany import python_tool


def _line(dir: str, text: str) -> None:
    fd = os.open(Path(dir) / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{text}\n".encode())
    finally:
        os.close(fd)


@python_tool("stop_effect")
def stop_effect(dir: str, step: int, seconds: float = 0.05) -> int:
    """Record the start of ``step``, take ``seconds``, record its end; return ``step``."""
    _line(dir, f"start {step} {time.time():.6f}")  # noqa: TID251 - compared with log times
    time.sleep(seconds)
    _line(dir, f"end {step} {time.time():.6f}")  # noqa: TID251
    return step
