"""The engine's run table stays bounded and keeps the idempotency contract within its window."""

from __future__ import annotations

from tiffany.durable.checkpoint import KeyEntry, write_checkpoint
from tiffany.durable.history import RunIndex, checkpoint_of, index_of
from tiffany.engine.run_table import RunTable


def test_it_holds_running_runs_and_only_the_newest_finished_ones() -> None:
    table = RunTable(finished_kept=100)
    for i in range(100_000):
        table.started(f"run-{i}")
        if i % 1000:  # one in a thousand keeps running
            table.ended(f"run-{i}", "succeeded")
    assert len(table.running) == 100
    assert len(table.finished) == 100
    assert len(table) == 200
    assert table.status("run-0") == "running"
    assert table.status("run-99999") == "succeeded"
    assert table.status("run-5") is None  # forgotten: the store answers for it


def test_a_key_answers_its_run_within_the_window_and_not_after() -> None:
    table = RunTable(window_s=60.0)
    table.started("run-a", KeyEntry("k", "run-a", "digest-a", 1000.0))
    assert table.key("k", 1059.0) == KeyEntry("k", "run-a", "digest-a", 1000.0)
    assert table.key("k", 1061.0) is None
    # Newer runs push keys out of their window: memory is one window's keys.
    for i in range(500):
        table.started(f"run-{i}", KeyEntry(f"k{i}", f"run-{i}", "d", 1000.0 + i))
    assert "k" not in table.keys
    assert len(table.keys) == 61  # started within the last 60 s of the newest
    assert table.key("k499", 1499.0) is not None


def test_keys_survive_a_restart_through_the_checkpoint(tmp_path) -> None:
    index = RunIndex(last_seq=10, max_run_no=3)
    index.keys = {
        "old": KeyEntry("old", "run-1", "d1", 0.0),
        "new": KeyEntry("new", "run-3", "d3", 90_000.0),
    }
    index.newest_start = 90_000.0
    cp = checkpoint_of(index, window_s=86_400.0)
    write_checkpoint(tmp_path, cp)
    table = RunTable(window_s=86_400.0)
    table.load(index_of(cp))
    assert table.key("new", 90_001.0) == KeyEntry("new", "run-3", "d3", 90_000.0)
    assert table.key("old", 90_001.0) is None  # outside the window: not even in the checkpoint
    assert [k.key for k in cp.keys] == ["new"]
