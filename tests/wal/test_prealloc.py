"""Preallocation: segments zero-filled ahead, zero fill to the end as the end of records.

docs/wal-format.md, "Preallocation" and "Zero fill to the end". The
preparation runs inline here (``_spawn``) so that each test knows when the
file is ready; the service runs it on a worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog

from tiffany.wal import Wal, iter_records, verify
from tiffany.wal.format import HEADER_SIZE_BYTES, segment_name
from tiffany.wal.prealloc import PREPARED_NAME, Preparer
from tiffany.wal.salvage import scan_salvage
from tiffany.wal.segments import list_segments
from tiffany.wal.writer import GROW_AHEAD_BYTES

SEG = 4096


def _inline(prepare):
    prepare()


def _open(path: Path, **kw) -> Wal:
    return Wal.open(path, segment_size_bytes=SEG, preallocate=True, _spawn=_inline, **kw)


def _payload(i: int) -> bytes:
    return i.to_bytes(4, "little") + bytes([i % 251 + 1]) * (40 + i % 60)


def test_zero_fill_to_the_end_is_where_records_end_and_the_writer_writes_over_it(
    tmp_path: Path, fill
) -> None:
    fill(tmp_path, [b"a", b"b"])
    seg = tmp_path / segment_name(1)
    end = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(bytes(10_000))  # as a preallocated segment's unwritten part
    report = verify(tmp_path)
    assert (report.ok, report.torn, report.last_seq) == (True, None, 2)
    with structlog.testing.capture_logs() as logs, Wal.open(tmp_path) as wal:
        assert (wal.recovery, wal.durable_seq) == (None, 2)  # nothing cut, nothing logged
        wal.append(1, b"c")
        wal.commit()
    assert logs == []
    assert seg.stat().st_size == end + 10_000  # written over the zeros, not after them
    assert [r.payload for r in iter_records(tmp_path)] == [b"a", b"b", b"c"]
    assert scan_salvage(tmp_path)[1] == []  # salvage sees no loss either


def test_zeros_followed_by_anything_are_still_a_torn_tail(tmp_path: Path, fill) -> None:
    fill(tmp_path, [b"a"])
    with open(tmp_path / segment_name(1), "ab") as f:
        f.write(bytes(5000) + b"\x05")
    with Wal.open(tmp_path) as wal:
        assert wal.recovery is not None
        assert (wal.recovery.reason, wal.recovery.bytes_dropped) == ("zero fill", 5001)


def test_rotation_takes_the_prepared_segment_and_a_growing_one_is_left_for_it(
    tmp_path: Path,
) -> None:
    payloads = [_payload(i) for i in range(300)]
    with _open(tmp_path) as wal:
        for i, p in enumerate(payloads):
            wal.append(1 + i % 5, p)
            if i % 4 == 3:
                wal.commit()
        durable = wal.commit()
    segments = list_segments(tmp_path)
    sizes = [s.path.stat().st_size for s in segments]
    # The first segment grew (zero-filled ahead by its commits, here to the
    # end: GROW_AHEAD_BYTES > SEG) until a prepared one was ready, half a
    # segment in, then was left early; every later one was prepared.
    assert HEADER_SIZE_BYTES < _records_end(segments[0].path) < 3 * SEG // 4  # left early
    assert len(segments) > 5
    assert all(size == SEG for size in sizes)
    assert not (tmp_path / PREPARED_NAME).exists()  # closing removed the spare
    assert [r.payload for r in iter_records(tmp_path)] == payloads
    report = verify(tmp_path)
    assert (report.ok, report.torn, report.last_seq) == (True, None, durable)
    with _open(tmp_path) as wal:  # a restart appends where the records end
        assert (wal.recovery, wal.durable_seq) == (None, durable)
        wal.append(1, b"after")
        wal.commit()
    assert [r.payload for r in iter_records(tmp_path)] == [*payloads, b"after"]


def test_a_short_lived_log_prepares_no_segment_and_zero_fills_only_ahead(tmp_path: Path) -> None:
    calls: list[object] = []
    with Wal.open(tmp_path, preallocate=True, _spawn=calls.append) as wal:
        for i in range(50):
            wal.append(1, _payload(i))
            wal.commit()
    assert calls == []  # under 1 MiB since the open: no preparation asked for
    [seg] = list_segments(tmp_path)
    # One fill ahead of the records, made by the first commit and not yet crossed.
    first_end = HEADER_SIZE_BYTES + 9 + len(_payload(0))  # a record's header is 9 bytes
    assert seg.path.stat().st_size == first_end + GROW_AHEAD_BYTES


def test_a_growing_segment_is_zero_filled_ahead_and_a_restart_writes_over_the_zeros(
    tmp_path: Path,
) -> None:
    payloads = [os.urandom(2999) + b"\x01" for _ in range(200)]  # 600 KB: crossed twice
    with Wal.open(tmp_path, preallocate=True, _spawn=lambda prepare: None) as wal:
        for i, p in enumerate(payloads):
            wal.append(1, p)
            wal.commit()
            size = (tmp_path / segment_name(1)).stat().st_size
            end = _records_end(tmp_path / segment_name(1))
            assert end < size <= end + GROW_AHEAD_BYTES, i  # always zeros ahead to write into
    with Wal.open(tmp_path, preallocate=True, _spawn=lambda prepare: None) as wal:
        assert wal.recovery is None  # the zero fill is no torn tail
        wal.append(1, b"after")
        wal.commit()
    assert [r.payload for r in iter_records(tmp_path)] == [*payloads, b"after"]
    report = verify(tmp_path)
    assert (report.ok, report.torn, report.last_seq) == (True, None, 201)


def test_a_fill_ahead_that_fails_is_logged_and_the_records_are_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import tiffany.wal.writer as writer

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with structlog.testing.capture_logs() as logs, _open(tmp_path) as wal:
        monkeypatch.setattr(writer.os, "pwrite", full)  # once open (its lock file is written)
        for i in range(5):
            wal.append(1, _payload(i))
            assert wal.commit() == i + 1  # not the records' failure: no fail-stop
    failed = [e for e in logs if e["event"] == "wal.grow_ahead_failed"]
    assert len(failed) == 1  # not again in that segment
    assert failed[0]["log_level"] == "warning"
    assert [r.payload for r in iter_records(tmp_path)] == [_payload(i) for i in range(5)]


def _records_end(path: Path) -> int:
    """Where a segment's records end (its zero fill, if any, begins)."""
    data = path.read_bytes()
    return len(data.rstrip(b"\0"))


