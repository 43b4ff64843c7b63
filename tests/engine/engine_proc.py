"""Start a real ``tiffany engine`` process on a data dir (for the service tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tiffany.control import ControlUnavailable, call


class EngineProc:
    """A ``tiffany engine`` subprocess; :meth:`stop` sends SIGTERM and waits."""

    def __init__(self, data_dir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.ready_file = data_dir.parent / f"{data_dir.name}-engine.json"
        self.ready_file.unlink(missing_ok=True)
        self.log = open(data_dir.parent / f"{data_dir.name}-engine.log", "ab")  # noqa: SIM115
        full_env = {**os.environ, "TIFFANY_LOG_FORMAT": "json", **(env or {})}
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
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
        deadline = time.monotonic() + 30
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited with {self.proc.returncode}: {self.log_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError("engine did not start")
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

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.data_dir.parent / f"{self.data_dir.name}-engine.log").read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self.log.close()
        return code

    def logged(self, event: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("event") == event:
                    out.append(rec)
        return out
