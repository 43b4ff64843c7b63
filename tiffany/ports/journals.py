"""``Journals``: the engines' journals as their readers and operators see them.

Each engine drives a journal of its own (``serve --engines N``: engine ``i``'s
seqs from ``i << 40``, :mod:`tiffany.wire.shards`). Where those journals are
is chosen once from the settings by :func:`journals_for`:

- :class:`FileJournals` (the embedded default): a WAL of segment files in
  each engine's home under the data dir (``<data dir>/wal``,
  ``<data dir>/engines/<i>/wal``), locked by the engine that writes it;
- :class:`PgJournals` (``TIFFANY_JOURNAL=postgres``): a stream of rows per
  engine in the database (``main``, ``main-1``...), leased by the engine
  that writes it, from any host.

What the rest asks of the port: how many engines' journals there are, a
records :data:`~tiffany.wal.Source` for engine ``i`` (no lock or lease
taken), whether engine ``i`` is known to be stopped, every engine kept off
its journal while the store is rebuilt, and what the backend can do
(:attr:`Journals.repairable`, :attr:`Journals.leased`,
:attr:`Journals.in_database`). A command that works on one backend only
asks for what it needs (:meth:`Journals.wal_dir`, :meth:`Journals.streams`)
and the other backend refuses with :class:`~tiffany.errors.JournalUnsupported`,
whose message the CLI prints as it is.

Discussion: the writer's side (opening the log for appending, waiting for a
lease, taking a free slot) stays in the engine's composition root
(``tiffany/engine/__init__.py``: ``journal_log``, ``take_slot``), which asks
this port whether the journal is leased: only an engine opens a journal for
writing, and only there does a lease's owner mean anything.

Rejected: capabilities as one ``backend`` string compared at each use: that
is the branch this port removes, under another name. A flag says what a
caller relies on (a directory it may cut, a lease it may wait for).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tiffany.config import Settings
from tiffany.errors import JournalUnsupported, WalLockedError
from tiffany.wire.shards import engine_stream, homes

if TYPE_CHECKING:  # serve's parent process reads no journal: the WAL's modules stay out
    from tiffany.wal import Source

__all__ = ["FileJournals", "Journals", "PgJournals", "journals_for"]

#: What :meth:`PgJournals.wal_dir` refuses with (``wal verify``/``repair`` on a stream).
NOT_FILES = (
    "the journal is in PostgreSQL (TIFFANY_JOURNAL=postgres); this command "
    "works on the file WAL (the database keeps its own integrity)"
)
#: What :meth:`FileJournals.streams` refuses with (``wal streams`` on the file WAL).
NO_STREAMS = (
    "the journal is the file WAL (one engine, one data dir): "
    "`tiffany status` shows it; streams exist with TIFFANY_JOURNAL=postgres"
)


@runtime_checkable
class Journals(Protocol):
    """The engines' journals, read without a lock or a lease (module docstring)."""

    #: Segment files a person may verify segment by segment and repair (cut,
    #: salvage); a database keeps its own integrity.
    repairable: bool
    #: Each journal is leased by the engine writing it: an engine may wait for
    #: its lease (a standby), and the streams can be listed with their holders.
    leased: bool
    #: Reading a journal needs the database's URL (a verify worker gets it).
    in_database: bool

    def count(self) -> int:
        """How many engines' journals there are (at least 1)."""
        ...

    def source(self, engine: int = 0) -> Source:
        """Where engine ``engine``'s records are read (no lock, no lease)."""
        ...

    def stopped(self, engine: int) -> bool:
        """Whether engine ``engine`` is known to be stopped (nothing runs its runs now)."""
        ...

    def engines_stopped(self) -> contextlib.AbstractContextManager[None]:
        """Keep every engine off its journal while the ``with`` body runs (a store's rebuild).

        A rebuild empties the store and projects the journals again: beside
        a running engine it would race that engine's projector, and read
        records the engine has written but not yet made durable.

        Raises:
            WalLockedError: An engine runs on one of the journals.
        """
        ...

    def wal_dir(self, engine: int = 0) -> Path:
        """Engine ``engine``'s WAL directory (it may not exist).

        Raises:
            JournalUnsupported: The journals are not files.
        """
        ...

    def streams(self) -> list[dict[str, Any]]:
        """Every stream: its head, epoch, lease holder and time left.

        Raises:
            JournalUnsupported: The journals are not streams.
            WalError: The database cannot be read.
        """
        ...


