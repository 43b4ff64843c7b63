"""``RunReads``: the store reads the API does, on the store it has.

Every read but one is the same on both stores: a SQLAlchemy session in the
threadpool (:meth:`RunReads.read`), at most :data:`STORE_READERS` at a time.
The one that differs is the read clients poll, a run with its steps and
tasks (:meth:`RunReads.run_detail`), which is kept off the thread hop:

- :class:`SqliteReads` (the embedded store): on the event loop, through a
  connection of its own, bounded (:data:`LOOP_READ_DISPATCHES`, a lock held
  past :data:`LOOP_BUSY_TIMEOUT_MS`), else in the threadpool;
- :class:`PgReads` (a PostgreSQL store): awaited on the loop through an
  asyncio pool, the three SELECTs in one pipeline.

The implementation is chosen once from the store's URL (:func:`reads_for`).

Discussion: a small read costs less than the thread it would run in. In the
threadpool of a busy API each statement gives the GIL up and waits to take
it back (up to the interpreter's switch interval), and the thread's answer
waits for the loop; on the loop the read waits for its socket in the loop's
own poll (bench/read_your_writes.py measures both). What shapes the rows is
Python, which holds the GIL on any thread.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, runtime_checkable

import anyio
import anyio.to_thread
import msgspec
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session

from tiffany.config import conninfo
from tiffany.errors import TiffanyError
from tiffany.store import make_reader_engine, queries, session_factory

if TYPE_CHECKING:  # the postgres extra: imported where a PostgreSQL store is read
    from tiffany.ports.pg import AsyncPool

__all__ = [
    "ASYNC_READERS",
    "LOOP_BUSY_TIMEOUT_MS",
    "LOOP_READ_DISPATCHES",
    "STORE_READERS",
    "PgReads",
    "RunReads",
    "SqliteReads",
    "StoreUnavailable",
    "Timer",
    "reads_for",
]

#: Store reads in flight at once; the store's connection pool holds as many
#: connections and no more. A read beyond them waits for a turn instead of
#: opening a connection of its own: with the pool's default overflow, a
#: burst of reads on PostgreSQL opened and closed connections, each a
#: backend's fork and a connect, which tipped the machine into saturation.
STORE_READERS: Final = 16
#: A run read on the event loop has at most this many dispatches; a larger
#: one is read in the threadpool. Its rows and the Python that shapes them
#: grow with its dispatches, so this bounds how long the loop is held.
LOOP_READ_DISPATCHES: Final = 500
#: How long a SQLite read on the event loop waits for a lock before it is
#: handed to the threadpool instead, in milliseconds. In WAL mode a reader
#: meets a lock only while the WAL is being recovered or reset.
LOOP_BUSY_TIMEOUT_MS: Final = 10
#: Connections of a PostgreSQL store's reads on the event loop: a read holds
#: one for its one round trip, so a few serve hundreds of reads a second.
ASYNC_READERS: Final = 8

T = TypeVar("T")

#: Told ``(part, seconds)`` of each read: ``queue`` (its wait for a turn)
#: and ``store`` (the read); the API adds them to ``Server-Timing``.
Timer = Callable[[str, float], None]

_UNAVAILABLE_HINT: Final = "is the engine running (it creates and migrates the store)?"


class StoreUnavailable(TiffanyError):
    """The SQL store cannot be read (not created yet, or unreachable): HTTP 503."""

    code = "store.unavailable"


def _no_timer(_part: str, _seconds: float) -> None:
    pass


@runtime_checkable
class RunReads(Protocol):
    """The API's reads of the store (module docstring).

    Attributes:
        engine: The store's SQLAlchemy engine (its dialect compiles queries).
    """

    engine: Engine

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)`` in the threadpool with a fresh session.

        Raises:
            StoreUnavailable: The store has no schema yet or cannot be reached.
        """

    async def run_detail(self, run_id: str, *, outputs: bool = True) -> dict[str, Any] | None:
        """A run with its steps and tasks (``queries.run_detail_of``), or None if unknown.

        Raises:
            StoreUnavailable: As :meth:`read`.
        """

    def close(self) -> Awaitable[None]:
        """Close the store's connections (the app stops)."""


