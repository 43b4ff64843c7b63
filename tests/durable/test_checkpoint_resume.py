"""A checkpoint fold resumes its walk of the WAL where the last fold stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_checkpoint import fill

from tiffany.durable.checkpoint import Checkpoint, read_checkpoint
from tiffany.durable.retention import Checkpointer, Retain, fold
from tiffany.wal import iter_records, iter_spans
from tiffany.wal.format import RECORD_HEADER_SIZE_BYTES

EVERYTHING = 1 << 62


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("fold") / "data"
    fill(data, 60, unfinished=3)
    return data / "wal"


def durable_end(wal: Path) -> int:
    return max(record.seq for record in iter_records(wal))


def test_a_fold_from_where_the_last_stopped_equals_one_from_the_start(journal: Path) -> None:
    end = durable_end(journal)
    whole = fold(journal, Checkpoint(0, 0), end, 3600.0)
    assert len(whole[0].runs) == 3  # the sleepers are open
    middle, at = fold(journal, Checkpoint(0, 0), end // 2, 3600.0)
    assert at is not None
    assert at[2] == end // 2 + 1
    assert fold(journal, middle, end, 3600.0, at) == whole
    assert fold(journal, middle, end, 3600.0) == whole  # without the position: the same


def test_the_walk_starts_at_the_position_and_ignores_one_past_the_segment(journal: Path) -> None:
    end = durable_end(journal)
    _, at = fold(journal, Checkpoint(0, 0), end // 2, 3600.0)
    assert at is not None
    walked = list(iter_spans(journal, end // 2 + 1, at=at))
    assert [s[0] for s in walked] == list(range(end // 2 + 1, end + 1))
    assert walked[0][3] - RECORD_HEADER_SIZE_BYTES == at[1]  # the record starts there
    bogus = (at[0], 1 << 40, end // 2 + 1)
    assert [s[0] for s in iter_spans(journal, end // 2 + 1, at=bogus)] == [s[0] for s in walked]


def test_the_checkpointer_resumes_each_pass(journal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiffany.durable import retention

    end = durable_end(journal)
    durable = [end // 2]
    cpr = Checkpointer(
        journal,
        Checkpoint(0, 0),
        durable_seq=lambda: durable[0],
        projected_seq=lambda: 0,
        retain=Retain.ALL,
    )
    cpr.step()
    positions: list[object] = []
    real = retention.read_runs

    def seen(*args: object, **kwargs: object) -> object:
        positions.append(kwargs.get("at"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(retention, "read_runs", seen)
    durable[0] = end
    cpr.step()
    assert positions
    assert positions[0] is not None
    assert positions[0][2] == end // 2 + 1  # type: ignore[index]
    want = fold(journal, Checkpoint(0, 0), end, cpr.window_s)[0]
    assert cpr.checkpoint == want
    assert read_checkpoint(journal, EVERYTHING) == want
