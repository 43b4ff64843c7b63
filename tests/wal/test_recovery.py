"""Torn tails and corruption: truncation at every byte, every bit flipped, repair."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import structlog

from tiffany.errors import WalCorruptionError, WalFormatError
from tiffany.wal import Recovery, Wal, iter_records, repair, verify
from tiffany.wal.format import (
    HEADER_SIZE_BYTES,
    MAGIC,
    RECORD_HEADER_SIZE_BYTES,
    encode_header,
    segment_name,
)
from tiffany.wal.reader import TORN_CREATION

# Three segments of three records (9 + 12..14 bytes each; rotation at 100 bytes).
PAYLOADS = [f"payload-{i:02d}".encode() + b"!" * (i % 3) for i in range(9)]
SEGMENT_SIZE = 100


@pytest.fixture
def small_log(tmp_path, fill) -> Path:
    src = tmp_path / "src"
    fill(src, PAYLOADS, segment_size_bytes=SEGMENT_SIZE)
    assert len(list(src.glob("*.wal"))) == 3
    return src


def _layout(src: Path) -> list[tuple[str, bytes, list[int]]]:
    """Each segment: (name, bytes, [offset where each of its records ends])."""
    out = []
    for seg in sorted(src.glob("*.wal")):
        data = seg.read_bytes()
        ends, off = [], HEADER_SIZE_BYTES
        while off < len(data):
            off += RECORD_HEADER_SIZE_BYTES + int.from_bytes(data[off + 4 : off + 8], "little")
            ends.append(off)
        out.append((seg.name, data, ends))
    return out


def _copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def test_truncation_at_every_byte_is_a_torn_tail(tmp_path, small_log):
    """A crash can cut the log anywhere: it opens with every record before the cut."""
    layout = _layout(small_log)
    before = 0  # records in the segments before the cut one
    for k, (name, data, ends) in enumerate(layout):
        for cut in range(len(data) + 1):
            d = _copy(small_log, tmp_path / "cut")
            for later, _, _ in layout[k + 1 :]:
                (d / later).unlink()
            (d / name).write_bytes(data[:cut])
            complete = before + sum(1 for e in ends if e <= cut)
            with Wal.open(d, segment_size_bytes=SEGMENT_SIZE) as wal:
                assert wal.durable_seq == complete, (name, cut)
                rec = wal.recovery
                clean = cut == HEADER_SIZE_BYTES or cut in ends
                assert (rec is None) == clean, (name, cut, rec)
                if rec is not None:
                    assert rec.segment == name
                    assert rec.bytes_dropped + rec.offset == cut
                    # The cut bytes, moved aside (nothing to keep for an empty file).
                    kept = (d / rec.copy).read_bytes() if rec.copy is not None else b""
                    assert kept == data[rec.offset : cut]
                    if cut < HEADER_SIZE_BYTES:
                        assert rec.reason == TORN_CREATION
                assert wal.append(9, b"after") == complete + 1
            got = list(iter_records(d))
            assert [r.payload for r in got] == [*PAYLOADS[:complete], b"after"], (name, cut)
            assert [r.seq for r in got] == list(range(1, complete + 2))
            assert verify(d).ok
        before += len(ends)


def _flip_cases(layout):
    """The middle record of the last segment (good records after it, in the last
    segment: the tricky case), and the last record of the first segment."""
    _, _, last_ends = layout[-1]
    _, _, first_ends = layout[0]
    n_before_last = sum(len(e) for _, _, e in layout[:-1])
    return [
        (len(layout) - 1, last_ends[0], last_ends[1], n_before_last + 2),
        (0, first_ends[-2], first_ends[-1], len(first_ends)),
    ]


@pytest.mark.parametrize("case", [0, 1], ids=["middle-of-last-segment", "end-of-first-segment"])
def test_every_bit_flipped_in_a_record_is_corruption_and_repair_cuts_there(
    tmp_path, small_log, case
):
    layout = _layout(small_log)
    k, start, end, seq = _flip_cases(layout)[case]
    name, data, _ = layout[k]
    for byte in range(start, end):
        for bit in range(8):
            d = _copy(small_log, tmp_path / "flip")
            bad = bytearray(data)
            bad[byte] ^= 1 << bit
            (d / name).write_bytes(bytes(bad))
            with pytest.raises(WalCorruptionError) as info:
                Wal.open(d)
            assert info.value.fields["segment"] == name
            assert info.value.fields["offset"] == start, (byte, bit)
            assert info.value.fields["seq"] == seq
            assert f"offset {start}" in str(info.value)
            report = verify(d)
            assert not report.ok
            assert report.corruption["offset"] == start
            assert report.last_seq == seq - 1
            with pytest.raises(WalCorruptionError):
                list(iter_records(d))
            assert (d / name).read_bytes() == bytes(bad)  # open and verify change nothing
            fixed = repair(d)
            assert (fixed.truncated, fixed.offset) == (name, start)
            assert fixed.moved_aside == [n for n, _, _ in layout[k + 1 :]]
            assert (d / fixed.copies[0]).read_bytes() == bytes(bad)[start:]  # the cut bytes
            assert fixed.records_kept == seq - 1
            assert [r.payload for r in iter_records(d)] == PAYLOADS[: seq - 1]
            with Wal.open(d) as wal:
                assert wal.recovery is None
                assert wal.append(1, b"next") == seq


def test_a_flipped_bit_in_the_last_record_is_cut_with_an_error_log(tmp_path, fill):
    fill(tmp_path, [b"one", b"two"])
    seg = tmp_path / segment_name(1)
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0x01
    seg.write_bytes(bytes(data))
    with structlog.testing.capture_logs() as logs, Wal.open(tmp_path) as wal:
        assert wal.durable_seq == 1
        assert wal.recovery == Recovery(
            segment_name(1), len(data) - 12, 12, "bad checksum", segment_name(1) + ".broken"
        )
    assert [(e["event"], e["log_level"]) for e in logs] == [("wal.torn_tail_truncated", "error")]


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (b"\0" * 64 + b"\x05", "zero fill"),  # zeros that do not run to the end
        (b"\0" * 4 + b"\x01", "short header"),
        (b"\x01\x02\x03", "short header"),
        (b"\x11\x22\x33\x44\x10\x00\x00\x00\x01abc", "short payload"),
        (b"\xff" * 40, "impossible length"),
        (b"\x07\x00\x00\x00\x00\x00\x00\x00\x00" + b"\x05" * 30, "reserved type"),
    ],
)
def test_zero_fill_and_garbage_tails(tmp_path, fill, tail, reason):
    fill(tmp_path, [b"a", b"b"])
    with open(tmp_path / segment_name(1), "ab") as f:
        f.write(tail)
    with structlog.testing.capture_logs() as logs, Wal.open(tmp_path) as wal:
        assert wal.durable_seq == 2
        assert wal.recovery is not None
        assert (wal.recovery.reason, wal.recovery.bytes_dropped) == (reason, len(tail))
    benign = reason in ("zero fill", "short header", "short payload")
    assert logs[0]["log_level"] == ("warning" if benign else "error")
    assert verify(tmp_path).torn is None  # cut


def test_a_torn_tail_is_reported_by_verify_and_readers_stop_before_it(tmp_path, fill):
    fill(tmp_path, [b"a", b"b"])
    with open(tmp_path / segment_name(1), "ab") as f:
        f.write(b"\x07" * 20)
    report = verify(tmp_path)
    assert report.ok
    assert (report.records, report.last_seq, report.torn.reason) == (2, 2, "impossible length")
    assert report.to_dict()["torn"]["bytes_dropped"] == 20
    assert [r.payload for r in iter_records(tmp_path)] == [b"a", b"b"]
    assert repair(tmp_path).truncated is None  # a torn tail is left for Wal.open


def test_garbage_after_a_torn_record_that_hides_a_valid_frame_is_corruption(tmp_path, fill):
    """A problem followed by a record that checks out is never a torn tail."""
    from tiffany.wal.frame import encode

    fill(tmp_path, [b"a"])
    with open(tmp_path / segment_name(1), "ab") as f:
        f.write(b"\x99" * 7 + encode(3, b"hidden"))
    with pytest.raises(WalCorruptionError, match="good records follow"):
        Wal.open(tmp_path)


def test_corruption_in_a_segment_that_is_not_the_last_is_refused(tmp_path, fill):
    fill(tmp_path, [os.urandom(100) for _ in range(50)], segment_size_bytes=1000)
    first = sorted(tmp_path.glob("*.wal"))[0]
    data = first.read_bytes()
    first.write_bytes(data[:-3])  # a torn tail, but not in the last segment
    with pytest.raises(WalCorruptionError, match="not the last") as info:
        Wal.open(tmp_path)
    assert info.value.fields["segment"] == first.name
    assert info.value.fields["reason"] == "short payload"


def test_a_missing_segment_is_a_sequence_gap(tmp_path, fill):
    fill(tmp_path, [b"x" * 50 for _ in range(12)], segment_size_bytes=200)
    segments = sorted(tmp_path.glob("*.wal"))
    segments[1].unlink()
    with pytest.raises(WalCorruptionError, match="sequence gap") as info:
        Wal.open(tmp_path)
    assert info.value.fields["segment"] == segments[2].name
    with pytest.raises(WalCorruptionError, match="sequence gap"):
        list(iter_records(tmp_path))
    fixed = repair(tmp_path)
    assert fixed.moved_aside == [p.name for p in segments[2:]]
    assert [r.seq for r in iter_records(tmp_path)] == list(range(1, int(segments[1].stem)))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda h: b"NOTAWAL!" + h[8:], "bad magic"),
        (lambda h: h[:12] + b"\x07" + h[13:], "bad header checksum"),
    ],
)
def test_a_bad_segment_header_is_corruption(tmp_path, fill, damage, match):
    fill(tmp_path, [b"a", b"b"])
    seg = tmp_path / segment_name(1)
    data = seg.read_bytes()
    seg.write_bytes(damage(data[:HEADER_SIZE_BYTES]) + data[HEADER_SIZE_BYTES:])
    with pytest.raises(WalCorruptionError, match=match) as info:
        Wal.open(tmp_path)
    assert info.value.fields["offset"] == 0
    fixed = repair(tmp_path)
    assert fixed.moved_aside == [segment_name(1)]
    with Wal.open(tmp_path) as wal:  # starts afresh; the damaged file is kept
        assert wal.next_seq == 1
    assert (tmp_path / (segment_name(1) + ".broken")).exists()


def test_a_header_naming_another_first_seq_is_corruption(tmp_path):
    (tmp_path / segment_name(5)).write_bytes(encode_header(4))
    with pytest.raises(WalCorruptionError, match="header says first seq 4"):
        Wal.open(tmp_path)


def test_another_format_version_is_a_format_error(tmp_path):
    from crc32c import crc32c

    head = MAGIC + (2).to_bytes(2, "little") + bytes(2) + (1).to_bytes(8, "little")
    (tmp_path / segment_name(1)).write_bytes(head + crc32c(head).to_bytes(4, "little"))
    with pytest.raises(WalFormatError, match="version 2"):
        Wal.open(tmp_path)


def test_an_all_zero_last_segment_is_a_torn_creation(tmp_path, fill):
    fill(tmp_path, [b"a" * 50 for _ in range(4)], segment_size_bytes=100)
    last = sorted(tmp_path.glob("*.wal"))[-1]
    last.write_bytes(bytes(4096))
    with Wal.open(tmp_path, segment_size_bytes=100) as wal:
        assert wal.recovery.reason == TORN_CREATION
        assert wal.next_seq == int(last.stem)
        assert (tmp_path / wal.recovery.copy).read_bytes() == bytes(4096)
        # Set aside (no new space needed); the previous segment takes appends,
        # and the next rotation creates the segment again.
        assert not last.exists()
        assert wal.append(1, b"b" * 50) == int(last.stem)
    assert last.read_bytes()[:HEADER_SIZE_BYTES] == encode_header(int(last.stem))


def test_broken_copies_are_never_overwritten(tmp_path, fill):
    fill(tmp_path, [b"a"])
    seg = tmp_path / segment_name(1)
    for i in range(3):
        with open(seg, "ab") as f:
            f.write(bytes([i + 1]) * 3)
        with Wal.open(tmp_path) as wal:
            assert wal.recovery is not None
    broken = sorted(p.name for p in tmp_path.iterdir() if ".broken" in p.name)
    assert broken == [seg.name + s for s in (".broken", ".broken.2", ".broken.3")]
    assert len(list(iter_records(tmp_path))) == 1


def test_repair_is_refused_while_the_log_is_open(tmp_path):
    from tiffany.errors import WalLockedError

    with Wal.open(tmp_path), pytest.raises(WalLockedError):
        repair(tmp_path)


def test_an_empty_or_missing_directory_reads_as_empty(tmp_path):
    assert list(iter_records(tmp_path / "nope")) == []
    assert verify(tmp_path / "nope").records == 0