class _ThreadReads:
    """:meth:`RunReads.read`, the same on both stores: a session in the threadpool."""

    def __init__(self, url: str, timer: Timer) -> None:
        # As many connections as reads in flight (STORE_READERS), kept open.
        self.engine = make_reader_engine(url, STORE_READERS)
        self.sessions = session_factory(self.engine)
        self.timer = timer
        self._readers: anyio.CapacityLimiter | None = None  # made in the event loop

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)`` in the threadpool with a fresh session.

        Raises:
            StoreUnavailable: The store has no schema yet or cannot be reached.
        """
        began = 0.0

        def work() -> T:
            nonlocal began
            began = time.perf_counter()
            try:
                with self.sessions() as session:
                    return fn(session)
            except DBAPIError as exc:
                if not exc.connection_invalidated:
                    raise
            # A connection the server dropped (no ping before each read:
            # store.make_reader_engine): the pool has let it go; once more.
            with self.sessions() as session:
                return fn(session)

        if self._readers is None:
            self._readers = anyio.CapacityLimiter(STORE_READERS)
        called = time.perf_counter()
        try:
            return await anyio.to_thread.run_sync(work, limiter=self._readers)
        except (OperationalError, ProgrammingError) as exc:
            raise StoreUnavailable(
                f"the store cannot be read: {exc.orig or exc}", hint=_UNAVAILABLE_HINT
            ) from exc
        finally:
            if began:  # its turn came: the wait for it, and the read
                self.timer("queue", began - called)
                self.timer("store", time.perf_counter() - began)

    async def close(self) -> None:
        """Close the store's connections."""
        self.engine.dispose()


class SqliteReads(_ThreadReads):
    """The embedded store's reads: a run's detail on the event loop, bounded (module docstring).

    Args:
        url: The store's SQLAlchemy URL.
        timer: Told how long each read queued and took.
    """

    def __init__(self, url: str, timer: Timer = _no_timer) -> None:
        super().__init__(url, timer)
        #: The connection of the reads on the loop.
        self.loop_engine = make_reader_engine(url, 1, busy_timeout_ms=LOOP_BUSY_TIMEOUT_MS)
        self._loop_sessions = session_factory(self.loop_engine)

    async def run_detail(self, run_id: str, *, outputs: bool = True) -> dict[str, Any] | None:
        """On the loop unless too large (``queries.TooLarge``), locked, or failing: then a thread.

        The driver's errors are :meth:`read`'s to report, as for any read.
        """
        began = time.perf_counter()
        try:
            with self._loop_sessions() as session:
                return queries.run_detail_of(session, run_id, LOOP_READ_DISPATCHES, outputs=outputs)
        except (queries.TooLarge, DBAPIError):
            pass
        finally:
            self.timer("store", time.perf_counter() - began)
        return await self.read(lambda s: queries.run_detail_of(s, run_id, outputs=outputs))

    async def close(self) -> None:
        """Close both engines' connections."""
        self.loop_engine.dispose()
        await super().close()


class PgReads(_ThreadReads):
    """A PostgreSQL store's reads: a run's detail awaited on an asyncio pool (module docstring).

    Args:
        url: The store's SQLAlchemy URL.
        timer: Told how long each read queued and took.
    """

    def __init__(self, url: str, timer: Timer = _no_timer) -> None:
        super().__init__(url, timer)
        from tiffany.ports.pg import AsyncPool  # the postgres extra: imported only here

        #: The connections of the reads on the loop.
        self.pool: AsyncPool = AsyncPool(
            conninfo(url), ASYNC_READERS, application_name="tiffany-api", configure=_msgspec_json
        )

    async def run_detail(self, run_id: str, *, outputs: bool = True) -> dict[str, Any] | None:
        """The three SELECTs in one pipeline, awaited on the loop."""
        dialect = self.engine.dialect
        return await self.read_async(
            lambda c: queries.run_detail_async(c, dialect, run_id, outputs=outputs)
        )

    async def read_async(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Await ``fn(connection)`` on the asyncio pool.

        As :meth:`read`: a connection the server dropped is retried once on
        a new one, and a store that cannot be read (no schema yet, the
        server away) is a :class:`StoreUnavailable`.
        """
        import psycopg

        pool = self.pool
        called = time.perf_counter()
        began = 0.0

        async def once() -> T:
            nonlocal began
            async with pool.connection() as conn:
                began = time.perf_counter()
                return await fn(conn)

        try:
            try:
                return await once()
            except psycopg.OperationalError:
                # A connection the server dropped: the pool let it go; once more.
                return await once()
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            raise StoreUnavailable(
                f"the store cannot be read: {exc}", hint=_UNAVAILABLE_HINT
            ) from exc
        finally:
            if began:
                self.timer("queue", began - called)
                self.timer("store", time.perf_counter() - began)

    async def close(self) -> None:
        """Close the pool's idle connections and the engine's."""
        await self.pool.close()
        await super().close()


async def _msgspec_json(conn: Any) -> None:
    """Decode JSON columns as the store's engine does (``store.session.make_engine``)."""
    from psycopg.types.json import set_json_loads

    set_json_loads(msgspec.json.decode, conn)


def reads_for(url: str, timer: Timer = _no_timer) -> RunReads:
    """The reads of the store at ``url``: PostgreSQL's or the embedded one's.

    Args:
        url: The store's SQLAlchemy URL (``TIFFANY_DATABASE_URL``).
        timer: Told ``(part, seconds)`` of each read (``Server-Timing``).
    """
    if url.startswith("postgresql"):
        return PgReads(url, timer)
    return SqliteReads(url, timer)
