"""Checkpoints: round trip, fallback on damage, and a start that reads only the tail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import retention_workloads as work
import structlog

import tiffany.durable.history as history
from tiffany.durable.checkpoint import (
    IDEMPOTENCY_WINDOW_S,
    Checkpoint,
    KeyEntry,
    OpenRun,
    checkpoint_path,
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from tiffany.durable.history import checkpoint_of, scan
from tiffany.durable.retention import fold
from tiffany.durable.runtime import Runtime
from tiffany.kernel import Sleep
from tiffany.wire.shards import seq_base, seq_last

SEGMENT_BYTES = 4096


def stop_when_done(rt: Runtime, ids: list[str]) -> Iterator[Any]:
    """Stop the scheduler once the quick runs ``ids`` ended (the sleepers stay unfinished)."""
    while any(rt.status(i).status == "running" for i in ids):
        yield Sleep(0.005)
    rt.sched.stop()


def fill(data: Path, finished: int, *, unfinished: int = 0, first: int = 0) -> list[str]:
    """Journal ``finished`` short runs and ``unfinished`` long sleepers; return all ids.

    Sleepers journaled earlier are resumed and stay unfinished too.
    """
    with Runtime(data, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
        rt.recover()
        ids = [rt.submit(work.quick, first + i) for i in range(finished)]
        sleepers = [rt.submit(work.dozer, 3600.0) for _ in range(unfinished)]
        rt.sched.spawn(stop_when_done(rt, ids), name="stop")
        rt.run()
    return ids + sleepers


def checkpoint_now(data: Path) -> Checkpoint:
    cp = checkpoint_of(scan(data / "wal"))
    write_checkpoint(data / "wal", cp)
    return cp


class Counting:
    """Counts the records a history walk gets, and the segments they are in.

    (``Wal.open``'s own check of the live segments is the writer's recovery,
    not counted: it does not read archived segments.)
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.segments: list[str] = []
        self.records = 0
        real_iter = history.spans_of

        def spans_of(
            wal_dir: Any, from_seq: int = 1, checked: Any = None, at: Any = None, ends: Any = None
        ) -> Iterator[Any]:
            for span in real_iter(wal_dir, from_seq, checked, at, ends):
                self.records += 1
                if not self.segments or self.segments[-1] != span[5]:
                    self.segments.append(span[5])
                yield span

        monkeypatch.setattr(history, "spans_of", spans_of)


def test_a_checkpoint_round_trips_through_its_file(tmp_path: Path) -> None:
    cp = Checkpoint(
        seq=1234,
        max_run_no=77,
        runs=[OpenRun(1000, b"\x4d\x00\x00\x00payload")],
        keys=[KeyEntry("k-1", "run-1", "d" * 64, 1700000000.5)],
    )
    assert decode_checkpoint(encode_checkpoint(cp)) == cp
    path = write_checkpoint(tmp_path, cp)
    assert path == checkpoint_path(tmp_path, 1234)
    assert read_checkpoint(tmp_path, last_seq=1234) == cp
    assert not list(tmp_path.glob("*.tmp"))


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    for seq in (10, 20, 30):
        write_checkpoint(tmp_path, Checkpoint(seq, 1))
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        checkpoint_path(tmp_path, 20).name,
        checkpoint_path(tmp_path, 30).name,
    ]


def test_the_checkpoint_of_a_scan_lists_the_unfinished_runs_and_the_top_run_number(
    tmp_path: Path,
) -> None:
    ids = fill(tmp_path, 5, unfinished=2)
    cp = checkpoint_of(scan(tmp_path / "wal"))
    index = history.index_of(cp)
    assert sorted(index.runs) == sorted(ids[5:])  # the two sleepers, nothing else
    assert cp.max_run_no == 7
    assert all(not info.finished for info in index.runs.values())


