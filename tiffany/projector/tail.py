"""Bring the SQL store up to date with the WAL (off the scheduler thread).

The store is a projection of the journal: records are applied in batches,
idempotently by WAL sequence number, after they are durable. Two readers
feed it:

* :func:`decoded_batches` reads a WAL that nothing writes to any more
  (``tiffany run`` projects once its loop has stopped; ``tiffany db
  rebuild``), with the WAL reader's torn-tail and corruption rules;
* :class:`WalTail` follows a live WAL for the service's projector process
  (``projector_proc.py``): it reads only records the engine has said are
  durable, and only the bytes appended since its last read.

Both are a :class:`JournalSource` to the projector process: "the records
after seq S, up to the durable seq N". When the journal moves to PostgreSQL
(issue #11), a source that selects those rows takes the WAL's place and the
projector's loop stays as it is.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, cast

import structlog

from tiffany.errors import WalCorruptionError
from tiffany.projector import Projector
from tiffany.projector.apply import Decoded
from tiffany.store import make_engine
from tiffany.store.migrate import upgrade
from tiffany.wal import Source, spans_of
from tiffany.wal.format import HEADER_SIZE_BYTES
from tiffany.wal.frame import SHORT_HEADER, SHORT_PAYLOAD, Frame, is_benign
from tiffany.wal.frame import decode as decode_frame
from tiffany.wal.identity import identity
from tiffany.wal.segments import (
    ARCHIVE_DIR_NAME,
    REMEDY,
    Segment,
    check_header,
    history_segments,
    list_segments,
)
from tiffany.wire.records import decode_record
from tiffany.wire.shards import engine_of, seq_base

if TYPE_CHECKING:
    from tiffany.wal.pg import PgStream

log = structlog.get_logger(__name__)

__all__ = [
    "BATCH_RECORDS",
    "DecodedRecord",
    "JournalSource",
    "StreamTail",
    "WalTail",
    "decode_record",
    "decoded_batches",
    "journal_id",
    "journal_reaches",
    "journal_tail",
    "project_wal",
]

#: Records applied per transaction.
BATCH_RECORDS: Final = 5_000
#: Bytes a tail reads from a segment at once.
READ_BYTES: Final = 4 * 1024 * 1024
#: Bytes a tail reads again where its buffer stopped (see :meth:`WalTail._more`).
REREAD_BYTES: Final = 64 * 1024

#: A decoded journal record: ``(seq, rtype, run_no, record)``.
DecodedRecord = Decoded


class JournalSource(Protocol):
    """Where the projector reads journal records from (the WAL today, PostgreSQL next)."""

    def read(self, after: int, upto: int, limit: int) -> list[DecodedRecord]:
        """Return the records with ``after < seq <= upto``, in order, ``limit`` at most.

        ``upto`` is durable: the journal holds every record up to it, and a
        source that cannot read one raises (it never returns fewer).
        """
        ...

    def close(self) -> None:
        """Release what the source holds open."""
        ...


def decoded_batches(
    wal_dir: Source, batch_records: int = BATCH_RECORDS, from_seq: int = 1
) -> Iterator[list[Decoded]]:
    """Yield the log's journal records as decoded ``(seq, rtype, run_no, record)`` batches."""
    batch: list[Decoded] = []
    for seq, rtype, data, start, end, _ in spans_of(wal_dir, from_seq=from_seq):
        run_no, record = decode_record(rtype, data[start:end])
        batch.append((seq, rtype, run_no, record))
        if len(batch) >= batch_records:
            yield batch
            batch = []
    if batch:
        yield batch


