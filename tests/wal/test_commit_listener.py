"""The WAL's commit listener: exactly the committed records, in order, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiffany.wal import Wal, iter_records, split_frames


def test_listener_sees_each_committed_record_once_in_order(tmp_path: Path) -> None:
    seen: list[tuple[int, int, bytes]] = []
    syncs: list[float] = []

    def listener(first: int, frames: bytearray, sync_s: float) -> None:
        syncs.append(sync_s)
        for i, (rtype, payload) in enumerate(split_frames(frames)):
            seen.append((first + i, rtype, payload))

    # A tiny segment size forces rotations inside one commit.
    with Wal.open(tmp_path, fsync="batch", segment_size_bytes=200) as wal:
        wal.on_commit = listener
        for i in range(25):
            wal.append(1 + i % 3, f"payload-{i}".encode() * (1 + i % 4))
            if i % 7 == 6:
                wal.commit()
        wal.commit()
        wal.commit()  # nothing new: no call
    on_disk = [(r.seq, r.rtype, r.payload) for r in iter_records(tmp_path)]
    assert seen == on_disk
    assert len(syncs) == 4
    assert all(s >= 0.0 for s in syncs)


def test_split_frames_rejects_a_cut_buffer() -> None:
    from tiffany.wal.frame import encode

    data = encode(2, b"abc") + encode(3, b"defgh")
    assert split_frames(data) == [(2, b"abc"), (3, b"defgh")]
    with pytest.raises(ValueError, match="byte offset 12"):
        split_frames(data[:-1])
