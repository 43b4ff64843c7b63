"""What the journal needs from a log, whichever backend holds it.

Two backends implement it: :class:`~tiffany.wal.writer.Wal` (segment files
under a data dir, the embedded default) and ``tiffany.wal.pg.PgLog`` (a
stream of rows in PostgreSQL, for engines that share a database). The
journal, replay, verify and recovery see only this surface: a gapless
sequence of ``(seq, type byte, opaque payload)`` records, appended in a
buffer and made durable by one group commit at a time.

A reader names its log by a :data:`Source`: a WAL directory (read from the
files, no lock needed) or an object with a ``spans`` method (a PostgreSQL
stream); :func:`spans_of` reads either.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, runtime_checkable

from tiffany.wal.reader import Position, Span, iter_spans
from tiffany.wal.writer import CommitListener, RotateListener

__all__ = ["Log", "LogReader", "Source", "spans_of"]


@runtime_checkable
class LogReader(Protocol):
    """A log that can be read in seq order (a PostgreSQL stream; a WAL directory is a path)."""

    def spans(self, from_seq: int = 1, checked: Mapping[str, int] | None = None) -> Iterator[Span]:
        """Yield the records with ``seq >= from_seq`` as :data:`~tiffany.wal.Span`."""
        ...


class Log(LogReader, Protocol):
    """An open log the journal appends to (one writer at a time).

    ``append`` buffers a record and returns its seq; ``commit`` makes the
    buffer durable in one step (an fdatasync, a transaction) and moves
    ``durable_seq``; after a failed commit the log is ``failed`` for good
    (fail-stop) and every later ``append`` or ``commit`` raises
    :class:`~tiffany.errors.WalFailedError`.
    """

    on_commit: CommitListener | None
    on_rotate: RotateListener | None
    on_lost: Callable[[], None] | None
    on_failed: Callable[[], None] | None
    on_renewed: Callable[[], None] | None

    @property
    def lease_deadline(self) -> float | None:
        """Until when (``lease_clock()``) the writer surely holds its stream; None: no lease."""
        ...

    @property
    def checked(self) -> Mapping[str, int]:
        """Where the reads of this open need not check checksums again (``iter_spans``)."""
        ...

    @property
    def next_seq(self) -> int:
        """The seq the next ``append`` returns."""
        ...

    @property
    def durable_seq(self) -> int:
        """The last seq made durable; 0 if none."""
        ...

    @property
    def failed(self) -> bool:
        """True once a commit failed (fail-stop) or the log was fenced off."""
        ...

    def append(self, rtype: int, payload: bytes) -> int:
        """Buffer one record; return its seq."""
        ...

    def commit(self) -> int:
        """Make the buffer durable; return the new ``durable_seq``."""
        ...

    def close(self) -> None:
        """Commit what is buffered (unless failed) and let the log go."""
        ...


#: Where a reader finds a log: a WAL directory, or a log object that reads itself.
Source = str | os.PathLike[str] | LogReader


def spans_of(
    source: Source,
    from_seq: int = 1,
    checked: Mapping[str, int] | None = None,
    at: Position | None = None,
    ends: Mapping[str, int] | None = None,
) -> Iterator[Span]:
    """Yield ``source``'s records with ``seq >= from_seq`` (:func:`~tiffany.wal.iter_spans`).

    ``at``, ``ends``: where a file WAL's walk may resume, and how much of a
    segment to read (a stream ignores them).
    """
    if isinstance(source, str | os.PathLike):
        return iter_spans(source, from_seq, checked, at, ends)
    return source.spans(from_seq, checked)