class WalTail:
    """Reads a live WAL's durable records, resuming where the last read stopped.

    Invariants:

    * It never reads past the ``upto`` it is given (the durable seq): bytes
      the writer has written but not yet synced are never projected, so a
      record the store holds is never one a power loss could take back.
    * A position is ``(segment, offset, seq)``; a read that does not start
      where the last one ended (a new projector process, a retried batch)
      seeks: the segment that holds the seq is scanned from its header.
      Otherwise only the bytes written since are read (``pread``).
    * Bytes it read past the records may have been zeros that records have
      overwritten since (a preallocated segment, docs/wal-format.md): where
      a frame does not check out, the file is read again from there before
      anything is concluded.
    * A read behind the live segments reads the archive first (retention
      moved the oldest segments there): a new store catches up from seq 1.
    * Frames are checked as the WAL reader checks them (``frame.decode``).
      Below the durable seq, a frame cut short is the end of a segment the
      writer has left (the next one starts at the next seq); anything else
      that stops the read below the durable seq (a bad frame, a missing
      segment) is corruption and raises.

    Args:
        wal_dir: The WAL directory.
    """

    def __init__(self, wal_dir: Path) -> None:
        self.wal_dir = wal_dir
        self._seg: Segment | None = None
        self._fd = -1
        self._data = b""  # bytes read from the segment and not consumed yet
        self._pos = 0  # where the next record starts in _data
        self._end = 0  # the file offset just past _data
        self._seq = 0  # the seq of the record at _pos (0: no position)
        self._fresh_at = -1  # the file offset the buffer was last read again from

    def read(self, after: int, upto: int, limit: int) -> list[DecodedRecord]:
        """See :meth:`JournalSource.read`."""
        if self._seq != after + 1:
            self._seek(after + 1)
        out: list[DecodedRecord] = []
        while self._seq <= upto and len(out) < limit:
            frame = decode_frame(self._data, self._pos)
            if isinstance(frame, Frame):
                run_no, record = decode_record(frame.rtype, self._data[frame.start : frame.end])
                out.append((self._seq, frame.rtype, run_no, record))
                self._pos = frame.end
                self._seq += 1
            else:
                self._more(frame)
        return out

    def close(self) -> None:
        """Close the open segment."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._seg = None
        self._seq = 0

    # -- reading ------------------------------------------------------------------

    def _more(self, problem: str) -> None:
        """Read on after ``problem`` at ``_pos``: read there again, more bytes, or the next segment.

        Raises:
            WalCorruptionError: None of them: a record below the durable seq is missing.
        """
        at = self._end - len(self._data) + self._pos  # the file offset of _pos
        if at != self._fresh_at:
            # What the buffer holds from here may predate the record (zero
            # fill the writer has overwritten since): read it again first.
            self._data = os.pread(self._fd, REREAD_BYTES, at)
            self._pos, self._end, self._fresh_at = 0, at + len(self._data), at
            return
        if problem in (SHORT_HEADER, SHORT_PAYLOAD) and self._fill():
            return
        following = [s for s in self._segments() if s.first_seq == self._seq]
        if following and is_benign(problem):
            self._open(following[0])
            return
        seg = self._seg.name if self._seg is not None else str(self.wal_dir)
        offset = self._end - len(self._data) + self._pos
        raise WalCorruptionError(
            f"{seg}: {problem} at offset {offset} (record seq {self._seq}, "
            f"which the engine made durable){REMEDY}",
            segment=seg,
            offset=offset,
            seq=self._seq,
            reason=problem,
        )

    def _fill(self) -> bool:
        """Append the segment's next bytes to the buffer (a record runs past it); False if none."""
        more = os.pread(self._fd, READ_BYTES, self._end)
        if not more:
            return False
        self._data = self._data[self._pos :] + more
        self._pos = 0
        self._end += len(more)
        return True

    def _segments(self) -> list[Segment]:
        """The segments on disk, archived ones included, in order.

        A tail behind the live segments (a new store, the projector's first
        start on a data dir that retention archived) reads the archive first,
        as the WAL's reader does. The live directory is listed before the
        archive: a segment the checkpointer archives between the two listings
        is then seen twice (the archive's path kept), never missed.
        """
        by_seq = {s.first_seq: s for s in list_segments(self.wal_dir)}
        by_seq.update((s.first_seq, s) for s in list_segments(self.wal_dir / ARCHIVE_DIR_NAME))
        return [by_seq[seq] for seq in sorted(by_seq)]

    def _open(self, seg: Segment) -> None:
        self.close()
        try:
            self._fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # archived since it was listed: the same bytes, moved
            self._fd = os.open(
                self.wal_dir / ARCHIVE_DIR_NAME / seg.path.name, os.O_RDONLY | os.O_CLOEXEC
            )
        header = os.pread(self._fd, HEADER_SIZE_BYTES, 0)
        check_header(seg, header)
        self._seg = seg
        self._data, self._pos, self._end = b"", 0, HEADER_SIZE_BYTES
        self._seq = seg.first_seq
        self._fresh_at = -1

    def _seek(self, seq: int) -> None:
        """Position on record ``seq`` (or on the first one kept, if it is older)."""
        segments = self._segments()
        holding = [s for s in segments if s.first_seq <= seq] or segments[:1]
        if holding and seq < holding[0].first_seq > seq_base(engine_of(holding[0].first_seq)) + 1:
            # Records this store never held were deleted (TIFFANY_WAL_RETAIN=delete):
            # their runs are in no store now. Say so once, where the tail starts.
            log.warning(
                "projector.history_deleted",
                wal=str(self.wal_dir),
                wanted_seq=seq,
                first_seq=holding[0].first_seq,
                note="the WAL's segments before first_seq were deleted by retention; "
                "this store starts after them and will not show their runs",
            )
        if not holding:
            raise WalCorruptionError(
                f"{self.wal_dir}: no segment holds seq {seq}{REMEDY}",
                segment=str(self.wal_dir),
                offset=0,
                seq=seq,
                reason="no segment",
            )
        self._open(holding[-1])
        while self._seq < seq:
            frame = decode_frame(self._data, self._pos)
            if isinstance(frame, Frame):
                self._pos = frame.end
                self._seq += 1
            else:
                self._more(frame)


