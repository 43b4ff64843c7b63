"""The checkpointer's fold in a worker process (``engine/checkpoints.py``): real processes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiffany.config import Settings
from tiffany.durable.checkpoint import Checkpoint, read_checkpoint
from tiffany.durable.retention import Checkpointer, Retain, fold
from tiffany.engine.checkpoints import WorkerFold

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS / "durable") not in sys.path:  # the workload the WAL is filled with
    sys.path.insert(0, str(TESTS / "durable"))

from test_checkpoint import fill  # noqa: E402

EVERYTHING = 1 << 62


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("fold") / "data"
    fill(data, 60, unfinished=3)
    return data / "wal"


@pytest.fixture
def folds(tmp_path: Path) -> Iterator[WorkerFold]:
    made = WorkerFold(Settings(data_dir=tmp_path), min_records=1)
    yield made
    made.close()


def durable_end(wal: Path) -> int:
    from tiffany.wal import iter_records

    return max(record.seq for record in iter_records(wal))


def test_a_large_fold_runs_in_a_worker_process_and_equals_the_fold_here(
    journal: Path, folds: WorkerFold
) -> None:
    end = durable_end(journal)
    base = Checkpoint(0, 0)
    here = fold(journal, base, end, 3600.0)
    assert len(here[0].runs) == 3  # the sleepers are open
    assert folds(journal, base, end, 3600.0) == here
    assert folds.offloaded == 1
    assert folds.fallbacks == 0
    assert folds.pool.pids()
    assert os.getpid() not in folds.pool.pids()
    # From a base part-way, resuming where that fold stopped: the same.
    middle, at = fold(journal, base, end // 2, 3600.0)
    assert at is not None
    assert at[2] == end // 2 + 1
    assert folds(journal, middle, end, 3600.0, at) == here
    assert fold(journal, middle, end, 3600.0, at) == here


def test_a_fold_resumes_where_the_last_one_stopped(journal: Path) -> None:
    """The second fold walks only the records after the first (not the segment from its head)."""
    from tiffany.wal import iter_spans

    end = durable_end(journal)
    _, at = fold(journal, Checkpoint(0, 0), end // 2, 3600.0)
    assert at is not None
    walked = list(iter_spans(journal, end // 2 + 1, at=at))
    assert [s[0] for s in walked] == list(range(end // 2 + 1, end + 1))
    assert walked[0][3] - 9 == at[1]  # the record starts where the position says (9-byte header)
    # A position past the segment's end is not trusted: the walk starts at the head.
    bogus = (at[0], 1 << 40, end // 2 + 1)
    assert [s[0] for s in iter_spans(journal, end // 2 + 1, at=bogus)] == [s[0] for s in walked]


def test_a_small_fold_stays_on_the_thread(journal: Path, tmp_path: Path) -> None:
    folds = WorkerFold(Settings(data_dir=tmp_path))  # the default threshold
    try:
        end = durable_end(journal)
        assert end < folds.min_records
        assert folds(journal, Checkpoint(0, 0), end, 3600.0) == fold(
            journal, Checkpoint(0, 0), end, 3600.0
        )
        assert folds.offloaded == 0
        assert folds.pool.pids() == []  # no worker was ever started
    finally:
        folds.close()


def test_a_killed_worker_costs_no_checkpoint(journal: Path, folds: WorkerFold) -> None:
    end = durable_end(journal)
    base = Checkpoint(0, 0)
    want = fold(journal, base, end, 3600.0)
    assert folds(journal, base, end, 3600.0) == want
    for pid in folds.pool.pids():
        os.kill(pid, 9)
    # The pool notices the dead worker on this call (folded here) or the
    # next (a fresh pool): either way the checkpoint comes out right.
    assert folds(journal, base, end, 3600.0) == want
    assert folds(journal, base, end, 3600.0) == want
    assert folds.offloaded >= 2
    folds.close()
    assert folds(journal, base, end, 3600.0) == want  # closed: folded here, no warning
    assert folds.fallbacks <= 1


def test_the_checkpointer_writes_what_the_worker_folded(journal: Path, folds: WorkerFold) -> None:
    end = durable_end(journal)
    cpr = Checkpointer(
        journal,
        Checkpoint(0, 0),
        durable_seq=lambda: end,
        projected_seq=lambda: 0,
        retain=Retain.ALL,
        fold=folds,
    )
    cpr.step()
    assert folds.offloaded == 1
    assert (
        read_checkpoint(journal, EVERYTHING)
        == fold(journal, Checkpoint(0, 0), end, cpr.window_s)[0]
    )
