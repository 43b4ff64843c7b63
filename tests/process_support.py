"""Waiting on and stopping the real processes tests start (serve, engine, API).

One helper each, for what the serve, store and fault tests all do: poll a
condition with a deadline, and stop a process gently (SIGTERM) and then
surely (SIGKILL).
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any


def wait_for(predicate: Any, timeout: float, what: str, *, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something true; OSError counts as "not yet".

    Raises:
        AssertionError: ``timeout`` seconds passed (naming ``what``).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if value:
                return value
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def terminate(proc: subprocess.Popen[Any], timeout: float = 60.0) -> int:
    """SIGTERM ``proc``, SIGKILL it if it has not exited within ``timeout``; its exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