class StreamTail:
    """Reads a PostgreSQL journal stream's committed records (``journal=postgres``).

    The :class:`JournalSource` of the projector when the journal lives in
    the database: one query per read on a kept connection
    (:meth:`~tiffany.wal.pg.PgStream.rows`), bounded by the seq the engine
    says is committed.
    """

    def __init__(self, stream: PgStream) -> None:
        self.stream = stream

    def read(self, after: int, upto: int, limit: int) -> list[DecodedRecord]:
        """See :meth:`JournalSource.read`."""
        out: list[DecodedRecord] = []
        for seq, rtype, payload in self.stream.rows(after, upto, limit):
            run_no, record = decode_record(rtype, payload)
            out.append((seq, rtype, run_no, record))
        return out

    def close(self) -> None:
        """Close the stream's connection."""
        self.stream.close()


def journal_id(source: Source) -> str | None:
    """The name a store keeps of the journal it projects.

    A WAL's is in its ``JOURNAL`` file (``file:<hex>``, ``tiffany/wal/identity.py``;
    None for a WAL no writer has named yet); a PostgreSQL stream's is
    ``postgres:<stream>``.
    """
    if isinstance(source, str | os.PathLike):
        return identity(source)
    return f"postgres:{cast('PgStream', source).stream}"


def journal_reaches(source: Source, seq: int) -> bool:
    """Whether the journal ever held ``seq``: it holds a record at or after it (reads a segment).

    A WAL whose records up to ``seq`` were all released (retention) reaches
    it too, when its segments begin after ``seq``.
    """
    if next(iter(spans_of(source, from_seq=seq)), None) is not None:
        return True
    if isinstance(source, str | os.PathLike):
        held = history_segments(Path(source))
        return bool(held) and held[-1].first_seq > seq
    return False


def journal_tail(source: Source) -> JournalSource:
    """The projector's tail of ``source``: a WAL directory, or a PostgreSQL stream."""
    if isinstance(source, str | os.PathLike):
        return WalTail(Path(source))
    return StreamTail(cast("PgStream", source))


def project_wal(database_url: str, wal_dir: Source, shard: int = 0) -> int:
    """Apply the journal's records the store has not seen yet; return the store's last seq.

    ``shard``: the engine whose journal it is (``tiffany/wire/shards.py``).
    """
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        projector = Projector(
            engine,
            journal_id(wal_dir),
            shard=shard,
            reaches=functools.partial(journal_reaches, wal_dir),
        )
        for batch in decoded_batches(wal_dir, from_seq=projector.last_seq + 1):
            projector.apply(batch)
        return projector.last_seq
    finally:
        engine.dispose()
