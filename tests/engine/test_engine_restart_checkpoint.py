"""An engine restarted on a checkpoint: it reads only the WAL's tail, and still answers
for the finished runs it no longer holds (store) and their idempotency keys (checkpoint).
A real ``tiffany engine`` process."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from engine_process import EngineProc
from test_service import SLEEPY, store_run

from tiffany.durable.checkpoint import read_checkpoint
from tiffany.errors import KeyReused, Refusal, RunFinished, RunNotFound
from tiffany.wal import Wal


def test_a_restart_on_a_checkpoint_answers_for_runs_it_no_longer_holds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = EngineProc(data)
    try:
        first.wait_ready()
        answer = first.call("submit", plan=SLEEPY, inputs={}, key="key-1")
        run_id, seq = answer["run_id"], answer["seq"]
        store_run(data, run_id, until="succeeded", timeout=30)
    finally:
        assert first.stop(signal.SIGTERM) == 0
    with Wal.open(data / "wal", fsync="off") as wal:
        last = wal.durable_seq
    cp = read_checkpoint(data / "wal", last)
    assert cp is not None
    assert cp.seq == last  # the stop wrote a checkpoint of the whole log
    assert cp.runs == []
    assert [(k.key, k.seq) for k in cp.keys] == [("key-1", seq)]

    again = EngineProc(data)
    try:
        status = again.wait_ready()
        assert status["runs_active"] == 0
        assert again.logged("engine.started")[-1]["resumed"] == 0
        # Not in the engine's memory (it read nothing before the checkpoint), yet:
        with pytest.raises(Refusal) as cancel:
            again.call("cancel", run_id=run_id)
        assert isinstance(cancel.value, RunFinished)  # the store says it finished
        assert "succeeded" in cancel.value.message
        with pytest.raises(Refusal) as unknown:
            again.call("cancel", run_id="run-nosuchrun")
        assert isinstance(unknown.value, RunNotFound)
        # The idempotency key came back with the checkpoint.
        assert again.call("submit", plan=SLEEPY, inputs={}, key="key-1") == {
            "run_id": run_id,
            "created": False,
            "seq": seq,  # the same answer as the first time
        }
        with pytest.raises(Refusal) as other:
            again.call("submit", plan={**SLEEPY, "name": "other"}, inputs={}, key="key-1")
        assert isinstance(other.value, KeyReused)
        report = again.call("verify", run_id=run_id)
        assert report["identical"] is True
    finally:
        assert again.stop(signal.SIGTERM) == 0