class FileJournals:
    """A WAL directory in each engine's home under the data dir.

    Args:
        settings: The process's settings (its data dir, its engine).
    """

    repairable = True
    leased = False
    in_database = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def count(self) -> int:
        """Engine 0's, and one per engine home in the data dir (``wire.shards.homes``)."""
        return len(homes(self.settings.data_dir))

    def source(self, engine: int = 0) -> Source:
        """The engine's WAL directory: readers read its files."""
        return self.wal_dir(engine)

    def stopped(self, engine: int) -> bool:
        """Nobody holds the engine's WAL lock (:func:`~tiffany.wal.lock.holder`)."""
        from tiffany.wal.lock import holder

        return holder(self.wal_dir(engine)) is None

    @contextlib.contextmanager
    def engines_stopped(self) -> Iterator[None]:
        """Hold every WAL's lock (as ``wal repair`` does): no engine runs, none starts."""
        from tiffany.wal.lock import lock_dir, unlock

        fds: list[int] = []
        try:
            for engine in range(self.count()):
                wal_dir = self.wal_dir(engine)
                if wal_dir.is_dir():
                    fds.append(lock_dir(wal_dir))
            yield
        finally:
            for fd in fds:
                unlock(fd)

    def wal_dir(self, engine: int = 0) -> Path:
        """``<engine home>/wal``."""
        return Path(self.settings.for_engine(engine).data_dir) / "wal"

    def streams(self) -> list[dict[str, Any]]:
        """Refused: a file WAL has no streams."""
        raise JournalUnsupported(NO_STREAMS)


class PgJournals:
    """A stream per engine in the database (``<journal_stream>``, ``<journal_stream>-<i>``).

    Args:
        settings: The process's settings (the database, the stream's name).
    """

    repairable = False
    leased = True
    in_database = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def count(self) -> int:
        """Engine 0's stream, and each numbered one after it while the database has it."""
        return self._count({s["stream"] for s in self.streams()})

    def _count(self, names: set[str]) -> int:
        n = 1
        while engine_stream(self.settings.journal_stream, n) in names:
            n += 1
        return n

    def source(self, engine: int = 0) -> Source:
        """The engine's stream, read without its lease."""
        from tiffany.wal.pg import PgStream  # the postgres extra: imported only here

        return PgStream(
            self.settings.database_url, engine_stream(self.settings.journal_stream, engine)
        )

    def stopped(self, engine: int) -> bool:
        """Never known here: an engine on another host may hold the stream."""
        return False

    @contextlib.contextmanager
    def engines_stopped(self) -> Iterator[None]:
        """Refuse while an engine's stream is leased (a lease is the engines' to take)."""
        found = self.streams()
        ours = {
            engine_stream(self.settings.journal_stream, e)
            for e in range(self._count({row["stream"] for row in found}))
        }
        for row in found:
            if row["stream"] in ours and row["held"]:
                raise WalLockedError(
                    f"the journal stream {row['stream']!r} is held by {row['owner']} "
                    f"for {row['lease_left_s']} s more: an engine is running on it "
                    "(stop it first)",
                    stream=row["stream"],
                    owner=row["owner"],
                )
        yield

    def wal_dir(self, engine: int = 0) -> Path:
        """Refused: the journal is rows, not files."""
        raise JournalUnsupported(NOT_FILES)

    def streams(self) -> list[dict[str, Any]]:
        """The database's streams (:func:`tiffany.wal.pg.streams`)."""
        from tiffany.wal.pg import streams

        return streams(self.settings.database_url)


def journals_for(settings: Settings) -> Journals:
    """The engines' journals as ``settings`` place them: files in the data dir, or streams."""
    if settings.journal == "postgres":
        return PgJournals(settings)
    return FileJournals(settings)
