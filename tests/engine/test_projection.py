"""The projector's journal source: a live WAL tailed up to its durable seq.

A real :class:`~tiffany.wal.Wal` (small segments, so the tail crosses
rotations) writes while :class:`~tiffany.projector.tail.WalTail` reads;
what the tail returns is checked against the WAL's own reader
(:func:`~tiffany.projector.tail.decoded_batches`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import structlog

from tiffany.errors import WalCorruptionError
from tiffany.projector.link import ProjectorLink
from tiffany.projector.process import DURABLE, READ_WANTS, READER_WAITS, Notices
from tiffany.projector.tail import WalTail, decoded_batches, journal_reaches
from tiffany.wal import Wal
from tiffany.wal.segments import ARCHIVE_DIR_NAME, list_segments
from tiffany.wire.records import Dispatch, encode
from tiffany.wire.shards import seq_base

PREFIX = (7).to_bytes(4, "little")


def _append(wal: Wal, n: int, first: int) -> None:
    for i in range(first, first + n):
        wal.append(3, encode(PREFIX, Dispatch(i, 1, "sleep", "x" * (i % 50))))


def _everything(wal_dir: Path) -> list[tuple[int, int, int, list[object]]]:
    return [rec for batch in decoded_batches(wal_dir) for rec in batch]


@pytest.mark.parametrize("preallocate", [False, True])
def test_the_tail_reads_up_to_the_seq_it_is_given_across_segments(
    tmp_path: Path, preallocate: bool
) -> None:
    """With preallocation, what the tail read past the records was zeros records overwrote."""
    wal_dir = tmp_path / "wal"
    wal = Wal.open(
        wal_dir, segment_size_bytes=400, preallocate=preallocate, _spawn=lambda prepare: prepare()
    )
    tail = WalTail(wal_dir)
    got: list[tuple[int, int, int, object]] = []
    try:
        for round_ in range(20):
            _append(wal, 7, round_ * 10)
            told = wal.commit()  # what the engine told the projector
            _append(wal, 3, round_ * 10 + 7)
            wal.commit()  # on disk too, but not told yet
            last = got[-1][0] if got else 0
            got += tail.read(last, told, limit=5)  # a part...
            got += tail.read(got[-1][0], told, limit=1_000)  # ...then the rest
            assert got[-1][0] == told  # never past what it was told
        got += tail.read(got[-1][0], wal.durable_seq, limit=1_000)
        segments = list_segments(wal_dir)
        assert len(segments) > 5  # the tail crossed rotations
        zero_filled = [s for s in segments if s.path.stat().st_size == 400]
        assert len(zero_filled) > 5 if preallocate else not zero_filled
    finally:
        wal.close()
        tail.close()
    assert got == _everything(wal_dir)
    assert [seq for seq, *_ in got] == list(range(1, 201))


def test_a_new_tail_starts_after_any_seq(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    with Wal.open(wal_dir, segment_size_bytes=300) as wal:
        _append(wal, 60, 0)
        durable = wal.commit()
    on_disk = _everything(wal_dir)
    for after in (0, 1, 17, 33, 59):
        tail = WalTail(wal_dir)
        assert tail.read(after, durable, limit=1_000) == on_disk[after:]
        assert tail.read(durable, durable, limit=1_000) == []
        with pytest.raises(WalCorruptionError, match=f"seq {durable + 1}"):
            tail.read(durable, durable + 1, limit=1_000)  # told durable, yet not there
        tail.close()


def test_a_bad_record_below_the_durable_seq_is_corruption(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    with Wal.open(wal_dir) as wal:
        _append(wal, 10, 0)
        durable = wal.commit()
    (seg,) = list_segments(wal_dir)
    data = bytearray(seg.path.read_bytes())
    data[100] ^= 0xFF  # inside the records
    seg.path.write_bytes(bytes(data))
    tail = WalTail(wal_dir)
    with pytest.raises(WalCorruptionError) as err:
        tail.read(0, durable, limit=1_000)
    tail.close()
    assert err.value.fields["segment"] == seg.name


class _NoticePipe:
    """A pipe with the projector's :class:`Notices` on its read end (what the engine writes to)."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.notices = Notices(self.r)

    def send(self, *values: int) -> None:
        os.write(self.w, b"".join(DURABLE.pack(v) for v in values))

    def close_writer(self) -> None:
        os.close(self.w)
        self.w = -1


