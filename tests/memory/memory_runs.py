"""Runs that use memory, for the memory tests: an engine in-process, the store, a replay.

* :func:`run_plan` runs a plan on an engine built as ``tiffany run`` builds
  it (every tool enabled) on a data dir whose SQLite file holds the store;
* :func:`open_store` opens that store from the test (another MemoryStore on
  the same file, as the HTTP API's would be);
* :func:`replayed` replays a finished run from its journal without side
  effects (as ``tiffany replay --verify`` does, with the replay's engine
  pieces: no MemoryStore at all) and returns what the replay computed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tiffany.agents.registry import ToolRegistry
from tiffany.config import Settings
from tiffany.durable import JournalInstrument
from tiffany.durable.history import load_run
from tiffany.engine import build, replay_resolvers
from tiffany.kernel import Scheduler
from tiffany.memory import HashingEmbedder, MemoryStore
from tiffany.wire.entries import read_entry

ROOT = Path(__file__).resolve().parents[2]
ALL_TOOLS = ToolRegistry.default().all_names()


def settings_for(data_dir: Path, **kw: Any) -> Settings:
    """The settings of an engine on ``data_dir`` (its store: ``data_dir/tiffany.db``)."""
    return Settings(data_dir=data_dir, **kw)


def run_plan(
    data_dir: Path, plan: dict[str, Any], inputs: dict[str, Any] | None = None, **kw: Any
) -> tuple[str, Any]:
    """Run ``plan`` to its end on an engine in this process; ``(run_id, its RunState)``."""
    engine = build(settings_for(data_dir, **kw), enabled_tools=ALL_TOOLS)
    with engine.runtime as rt:
        run_id = engine.submit_plan(plan, inputs)
        rt.run()
        return run_id, rt.status(run_id)


def open_store(data_dir: Path, url: str | None = None) -> MemoryStore:
    """Another MemoryStore on the data dir's store, or on ``url`` (close it)."""
    return MemoryStore.open(url or settings_for(data_dir).database_url, embedder=HashingEmbedder())


def replayed(data_dir: Path, run_id: str) -> Any:
    """Replay finished run ``run_id`` from the journal alone; the replay's ``(status, result)``.

    The engine pieces of a replay have no MemoryStore: a memory step that
    were called again instead of answered from the journal would fail
    (``memory.unavailable``) and the result would differ.
    """
    info, cursor = load_run(data_dir / "wal", run_id)
    root = replay_resolvers(settings_for(data_dir))[read_entry(info.entry).runner](
        info.entry, info.run_id, info.compat
    )
    with Scheduler() as sched:
        journal = JournalInstrument(None, sched, allow_live=False)
        run = journal.start_run(
            info.run_id,
            info.name,
            info.entry,
            root,
            run_no=info.run_no,
            replay=cursor,
            compat=info.compat,
        )
        sched.run()
    return run.status, run.result


def tiffany(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``tiffany --data-dir DATA_DIR ARGS...`` in a child (none of our ``TIFFANY_`` variables)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=base | env,
        cwd=ROOT,
        check=False,
    )
