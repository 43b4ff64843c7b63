"""The API's per-app state and the route dependencies that hand it out.

One :class:`ApiState` per app (built by ``create_app``, kept on
``app.state.tiffany``): the settings, the store's engine and session
factory, the control-channel client, the activity relay and the metrics
registry. Nothing here exists at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

import anyio
import anyio.to_thread
import msgspec
from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import HTTPConnection

from tiffany import shards
from tiffany.api import timing
from tiffany.api.feed import FeedRelay
from tiffany.api.metrics import ApiMetrics
from tiffany.config import Settings, conninfo
from tiffany.control import AsyncControlClient, ControlUnavailable
from tiffany.errors import TiffanyError
from tiffany.store import make_reader_engine, queries, session_factory

if TYPE_CHECKING:
    from tiffany.api.engines import Engines

__all__ = [
    "ASYNC_READERS",
    "LOOP_BUSY_TIMEOUT_MS",
    "LOOP_READ_DISPATCHES",
    "MIN_SEQ_WAIT_S",
    "STORE_READERS",
    "ApiState",
    "BeyondJournal",
    "State",
    "StoreBehind",
    "StoreUnavailable",
    "Watermark",
    "get_state",
]

#: How long a read with ``min_seq`` waits for the store to pass it, in seconds.
MIN_SEQ_WAIT_S: Final = 5.0
#: Store reads in flight at once; the store's connection pool holds as many
#: connections and no more (``app.create_app``). A read beyond them waits for
#: a turn instead of opening a connection of its own: with the pool's default
#: overflow, a burst of reads on PostgreSQL opened and closed connections
#: (hundreds in a short run under load), and each new one cost a backend's fork
#: and a connect, which tipped the machine into saturation.
STORE_READERS: Final = 16
#: A run read on the event loop (:meth:`ApiState.read_on_loop`) has at most
#: this many dispatches; a larger one is read in the threadpool. Its rows
#: and the Python that shapes them grow with its dispatches, so this bound
#: keeps the loop's hold to a millisecond or two (bench/README.md).
LOOP_READ_DISPATCHES: Final = 500
#: How long a SQLite read on the event loop waits for a lock before it is
#: handed to the threadpool instead, in milliseconds. In WAL mode a reader
#: meets a lock only while the WAL is being recovered or reset.
LOOP_BUSY_TIMEOUT_MS: Final = 10
#: Connections of a PostgreSQL store's reads on the event loop (:meth:`ApiState.read_async`):
#: a read holds one for its one round trip, so a few serve hundreds of reads a second.
ASYNC_READERS: Final = 8
#: How much longer the control request may take than that (the engine answers
#: at its own deadline; this only covers the trip), in seconds.
CONTROL_MARGIN_S: Final = 2.0

T = TypeVar("T")


class StoreUnavailable(TiffanyError):
    """The SQL store cannot be read (not created yet, or unreachable): HTTP 503."""

    code = "store.unavailable"


class StoreBehind(StoreUnavailable):
    """The store has not reached the ``min_seq`` a reader asked for in time: HTTP 503.

    Fields: ``min_seq`` (what was asked) and ``store_seq`` (where the store is).
    """

    code = "store.behind"


class BeyondJournal(TiffanyError):
    """A ``min_seq`` above every seq the journal has written: no wait could meet it (HTTP 422).

    Fields: ``min_seq`` (what was asked) and ``written_seq`` (the journal's last seq).
    """

    code = "request.invalid"
    http_status = 422


class Watermark:
    """The store's watermark as this API process has been told it, and the reads waiting on it.

    While any read waits, one ``wait_projected(last + 1)`` request is out on
    the control channel: the engine answers it when the projector next
    reports progress, this resolves every read the new watermark covers and,
    if reads still wait, asks again. So the engine answers one request per
    projector report however many reads wait (a subscription that exists
    only while someone listens), and a read waits for the first report that
    covers it, never for a timer.

    Args:
        control: The control-channel client.
        read_mark: Reads the store's own watermark (when the engine is away).
    """

    def __init__(
        self, control: AsyncControlClient, read_mark: Callable[[], Awaitable[int]]
    ) -> None:
        self.control = control
        self.read_mark = read_mark
        #: The highest watermark learnt (it only grows).
        self.seq = 0
        self._waiters: list[tuple[int, int, asyncio.Future[int]]] = []  # a heap by seq
        #: The journal's last written seq as of the newest answer (it only grows).
        self.written = 0
        #: Moves of the mark are pushed to :meth:`push` (the PostgreSQL store's
        #: notifications), so a read waits for them even with no engine to ask.
        self.pushed = False
        self._order = itertools.count()
        self._task: asyncio.Task[None] | None = None

    async def wait(self, seq: int, timeout: float) -> int:
        """Return the watermark once it is at least ``seq``, or when ``timeout`` ran out."""
        if seq <= self.seq:
            return self.seq
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._order), fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._follow())
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return self.seq

    async def _follow(self) -> None:
        while True:
            self._waiters = [w for w in self._waiters if not w[2].done()]
            heapq.heapify(self._waiters)
            if not self._waiters:
                return
            # Waiters registered before this request are judged by its answer.
            sent = next(self._order)
            top = max(w[0] for w in self._waiters)
            try:
                answer = await self.control.request(
                    "wait_projected",
                    timeout=MIN_SEQ_WAIT_S + CONTROL_MARGIN_S,
                    seq=self.seq + 1,
                    wait_s=MIN_SEQ_WAIT_S,
                    max_seq=top,
                )
                self._advance(int(answer.get("last_seq", 0)))
                written = answer.get("written_seq")
                if isinstance(written, int) and written < top:
                    self._refuse_beyond(written, sent)
            except ControlUnavailable:
                with contextlib.suppress(StoreUnavailable):
                    self._advance(await self.read_mark())  # once: no engine, no news after
                if not self.pushed:
                    self._settle()
                # Pushed (the database notifies every move of the mark): the
                # reads wait for those notifications, each to its deadline.
                return
            except TiffanyError:
                self._settle()
                return

    def push(self, seen: int) -> None:
        """The store's mark moved to ``seen`` (a notification): wake the reads it covers."""
        self._advance(seen)

    def _advance(self, seen: int) -> None:
        self.seq = max(self.seq, seen)
        while self._waiters and self._waiters[0][0] <= self.seq:
            fut = heapq.heappop(self._waiters)[2]
            if not fut.done():
                fut.set_result(self.seq)

    def _refuse_beyond(self, written: int, sent: int) -> None:
        """Fail the reads (registered before ``sent``) that ask for more than was ever written.

        Discussion: a seq a client holds (a 201's, an event's ``wal_seq``)
        was written before the client could send it, so it is at most the
        ``written_seq`` of any answer to a request sent after the read
        arrived; only such reads are judged, so a fresh seq never races
        into a refusal.
        """
        self.written = max(self.written, written)
        keep = []
        for seq, order, fut in self._waiters:
            if seq > written and order < sent and not fut.done():
                fut.set_exception(
                    BeyondJournal(
                        f"min_seq {seq} is beyond the journal's last seq {written}",
                        min_seq=seq,
                        written_seq=written,
                        detail=[
                            {
                                "loc": ["query", "min_seq"],
                                "msg": "beyond the journal",
                                "type": "value_error",
                            }
                        ],
                    )
                )
            else:
                keep.append((seq, order, fut))
        heapq.heapify(keep)
        self._waiters = keep

    def _settle(self) -> None:
        """Answer every waiting read with what is known (they fail as behind)."""
        waiters, self._waiters = self._waiters, []
        for _seq, _order, fut in waiters:
            if not fut.done():
                fut.set_result(self.seq)


@dataclass
class ApiState:
    """Everything one app instance holds (see module docstring)."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    relay: FeedRelay
    metrics: ApiMetrics
    #: The engines' control channels and watermarks (``serve --engines N``).
    engines: Engines = field(init=False)

    def __post_init__(self) -> None:
        from tiffany.api.engines import Engines

        self._readers: anyio.CapacityLimiter | None = None  # made in the event loop

        db = None
        if self.settings.journal == "postgres":  # requests through the database
            from tiffany.api.db_requests import DbRequests

            db = DbRequests(self.settings.database_url)
        homes = shards.homes(self.settings.data_dir, self.settings.engines)
        url = self.settings.database_url
        pg = url.startswith("postgresql")
        marks = conninfo(url) if db is None and pg else None
        if pg:  # the postgres extra: not imported for the embedded store
            from tiffany.api.pg_async import AsyncPool
        #: A PostgreSQL store's connections for reads on the event loop (:meth:`read_async`).
        self.pg_reads = (
            AsyncPool(
                conninfo(url),
                ASYNC_READERS,
                application_name="tiffany-api",
                configure=_msgspec_json,
            )
            if pg
            else None
        )
        #: A SQLite store's connection for reads on the event loop (:meth:`read_on_loop`).
        self.loop_reads = (
            None if pg else make_reader_engine(url, 1, busy_timeout_ms=LOOP_BUSY_TIMEOUT_MS)
        )
        self._loop_sessions = session_factory(self.loop_reads) if self.loop_reads else None
        self.engines = Engines(
            homes, lambda engine: self.read(lambda s: queries.watermark(s, engine)), db, marks
        )

    @property
    def control(self) -> AsyncControlClient:
        """Engine 0's control channel (the only one with a single engine)."""
        return self.engines.controls[0]

    @property
    def watermark(self) -> Watermark:
        """Engine 0's watermark (the only one with a single engine)."""
        return self.engines.watermarks[0]

    async def wait_projected(self, seq: int) -> int:
        """Return once the store holds WAL seq ``seq``; return the watermark learnt.

        The engine tells (:class:`Watermark`): no poll, no sleep here. A seq
        at or below a watermark already learnt costs nothing. Without an
        engine, the store's own watermark is read once.

        Raises:
            StoreBehind: The store did not reach ``seq`` within :data:`MIN_SEQ_WAIT_S`.
        """
        with timing.timed("projected"):
            last = await self.engines.wait(seq, MIN_SEQ_WAIT_S)
        if last < seq:
            raise StoreBehind(
                f"the store is at seq {last} and did not reach seq {seq} "
                f"within {MIN_SEQ_WAIT_S:g} s; retry",
                min_seq=seq,
                store_seq=last,
            )
        return last

    async def read_async(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Await ``fn(connection)`` on a PostgreSQL store's asyncio pool (:attr:`pg_reads`).

        As :meth:`read`: a connection the server dropped is retried once on
        a new one, and a store that cannot be read (no schema yet, the
        server away) is a :class:`StoreUnavailable`.
        """
        pool = self.pg_reads
        assert pool is not None, "read_async needs a PostgreSQL store"
        called = time.perf_counter()
        began = 0.0

        async def once() -> T:
            nonlocal began
            async with pool.connection() as conn:
                began = time.perf_counter()
                return await fn(conn)

        import psycopg  # the postgres extra: only a PostgreSQL store reads here

        try:
            try:
                return await once()
            except psycopg.OperationalError:
                # A connection the server dropped: the pool let it go; once more.
                return await once()
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            raise StoreUnavailable(
                f"the store cannot be read: {exc}",
                hint="is the engine running (it creates and migrates the store)?",
            ) from exc
        finally:
            if began:
                timing.add("queue", began - called)
                timing.add("store", time.perf_counter() - began)

    async def read_on_loop(self, fn: Callable[[Session], T], fallback: Callable[[Session], T]) -> T:
        """``fn(session)`` on the event loop on a SQLite store; else :meth:`read` of ``fallback``.

        A small SQLite read costs less than the thread it would run in: a
        one-step run's three SELECTs are quick, but in the threadpool of a
        busy API each statement gives the GIL up and waits to take it back
        (up to the interpreter's 5 ms switch interval), and the thread's
        answer waits for the loop. Under read-your-writes load the slowest
        of these reads spent many times longer in the store read and its
        queue than on the loop (bench/read_your_writes.py; bench/HISTORY.md).
        What shapes the rows is Python, which holds the GIL on any thread.

        ``fn`` bounds its own work: it raises :class:`~tiffany.store.queries.TooLarge`
        for a read too large to hold the loop for (``LOOP_READ_DISPATCHES``),
        and the read goes to the threadpool as ``fallback``; so does a read
        that met a lock (``LOOP_BUSY_TIMEOUT_MS``) or any error of the
        driver, which :meth:`read` then reports as it always does.
        """
        if self._loop_sessions is None:
            return await self.read(fallback)
        try:
            with timing.timed("store"), self._loop_sessions() as session:
                return fn(session)
        except (queries.TooLarge, DBAPIError):
            return await self.read(fallback)

    async def close(self) -> None:
        """Close the store's connections for reads on the loop (the app stops)."""
        if self.pg_reads is not None:
            await self.pg_reads.close()
        if self.loop_reads is not None:
            self.loop_reads.dispose()

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
                f"the store cannot be read: {exc.orig or exc}",
                hint="is the engine running (it creates and migrates the store)?",
            ) from exc
        finally:
            if began:  # its turn came: the wait for it, and the read
                timing.add("queue", began - called)
                timing.add("store", time.perf_counter() - began)


async def _msgspec_json(conn: Any) -> None:
    """Decode JSON columns as the store's engine does (``store.session.make_engine``)."""
    from psycopg.types.json import set_json_loads

    set_json_loads(msgspec.json.decode, conn)


def get_state(conn: HTTPConnection) -> ApiState:
    """Return the app's :class:`ApiState` (requests and websockets)."""
    state: ApiState = conn.app.state.tiffany
    return state


async def _state_of_request(request: Request) -> ApiState:
    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a
    # thread hop (and a GIL hand-off) on every request for one attribute read.
    return get_state(request)


#: The app state, as a route parameter: ``state: State``.
State = Annotated[ApiState, Depends(_state_of_request)]