@pytest.fixture
def pipe() -> Iterator[_NoticePipe]:
    made = _NoticePipe()
    yield made
    os.close(made.r)
    if made.w >= 0:
        os.close(made.w)


def test_notices_coalesce_to_the_newest_durable_seq(pipe: _NoticePipe) -> None:
    notices = pipe.notices
    pipe.send(3, 9, 12)
    assert notices.wait() == 12  # three messages, one answer
    os.write(pipe.w, DURABLE.pack(20)[:5])  # half a message: waited for
    os.write(pipe.w, DURABLE.pack(20)[5:])
    assert notices.wait() == 20
    pipe.close_writer()
    assert notices.wait() == 20
    assert notices.closed


def test_notices_taken_without_blocking_answer_at_once_with_the_newest(
    pipe: _NoticePipe,
) -> None:
    """What the projector does after its gather pause: take what came, never wait."""
    notices = pipe.notices
    assert notices.wait(block=False) == 0  # nothing yet: at once
    pipe.send(7, 11)
    assert notices.wait(block=False) == 11
    assert notices.wait(block=False) == 11  # nothing new: at once, the same
    assert not notices.closed


def test_notices_say_whether_a_read_waits_and_a_reader_alone_is_news(pipe: _NoticePipe) -> None:
    """The top bit: a read waits on the store; it ends the projector's gathering."""
    notices = pipe.notices
    pipe.send(5)
    assert notices.wait() == 5
    assert not notices.reader_waits
    pipe.send(5 | READER_WAITS)  # the same seq, a reader now waits
    assert notices.wait() == 5  # news all the same: a blocking wait returns
    assert notices.reader_waits
    pipe.send(9 | READER_WAITS, 12)  # the newest counts
    assert notices.wait() == 12
    assert not notices.reader_waits


def test_a_read_that_waits_for_a_durable_seq_ends_the_gathering(pipe: _NoticePipe) -> None:
    """``READ_WANTS``: the seq a read waits for; apply now once it is durable and unapplied."""
    notices = pipe.notices
    pipe.send(8)
    assert notices.wait() == 8
    assert not notices.read_waits(applied=5)  # nobody waits: gather
    pipe.send(7 | READ_WANTS)  # a read waits for seq 7
    assert notices.wait() == 8  # news, though the durable seq is the same
    assert notices.wanted == 7
    assert notices.read_waits(applied=5)  # durable, not applied: now
    assert not notices.read_waits(applied=7)  # applied already
    pipe.send(12 | READ_WANTS, 10 | READER_WAITS)
    assert notices.wait() == 10  # a read's seq is never taken for a durable one
    assert not notices.read_waits(applied=8)  # seq 12 is not durable yet: gather
    pipe.send(12 | READER_WAITS)
    assert notices.wait() == 12
    assert notices.read_waits(applied=10)  # now it is


def test_the_engine_tells_the_projector_while_a_read_waits(tmp_path: Path) -> None:
    """Each commit's message carries the bit exactly while a ``min_seq`` read waits."""
    r, w = os.pipe()
    link = ProjectorLink(tmp_path, {})
    writer = os.fdopen(w, "wb", buffering=0)
    try:
        link._attach(cast("Any", SimpleNamespace(stdin=writer)))
        notices = Notices(r)
        link.committed(10)
        assert (notices.wait(), notices.reader_waits) == (10, False)
        answer = link.when_projected(11, 5.0)  # a read waits for seq 11: told at once
        assert (notices.wait(), notices.reader_waits, notices.wanted) == (10, True, 11)
        assert not notices.read_waits(applied=10)  # not durable yet
        link.committed(11)
        assert (notices.wait(), notices.reader_waits) == (11, True)
        assert notices.read_waits(applied=10)
        link._take_report({"last_seq": 11})  # the store holds it: the read is answered
        assert answer.result(1) == {"last_seq": 11, "reached": True}
        link.committed(12)
        assert (notices.wait(), notices.reader_waits) == (12, False)
    finally:
        writer.close()
        os.close(r)


