"""Helpers of the store tests (a module of its own: ``conftest`` names collide across folders)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from process_support import wait_for
from sqlalchemy import Engine, select

from tiffany.store import Base

Record = tuple[int, int, int, Any]  # (seq, rtype, run_no, tiffany.wire.records struct)


@dataclass
class Journal:
    """A data dir whose WAL holds the test runs, and its records decoded."""

    data_dir: Path
    records: list[Record]
    run_ids: dict[str, str] = field(default_factory=dict)  # label -> run id

    @property
    def wal_dir(self) -> Path:
        return self.data_dir / "wal"


def dump(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Return every row of the store's tables, in primary key order."""
    out: dict[str, list[dict[str, Any]]] = {}
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            order = list(table.primary_key.columns)
            rows = conn.execute(select(table).order_by(*order)).mappings()
            out[table.name] = [dict(r) for r in rows]
    return out


def tiffany_cli(data_dir: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tiffany --data-dir DATA_DIR ARGS`` (no TIFFANY_* from the caller)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def get_json(url: str) -> tuple[int, Any]:
    """GET ``url``; return its status and JSON body (error answers too)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def serve(data_dir: Path, **env_extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``tiffany serve`` on port 0; return the process and its URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.update(env_extra)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data_dir), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    ready = data_dir / "serve.json"
    wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "serve.json")
    assert proc.poll() is None, "serve exited while starting"
    return proc, json.loads(ready.read_text())["url"]