def test_a_preparation_that_fails_is_logged_and_segments_grow_as_before(tmp_path: Path) -> None:
    with _open(tmp_path) as wal:
        (tmp_path / PREPARED_NAME).mkdir()  # the zero-filled file cannot be created
        with structlog.testing.capture_logs() as logs:
            for i in range(300):
                wal.append(1, _payload(i))
                wal.commit()
        (tmp_path / PREPARED_NAME).rmdir()
    failed = [e for e in logs if e["event"] == "wal.prepare_failed"]
    assert len(failed) == 1  # asked again only after RETRY_S
    assert failed[0]["log_level"] == "warning"
    segments = list_segments(tmp_path)
    assert len(segments) > 5
    # No prepared segment: each grew by its commits, zero-filled ahead.
    assert all(_records_end(s.path) < SEG for s in segments)
    assert [r.payload for r in iter_records(tmp_path)] == [_payload(i) for i in range(300)]


def test_an_open_removes_a_file_an_earlier_process_left(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / PREPARED_NAME).write_bytes(bytes(100))  # a preparation cut short
    with _open(tmp_path):
        assert not (tmp_path / PREPARED_NAME).exists()


def test_the_worker_thread_prepares_and_close_stops_it(tmp_path: Path) -> None:
    prep = Preparer(tmp_path, 3 << 20)
    prep.request()
    thread = prep._thread
    assert thread is not None
    thread.join(timeout=30)
    assert prep.ready
    assert os.path.getsize(prep.path) == 3 << 20
    assert prep.path.read_bytes() == bytes(3 << 20)
    prep.request()  # one is ready: nothing more to do
    assert prep._thread is thread
    prep.close()
    assert not prep.path.exists()


@pytest.mark.parametrize("size", [SEG, SEG + 1])
def test_a_rename_never_replaces_a_segment(tmp_path: Path, size: int) -> None:
    from tiffany.wal.segments import install_segment

    (tmp_path / segment_name(5)).write_bytes(b"keep")
    prepared = tmp_path / PREPARED_NAME
    prepared.write_bytes(bytes(size))
    with pytest.raises(FileExistsError):
        install_segment(tmp_path, prepared, 5, write=os.write, fsync=None)
    assert (tmp_path / segment_name(5)).read_bytes() == b"keep"
    fd = install_segment(tmp_path, prepared, 6, write=os.write, fsync=os.fsync)
    os.close(fd)
    assert (tmp_path / segment_name(6)).stat().st_size == size  # headed, not truncated


def test_a_reader_given_the_writers_ends_reads_no_zero_fill(tmp_path: Path) -> None:
    """The checkpointer's reads of the live segment stop where its records end."""
    from tiffany.wal import iter_spans

    with _open(tmp_path) as wal:
        for i in range(120):
            wal.append(1, _payload(i))
            wal.commit()
        assert wal.preallocated
        ends = wal.durable_ends()
        (live,) = ends
        assert live == list_segments(tmp_path)[-1].name
        assert (tmp_path / live).stat().st_size == SEG > ends[live]
        spans = list(iter_spans(tmp_path, 1, None, None, ends))
        assert [s[2][s[3] : s[4]] for s in spans] == [_payload(i) for i in range(120)]
        assert {len(s[2]) for s in spans if s[5] == live} == {ends[live]}  # no zeros read
