"""``salvage``: every record that checks out survives a damaged one; originals set aside."""

from __future__ import annotations

import random  # noqa: TID251 - seeded test data, not task code
from pathlib import Path

import pytest

from tiffany.errors import WalCorruptionError
from tiffany.wal import Wal, iter_records, verify
from tiffany.wal.format import HEADER_SIZE_BYTES, RECORD_HEADER_SIZE_BYTES
from tiffany.wal.salvage import MISSING_SEGMENT, salvage

SEG = 400  # about 10 records per segment


def _payloads(n: int = 60) -> list[bytes]:
    rng = random.Random(7)
    return [i.to_bytes(4, "little") + rng.randbytes(rng.randrange(4, 30)) for i in range(n)]


def _offsets(path: Path) -> list[tuple[str, int, int]]:
    """(segment, offset, frame size) of each record."""
    return [
        (r.segment, r.offset, RECORD_HEADER_SIZE_BYTES + len(r.payload)) for r in iter_records(path)
    ]


def _flip(path: Path, name: str, at: int) -> None:
    f = path / name
    data = bytearray(f.read_bytes())
    data[at] ^= 0x10
    f.write_bytes(bytes(data))


@pytest.fixture
def log(tmp_path: Path, fill) -> tuple[Path, list[bytes]]:
    payloads = _payloads()
    fill(tmp_path, payloads, segment_size_bytes=SEG)
    assert len({s for s, _, _ in _offsets(tmp_path)}) >= 4
    return tmp_path, payloads


@pytest.mark.parametrize("where", ["payload", "crc", "length", "type"])
def test_a_flipped_bit_in_a_middle_record_loses_only_that_record(log, where) -> None:
    path, payloads = log
    k = 23
    seg, off, _ = _offsets(path)[k]
    at = {"crc": 0, "length": 4, "type": 8, "payload": RECORD_HEADER_SIZE_BYTES + 6}[where]
    _flip(path, seg, off + at)
    assert not verify(path).ok
    with pytest.raises(WalCorruptionError) as err:
        Wal.open(path)
    assert err.value.fields["segment"] == seg
    assert err.value.fields["seq"] == k + 1

    report = salvage(path, segment_size_bytes=SEG)
    assert len(report.losses) == 1
    loss = report.losses[0]
    assert (loss.segment, loss.offset, loss.seq) == (seg, off, k + 1)
    if where != "length":  # the length intact: exactly that frame, attributable
        assert loss.records == 1
        assert loss.prefix == payloads[k][:4]
    assert loss.kept_before == k
    got = [r.payload for r in iter_records(path)]
    assert got == payloads[:k] + payloads[k + 1 :]
    assert [r.seq for r in iter_records(path)] == list(range(1, len(got) + 1))
    assert verify(path).ok
    assert {p.name for p in path.glob("*.broken")} == {f"{s}.broken" for s in report.moved_aside}
    assert not (path / "salvage.tmp").exists()
    with Wal.open(path) as wal:
        assert wal.append(1, b"after") == len(got) + 1


def test_a_missing_segment_loses_its_records_and_keeps_the_rest(log) -> None:
    path, payloads = log
    segs = sorted(p.name for p in path.glob("*.wal"))
    gone = segs[1]
    first, nxt = int(segs[1][:20]), int(segs[2][:20])
    (path / gone).unlink()
    report = salvage(path, finish=lambda recs, losses: [(9, b"end")], segment_size_bytes=SEG)
    [loss] = report.losses
    assert loss.reason == MISSING_SEGMENT
    assert (loss.seq, loss.records) == (first, nxt - first)
    got = [r.payload for r in iter_records(path)]
    assert got == payloads[: first - 1] + payloads[nxt - 1 :] + [b"end"]
    assert report.appended == 1


def test_garbage_in_a_middle_segment_resyncs_at_the_next_good_pair(log) -> None:
    path, payloads = log
    recs = _offsets(path)
    seg, off, _ = recs[13]
    in_seg = [i for i, (s, _, _) in enumerate(recs) if s == seg]
    assert in_seg[-1] > 15
    f = path / seg
    data = bytearray(f.read_bytes())
    # Smash records 13 and 14 (lengths included) with seeded garbage.
    end = recs[15][1]
    data[off:end] = random.Random(3).randbytes(end - off)
    f.write_bytes(bytes(data))
    report = salvage(path, segment_size_bytes=SEG)
    [loss] = report.losses
    assert (loss.segment, loss.offset, loss.seq, loss.records) == (seg, off, 14, 2)
    assert [r.payload for r in iter_records(path)] == payloads[:13] + payloads[15:]


def test_a_bad_segment_header_loses_no_record(log) -> None:
    path, payloads = log
    seg = sorted(p.name for p in path.glob("*.wal"))[2]
    _flip(path, seg, 3)
    report = salvage(path, segment_size_bytes=SEG)
    [loss] = report.losses
    assert loss.offset == 0
    assert loss.records == 0
    assert [r.payload for r in iter_records(path)] == payloads


def test_a_torn_tail_alone_is_no_loss_and_changes_nothing(log) -> None:
    path, _ = log
    last = sorted(path.glob("*.wal"))[-1]
    last.write_bytes(last.read_bytes() + b"\x07\x00\x00")
    before = sorted(p.name for p in path.iterdir())
    assert salvage(path).losses == []
    assert sorted(p.name for p in path.iterdir()) == before


def test_a_header_only_segment_is_kept(tmp_path) -> None:
    Wal.open(tmp_path).close()
    assert salvage(tmp_path).losses == []
    assert (tmp_path / "00000000000000000001.wal").stat().st_size == HEADER_SIZE_BYTES


def test_one_good_frame_after_damage_at_the_end_is_kept_and_the_log_opens_again(
    tmp_path: Path, fill
) -> None:
    """The reader's rule (one frame that checks out after a problem is corruption) is salvage's.

    A power cut left this (seed 1130 of the power-loss test): garbage, then
    one frame that checks out, then garbage again. Salvage asked for two
    frames in a row, found none, called it all a torn tail and changed
    nothing: the log still did not open.
    """
    from tiffany.wal.format import segment_name
    from tiffany.wal.frame import encode

    fill(tmp_path, [b"a", b"b"])
    with open(tmp_path / segment_name(1), "ab") as f:
        f.write(b"\x99" * 7 + encode(3, b"alone") + b"\x99" * 5)
    with pytest.raises(WalCorruptionError, match="good records follow"):
        Wal.open(tmp_path)
    report = salvage(tmp_path)
    assert [(loss.seq, loss.bytes_lost) for loss in report.losses] == [(3, 7)]
    with Wal.open(tmp_path) as wal:
        assert wal.durable_seq == 3
    assert [r.payload for r in iter_records(tmp_path)] == [b"a", b"b", b"alone"]
