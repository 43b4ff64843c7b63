"""The WAL against real files: round trips, torn tails at every byte, bit flips, locks, EIO."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiffany.errors import WalCorruptionError, WalFailedError, WalLockedError
from tiffany.wal import FsyncPolicy, Wal, iter_records, repair, verify
from tiffany.wal.format import HEADER_SIZE_BYTES, RECORD_HEADER_SIZE_BYTES, segment_name


def _fill(path: Path, payloads, segment_size=1 << 20, fsync=FsyncPolicy.BATCH) -> list[int]:
    with Wal.open(path, fsync=fsync, segment_size_bytes=segment_size) as wal:
        seqs = [wal.append(1 + i % 5, p) for i, p in enumerate(payloads)]
        wal.commit()
    return seqs


def test_round_trip_and_sequence_numbers(tmp_path):
    payloads = [f"record {i}".encode() * (i % 7 + 1) for i in range(200)]
    assert _fill(tmp_path, payloads) == list(range(1, 201))
    recs = list(iter_records(tmp_path))
    assert [r.seq for r in recs] == list(range(1, 201))
    assert [r.payload for r in recs] == payloads
    assert [r.rtype for r in recs] == [1 + i % 5 for i in range(200)]
    assert [r.seq for r in iter_records(tmp_path, from_seq=150)] == list(range(150, 201))


def test_rotation_keeps_sequence_numbers_without_gaps(tmp_path):
    payloads = [os.urandom(100) for _ in range(300)]
    _fill(tmp_path, payloads, segment_size=2000)
    segments = sorted(tmp_path.glob("*.wal"))
    assert len(segments) > 10
    firsts = [int(p.stem) for p in segments]
    assert firsts[0] == 1
    recs = list(iter_records(tmp_path))
    assert [r.payload for r in recs] == payloads
    for p, nxt in zip(segments, firsts[1:], strict=False):
        last_in_p = max(r.seq for r in recs if r.segment == p.name)
        assert last_in_p + 1 == nxt
    assert [r.seq for r in iter_records(tmp_path, from_seq=271)] == list(range(271, 301))


def test_reopen_continues_the_sequence(tmp_path):
    _fill(tmp_path, [b"a", b"b"])
    with Wal.open(tmp_path) as wal:
        assert wal.durable_seq == 2
        assert wal.append(1, b"c") == 3
    assert [r.payload for r in iter_records(tmp_path)] == [b"a", b"b", b"c"]


def _segment_bytes(path: Path) -> bytes:
    return (path / segment_name(1)).read_bytes()


def test_truncation_at_every_byte_is_a_torn_tail(tmp_path):
    src = tmp_path / "src"
    payloads = [f"payload-{i}".encode() for i in range(6)]
    _fill(src, payloads)
    data = _segment_bytes(src)
    ends = []  # byte offset where each record ends
    off = HEADER_SIZE_BYTES
    for p in payloads:
        off += RECORD_HEADER_SIZE_BYTES + len(p)
        ends.append(off)
    for cut in range(HEADER_SIZE_BYTES, len(data) + 1):
        d = tmp_path / f"c{cut}"
        d.mkdir()
        (d / segment_name(1)).write_bytes(data[:cut])
        complete = sum(1 for e in ends if e <= cut)
        with Wal.open(d) as wal:
            assert wal.durable_seq == complete, cut
            torn = wal.recovery.torn
            assert (torn is None) == (cut in ends or cut == HEADER_SIZE_BYTES), cut
            assert wal.append(9, b"after") == complete + 1
        got = [r.payload for r in iter_records(d)]
        assert got == [*payloads[:complete], b"after"], cut
        if torn is not None:
            assert (d / (segment_name(1) + ".broken")).read_bytes() == data[:cut]


def test_every_bit_flipped_in_a_middle_record_is_corruption(tmp_path):
    src = tmp_path / "src"
    payloads = [b"first record", b"the middle one", b"last record!"]
    _fill(src, payloads)
    data = _segment_bytes(src)
    start = HEADER_SIZE_BYTES + RECORD_HEADER_SIZE_BYTES + len(payloads[0])
    end = start + RECORD_HEADER_SIZE_BYTES + len(payloads[1])
    for byte in range(start, end):
        for bit in range(8):
            bad = bytearray(data)
            bad[byte] ^= 1 << bit
            d = tmp_path / "flip"
            if d.exists():
                for p in d.iterdir():
                    p.unlink()
            else:
                d.mkdir()
            (d / segment_name(1)).write_bytes(bytes(bad))
            with pytest.raises(WalCorruptionError) as info:
                Wal.open(d)
            f = info.value.fields
            assert f["segment"] == segment_name(1)
            assert f["offset"] == start, (byte, bit)
            assert f["seq"] == 2
            assert not verify(d).ok
    # repair truncates at the bad record, keeping a copy
    report = repair(d)
    assert report.truncated == segment_name(1)
    assert report.offset == start
    assert (d / (segment_name(1) + ".broken")).exists()
    assert [r.payload for r in iter_records(d)] == [payloads[0]]
    with Wal.open(d) as wal:
        assert wal.durable_seq == 1


def test_a_flipped_bit_in_the_last_record_is_a_torn_tail(tmp_path):
    _fill(tmp_path, [b"one", b"two"])
    seg = tmp_path / segment_name(1)
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0x01
    seg.write_bytes(bytes(data))
    with Wal.open(tmp_path) as wal:
        assert wal.durable_seq == 1
        assert wal.recovery.torn.reason == "bad checksum"


@pytest.mark.parametrize("tail", [b"\0" * 64, b"\0" * 5, os.urandom(3)])
def test_zero_fill_and_short_garbage_tails(tmp_path, tail):
    _fill(tmp_path, [b"a", b"b"])
    with open(tmp_path / segment_name(1), "ab") as f:
        f.write(tail)
    with Wal.open(tmp_path) as wal:
        assert wal.durable_seq == 2
        assert wal.recovery.torn is not None


def test_corruption_in_an_earlier_segment_is_refused(tmp_path):
    _fill(tmp_path, [os.urandom(100) for _ in range(50)], segment_size=1000)
    first = sorted(tmp_path.glob("*.wal"))[0]
    data = bytearray(first.read_bytes())
    data[-3] ^= 0xFF  # the last record of a segment that is not the last
    first.write_bytes(bytes(data))
    with pytest.raises(WalCorruptionError) as info:
        Wal.open(tmp_path)
    assert info.value.fields["segment"] == first.name


def test_a_second_writer_is_refused_in_process_and_across_processes(tmp_path):
    with Wal.open(tmp_path):
        with pytest.raises(WalLockedError, match=str(os.getpid())):
            Wal.open(tmp_path)
        code = (
            "import sys\nfrom tiffany.wal import Wal\nfrom tiffany.errors import WalLockedError\n"
            f"try:\n    Wal.open({str(tmp_path)!r})\n"
            "except WalLockedError as e:\n    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 3, proc.stderr
        assert "in use by pid" in proc.stdout
    with Wal.open(tmp_path):  # released on close
        pass


def test_an_fsync_error_stops_the_wal_and_acknowledges_nothing_after(tmp_path):
    calls = {"n": 0}

    def flaky(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.EIO, "injected EIO")
        os.fdatasync(fd)

    wal = Wal.open(tmp_path, fdatasync=flaky)
    wal.append(1, b"a")
    assert wal.commit() == 1
    wal.append(1, b"b")
    with pytest.raises(WalFailedError) as info:
        wal.commit()
    assert isinstance(info.value.__cause__, OSError)
    assert wal.durable_seq == 1
    with pytest.raises(WalFailedError):
        wal.append(1, b"c")
    with pytest.raises(WalFailedError):
        wal.commit()
    assert calls["n"] == 2  # never retried
    wal.close()
    # "b" was written but never acknowledged; "c" never reached the file
    assert [r.payload for r in iter_records(tmp_path)] in ([b"a"], [b"a", b"b"])


def test_a_write_error_is_fail_stop_too(tmp_path):
    def no_space(fd: int, data) -> int:
        raise OSError(errno.ENOSPC, "no space")

    with Wal.open(tmp_path) as wal:
        pass
    wal = Wal.open(tmp_path, write=no_space)
    wal.append(1, b"x")
    with pytest.raises(WalFailedError, match="no space"):
        wal.commit()
    assert wal.durable_seq == 0
    wal.close()


def test_new_segments_fsync_the_directory(tmp_path):
    synced: list[Path] = []
    with Wal.open(tmp_path, segment_size_bytes=200, fsync_dir=synced.append) as wal:
        for _ in range(20):
            wal.append(1, b"x" * 40)
        wal.commit()
    assert len(synced) == len(list(tmp_path.glob("*.wal")))
    assert all(p == tmp_path for p in synced)


def test_policy_always_syncs_every_append(tmp_path):
    n = {"syncs": 0}

    def count(fd: int) -> None:
        n["syncs"] += 1

    with Wal.open(tmp_path, fsync=FsyncPolicy.ALWAYS, fdatasync=count) as wal:
        for _ in range(5):
            wal.append(1, b"x")
            assert wal.durable_seq == wal.next_seq - 1
    assert n["syncs"] == 5


def test_bad_types_and_sizes_are_refused(tmp_path):
    with Wal.open(tmp_path) as wal:
        with pytest.raises(ValueError, match="0 is reserved"):
            wal.append(0, b"x")
        with pytest.raises(ValueError, match="exceeds"):
            wal.append(1, b"x" * (64 * 1024 * 1024 + 1))