def test_a_start_from_a_checkpoint_reads_only_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(tmp_path, 300)
    checkpoint_now(tmp_path)
    tail = fill(tmp_path, 3, unfinished=1, first=300)
    segments = len(list((tmp_path / "wal").glob("*.wal")))
    assert segments > 20
    total = scan(tmp_path / "wal").last_seq

    counted = Counting(monkeypatch)
    with Runtime(tmp_path, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
        assert rt.checkpoint is not None
        resumed = rt.recover()
    assert resumed == [tail[-1]]
    assert counted.records < 60 < total / 10  # the tail's records, not the 300 runs'
    assert len(set(counted.segments)) <= 3

    # The same start without a checkpoint reads everything.
    for path in (tmp_path / "wal").glob("checkpoint-*"):
        path.unlink()
    counted = Counting(monkeypatch)
    with Runtime(tmp_path, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
        assert rt.recover() == [tail[-1]]
    assert counted.records == total  # one pass at the open: recovery reads nothing again
    assert len(set(counted.segments)) == segments


def test_a_run_unfinished_at_the_checkpoint_is_read_from_its_first_record(tmp_path: Path) -> None:
    ids = fill(tmp_path, 2, unfinished=1)
    checkpoint_now(tmp_path)  # the sleeper is open here: its records are before the checkpoint
    fill(tmp_path, 50, first=2)
    with Runtime(tmp_path, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
        assert rt.checkpoint is not None
        assert rt.checkpoint.runs  # the sleeper
        assert rt.recover() == [ids[-1]]
        run = rt.journal.runs[ids[-1]]
        assert run.replay is not None
        assert len(run.replay.dispatches) > 0  # its journal came back from before the checkpoint


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty"])
def test_a_damaged_checkpoint_falls_back_to_the_one_before_then_to_a_full_scan(
    tmp_path: Path, damage: str
) -> None:
    wal = tmp_path / "wal"
    fill(tmp_path, 20)
    older = checkpoint_now(tmp_path)
    ids = fill(tmp_path, 5, unfinished=1, first=20)
    newer = checkpoint_now(tmp_path)
    assert newer.seq > older.seq
    path = checkpoint_path(wal, newer.seq)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x40
    elif damage == "truncate":
        del data[len(data) // 2 :]
    elif damage == "garbage":
        data[:4] = b"JUNK"
    else:
        data.clear()
    path.write_bytes(bytes(data))
    assert read_checkpoint(wal, last_seq=newer.seq) == older

    checkpoint_path(wal, older.seq).write_bytes(b"\x00" * 40)
    assert read_checkpoint(wal, last_seq=newer.seq) is None
    with Runtime(tmp_path, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
        assert rt.checkpoint is None
        assert rt.recover() == [ids[-1]]  # the full scan finds the same
        assert rt.index is not None
        assert rt.index.max_run_no == 26
        new = rt.submit(work.quick, 99)
        rt.sched.spawn(stop_when_done(rt, [new]), name="stop")
        rt.run()
    assert scan(wal).get(new).run_no == 27  # run numbers stay unique


def test_a_checkpoint_past_the_end_of_the_log_is_not_used(tmp_path: Path) -> None:
    fill(tmp_path, 3)
    cp = checkpoint_now(tmp_path)
    write_checkpoint(tmp_path / "wal", Checkpoint(cp.seq + 100, 99))
    assert read_checkpoint(tmp_path / "wal", last_seq=cp.seq) == cp


def test_run_numbers_stay_unique_when_the_checkpoint_holds_the_top_one(tmp_path: Path) -> None:
    fill(tmp_path, 4)
    cp = checkpoint_now(tmp_path)
    assert cp.max_run_no == 4
    with Runtime(tmp_path, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
        rt.recover()
        new = rt.submit(work.quick, 5)
        rt.run()
    assert scan(tmp_path / "wal").get(new).finished
    assert scan(tmp_path / "wal").get(new).run_no == 5


def test_a_start_on_a_checkpoint_at_the_end_of_the_log_reads_no_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(tmp_path, 200)
    checkpoint_now(tmp_path)  # as a clean stop leaves it
    counted = Counting(monkeypatch)
    with Runtime(tmp_path, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
        assert rt.recover() == []
        assert rt.opened.max_run_no == 200
    assert counted.segments == []
    assert counted.records == 0


def _engine_one(data: Path) -> Runtime:
    """A runtime numbering its records as engine 1 of ``serve --engines N`` does."""
    return Runtime(
        data,
        fsync="off",
        segment_size_bytes=SEGMENT_BYTES,
        seqs=(seq_base(1) + 1, seq_last(1) + 1),
    )


@pytest.mark.parametrize("finished", [0, 3], ids=["empty", "with-runs"])
def test_a_second_engines_journal_opens_without_alarms_and_checkpoints_at_its_own_seqs(
    tmp_path: Path, finished: int
) -> None:
    """Engine 1's journal starts at seq 2^40 + 1: no history was deleted, no checkpoint is bad."""
    with structlog.testing.capture_logs() as logs:
        with _engine_one(tmp_path) as rt:
            rt.recover()
            assert rt.index is not None
            base = checkpoint_of(rt.index)  # what the engine's checkpointer starts from
            ids = [rt.submit(work.quick, i) for i in range(finished)]
            rt.sched.spawn(stop_when_done(rt, ids), name="stop")
            rt.run()
            durable = rt.wal.durable_seq
        cp, _ = fold(tmp_path / "wal", base, durable, IDEMPOTENCY_WINDOW_S)  # its pass
        write_checkpoint(tmp_path / "wal", cp)
        with _engine_one(tmp_path) as rt:
            assert rt.checkpoint == cp  # it checks out: the start reads only what follows
            assert rt.recover() == []
    assert cp.seq == durable
    assert (durable > seq_base(1)) if finished else (durable == seq_base(1))
    assert cp.max_run_no == finished
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []


def test_a_second_engines_deleted_history_is_still_reported(tmp_path: Path) -> None:
    with _engine_one(tmp_path) as rt:
        rt.recover()
        ids = [rt.submit(work.quick, i) for i in range(60)]
        rt.sched.spawn(stop_when_done(rt, ids), name="stop")
        rt.run()
    segments = sorted((tmp_path / "wal").glob("*.wal"))
    assert len(segments) > 1
    segments[0].unlink()  # retention `delete` took it; no checkpoint
    with structlog.testing.capture_logs() as logs, _engine_one(tmp_path):
        pass
    missing = [e for e in logs if e["event"] == "checkpoint.missing"]
    assert len(missing) == 1
    assert missing[0]["first_seq"] > seq_base(1) + 1
