"""A real ``tiffany engine`` process on a data dir (engine and API tests share it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tiffany.wire.control import ControlUnavailable, call

START_TIMEOUT_S = 60.0


class EngineProc:
    """A ``tiffany engine`` child; :meth:`stop` sends SIGTERM (then SIGKILL) and waits.

    Args:
        data_dir: The engine's data dir.
        extra: More ``tiffany engine`` arguments.
        env: The child's whole environment (default: ours, JSON logs).
        ready_file: Where the engine writes its ready file.
        log_path: Where its output goes (appended).
    """

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        ready_file: Path | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file = ready_file or data_dir.parent / f"{data_dir.name}-engine.json"
        self.ready_file.unlink(missing_ok=True)
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}-engine.log"
        child_env = dict(env) if env is not None else {**os.environ, "TIFFANY_LOG_FORMAT": "json"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tiffany",
                    "--data-dir",
                    str(data_dir),
                    "engine",
                    "--ready-file",
                    str(self.ready_file),
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the engine exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the engine did not start:\n{self.log()}")
            time.sleep(0.02)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return call(self.data_dir, op, **fields)

    def wait_ready(self, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = self.call("status")
                if status["ready"]:
                    return status
            except ControlUnavailable:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("engine not ready")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def logged(self, event: str) -> list[dict[str, Any]]:
        """The engine's JSON log records whose event is ``event``."""
        out = []
        for line in self.log().splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("event") == event:
                    out.append(rec)
        return out
