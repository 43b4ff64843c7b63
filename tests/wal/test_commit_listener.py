"""The WAL's commit listener: each commit's seq range, in order, once."""

from __future__ import annotations

from pathlib import Path

from tiffany.wal import Wal, iter_records


def test_listener_sees_each_committed_range_once_in_order(tmp_path: Path) -> None:
    ranges: list[tuple[int, int]] = []
    syncs: list[float] = []

    def listener(first: int, last: int, sync_s: float) -> None:
        ranges.append((first, last))
        syncs.append(sync_s)

    # A tiny segment size forces rotations inside one commit.
    with Wal.open(tmp_path, fsync="batch", segment_size_bytes=200) as wal:
        wal.on_commit = listener
        for i in range(25):
            wal.append(1 + i % 3, f"payload-{i}".encode() * (1 + i % 4))
            if i % 7 == 6:
                wal.commit()
        wal.commit()
        wal.commit()  # nothing new: no call
    on_disk = [r.seq for r in iter_records(tmp_path)]
    assert ranges == [(1, 7), (8, 14), (15, 21), (22, 25)]
    assert [s for first, last in ranges for s in range(first, last + 1)] == on_disk
    assert len(syncs) == 4
    assert all(s >= 0.0 for s in syncs)
