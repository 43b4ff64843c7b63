"""Python tool functions the fault suite's served engines run (loaded through an entry point).

``fault.effect`` appends one line per execution to ``<dir>/effects.log`` (one
``write`` of a short line on an ``O_APPEND`` descriptor: lines never
interleave), so the test counts how many times each step really ran. The
line is ``<tag> <step> <pid> <monotonic s>``: the process that ran it, and
when (``CLOCK_MONOTONIC``, one clock for every process of the machine), so
the soak (``soak_account.py``) can tell an effect that started before an
engine was stopped from one that started after.
``fault.flaky`` fails its first ``fail_times`` calls per ``key`` (counted in
``<dir>/flaky-<key>``) and then succeeds, for retry policies.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def effect(dir: str, tag: str, step: str, value: int = 0, sleep: float = 0.0) -> dict[str, int]:
    """Record one execution of ``step`` of the run tagged ``tag``; return ``value`` doubled."""
    line = f"{tag} {step} {os.getpid()} {time.monotonic():.6f}\n".encode()
    fd = os.open(Path(dir) / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    if sleep:  # after the effect: a crash in here leaves an effect whose step is unfinished
        time.sleep(sleep)
    return {"value": int(value) * 2 + 1}


def flaky(dir: str, key: str, fail_times: int) -> int:
    """Fail (ValueError) the first ``fail_times`` calls for ``key``; then return the call count."""
    p = Path(dir) / f"flaky-{key}"
    calls = int(p.read_text()) + 1 if p.exists() else 1
    # Atomically: a kill -9 between a truncate and its write left an empty
    # count, and every later call failed on int("") (a run failed, once in CI).
    tmp = p.with_suffix(".tmp")
    tmp.write_text(str(calls))
    os.replace(tmp, p)
    if calls <= fail_times:
        raise ValueError(f"call {calls} fails")
    return calls
