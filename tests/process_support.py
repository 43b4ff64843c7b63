"""Waiting on and stopping the real processes tests start (serve, engine, API).

One helper each, for what the serve, store and fault tests all do: the
``serve`` command line, poll a condition with a deadline, and stop a process
gently (SIGTERM) and then surely (SIGKILL).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
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


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def projector_pid(engine_pid: int) -> int:
    """The engine's projector process (its child running ``tiffany projector``).

    Children are listed per thread (``/proc/PID/task/TID/children``): the
    projector is started from one of the engine's threads.
    """
    threads = Path(f"/proc/{engine_pid}/task").iterdir()
    for child in (c for t in threads for c in (t / "children").read_text().split()):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"projector" in cmdline:
            return int(child)
    raise AssertionError(f"engine {engine_pid} has no projector child")


def serve_argv(data_dir: Path, port: int = 0, *extra: str) -> list[str]:
    """``python -m tiffany serve --data-dir DATA_DIR --port PORT EXTRA...`` (this interpreter)."""
    command = [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data_dir)]
    return [*command, "--port", str(port), *extra]


def serve_json(data_dir: Path) -> dict[str, Any] | None:
    """``<data dir>/serve.json`` as ``tiffany serve`` wrote it, or None (not there, or half)."""
    try:
        doc: dict[str, Any] = json.loads((data_dir / "serve.json").read_text())
    except (OSError, ValueError):
        return None
    return doc