def test_a_journal_reaches_the_seqs_it_held_even_after_releasing_them(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    with Wal.open(wal_dir, segment_size_bytes=400) as wal:
        _append(wal, 40, 1)
        wal.commit()
        last = wal.durable_seq
    segments = list_segments(wal_dir)
    assert len(segments) > 2
    assert journal_reaches(wal_dir, last)
    assert not journal_reaches(wal_dir, last + 1)  # the store would be ahead of it
    for seg in segments[:-1]:  # retention deleted every segment but the live one
        seg.path.unlink()
    released = segments[-1].first_seq - 1
    assert journal_reaches(wal_dir, released)
    assert journal_reaches(wal_dir, last)
    assert not journal_reaches(wal_dir, last + 1)


def _journal(tmp_path: Path, records: int, first_seq: int = 1) -> tuple[Path, int]:
    """A closed WAL of ``records`` records in small segments: its directory and durable seq."""
    wal_dir = tmp_path / "wal"
    with Wal.open(wal_dir, segment_size_bytes=400, first_seq=first_seq) as wal:
        _append(wal, records, 1)
        return wal_dir, wal.commit()


def _new_tail_reads(wal_dir: Path, after: int, upto: int) -> tuple[list[Any], list[dict[str, Any]]]:
    """What a new tail reads after ``after`` (up to ``upto``), and what it logged."""
    tail = WalTail(wal_dir)
    try:
        with structlog.testing.capture_logs() as logs:
            return tail.read(after, upto, limit=1_000), logs
    finally:
        tail.close()


def test_a_tail_behind_the_live_segments_reads_the_archive_first(tmp_path: Path) -> None:
    """A new store (or one restored from an old backup) starts before the live segments.

    Retention archived the oldest segments: the tail reads them, then the live
    ones, as one log. It used to start at the first live segment and skip them:
    a store given a fresh database lost every run of the archive, silently.
    """
    wal_dir, durable = _journal(tmp_path, 60)
    on_disk = _everything(wal_dir)
    segments = list_segments(wal_dir)
    assert len(segments) > 3
    (wal_dir / ARCHIVE_DIR_NAME).mkdir()
    for seg in segments[:3]:  # what the checkpointer does under TIFFANY_WAL_RETAIN=archive
        seg.path.rename(wal_dir / ARCHIVE_DIR_NAME / seg.path.name)
    assert _everything(wal_dir) == on_disk  # the WAL's reader reads it as one log
    for after in (0, 5, segments[2].first_seq, segments[3].first_seq - 1):
        tail = WalTail(wal_dir)
        try:
            got = tail.read(after, durable, limit=7)  # a part, then the rest
            got += tail.read(got[-1][0], durable, limit=1_000)
        finally:
            tail.close()
        assert got == on_disk[after:], after


def test_a_tail_behind_deleted_segments_starts_after_them_and_says_so(tmp_path: Path) -> None:
    wal_dir, durable = _journal(tmp_path, 60)
    on_disk = _everything(wal_dir)
    segments = list_segments(wal_dir)
    for seg in segments[:2]:  # TIFFANY_WAL_RETAIN=delete
        seg.path.unlink()
    first = segments[2].first_seq
    got, logs = _new_tail_reads(wal_dir, 0, durable)
    assert got == on_disk[first - 1 :]
    (warned,) = [e for e in logs if e["event"] == "projector.history_deleted"]
    assert (warned["wanted_seq"], warned["first_seq"]) == (1, first)


def test_a_second_engines_journal_starts_where_its_seqs_do_without_a_warning(
    tmp_path: Path,
) -> None:
    base = seq_base(1)
    wal_dir, durable = _journal(tmp_path, 20, first_seq=base + 1)
    got, logs = _new_tail_reads(wal_dir, 0, durable)  # from a fresh store's mark
    assert [seq for seq, *_ in got] == list(range(base + 1, durable + 1))
    assert [e for e in logs if e["log_level"] == "warning"] == []
