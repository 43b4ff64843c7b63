"""verify's short ways (one-pass load, the replayed bare yield) keep every check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tiffany.durable import verify
from tiffany.durable.history import load_many, load_run
from tiffany.durable.runtime import Runtime
from tiffany.errors import WalCorruptionError
from tiffany.wal import FsyncPolicy, Wal, iter_records
from tiffany.wire.records import Dispatch, RecordType, decode, encode

TARGET = "durable_workloads:generator_step_among_busy_tasks"


def _record(data_dir: Path, runs: int = 1) -> list[str]:
    """Journal ``runs`` runs side by side in one scheduler (their records interleave)."""
    with Runtime(data_dir, fsync=FsyncPolicy.OFF) as rt:
        ids = [rt.submit(TARGET, 2) for _ in range(runs)]
        rt.run()
    return ids


def _rewrite(src: Path, dst: Path, change: Callable[[int, int, bytes], bytes]) -> None:
    """Copy the WAL of ``src`` into ``dst`` with ``change(seq, rtype, payload)`` applied."""
    wal = Wal.open(dst / "wal", fsync=FsyncPolicy.OFF)
    try:
        for rec in iter_records(src / "wal"):
            wal.append(rec.rtype, change(rec.seq, rec.rtype, bytes(rec.payload)))
        wal.commit()
    finally:
        wal.close()


def _yields(data_dir: Path) -> list[tuple[int, bytes]]:
    """The seqs and payloads of the DISPATCH records of bare yields."""
    return [
        (rec.seq, bytes(rec.payload))
        for rec in iter_records(data_dir / "wal")
        if rec.rtype == RecordType.DISPATCH and decode(rec.rtype, rec.payload).kind == "yield"  # type: ignore[union-attr]
    ]


def test_load_run_reads_what_load_many_reads_among_interleaved_runs(tmp_path):
    ids = _record(tmp_path, runs=3)
    index, cursors = load_many(tmp_path / "wal", set(ids))
    for run_id in ids:
        info, cursor = load_run(tmp_path / "wal", run_id)
        assert info.records == index.get(run_id).records > 0
        assert info.status == index.get(run_id).status == "succeeded"
        assert cursor.dispatches == cursors[run_id].dispatches
        assert cursor.seqs == []  # not kept: read again for an error
        assert [cursor.seq_of(i) for i in range(len(cursor.dispatches))] == cursors[run_id].seqs
        assert cursor.outcomes == cursors[run_id].outcomes
        assert list(cursor.wakes) == list(cursors[run_id].wakes)
        assert cursor.exits == cursors[run_id].exits
        assert cursor.run_end == cursors[run_id].run_end
        report = verify(tmp_path, run_id)
        assert report.ok, report.to_dict()
        assert report.records == info.records


def test_an_unknown_run_is_reported(tmp_path):
    _record(tmp_path)
    with pytest.raises(Exception, match="no run 'nope'"):
        verify(tmp_path, "nope")


@pytest.mark.parametrize(
    ("field", "value"), [("n", 10_000), ("ltid", 99), ("kind", "sleep"), ("arg", "x")]
)
def test_a_recorded_yield_changed_in_any_field_diverges(tmp_path, field, value):
    (run_id,) = _record(tmp_path / "src")
    seq, payload = _yields(tmp_path / "src")[5]
    rec: Dispatch = decode(RecordType.DISPATCH, payload)  # type: ignore[assignment]
    changed = encode(payload[:4], Dispatch(**{**_fields(rec), field: value}))

    def change(s: int, rtype: int, data: bytes) -> bytes:
        return changed if s == seq else data

    _rewrite(tmp_path / "src", tmp_path / "dst", change)
    report = verify(tmp_path / "dst", run_id)
    assert not report.ok
    assert report.divergence is not None
    assert report.divergence["code"] == "replay.nondeterminism"
    assert report.divergence["seq"] == seq
    assert report.divergence["actual"][2] == "yield"


def test_a_corrupt_record_of_the_run_is_caught(tmp_path):
    (run_id,) = _record(tmp_path)
    records = list(iter_records(tmp_path / "wal"))
    victim = records[len(records) // 2]
    seg = tmp_path / "wal" / victim.segment
    data = bytearray(seg.read_bytes())
    data[victim.offset + 9 + 5] ^= 0x01  # a payload byte: the record's CRC fails
    seg.write_bytes(bytes(data))
    with pytest.raises(WalCorruptionError):
        verify(tmp_path, run_id)


def _fields(rec: Dispatch) -> dict[str, object]:
    return {"n": rec.n, "ltid": rec.ltid, "kind": rec.kind, "arg": rec.arg}
