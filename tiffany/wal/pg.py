"""The journal in PostgreSQL: a WAL stream of rows, written by one leased, fenced engine.

``TIFFANY_JOURNAL=postgres`` puts the journal in the database named by
``TIFFANY_DATABASE_URL`` instead of segment files under the data dir
(docs/pg-journal.md). The records are the WAL's: a gapless seq, a type
byte and an opaque payload (the run's 4-byte number first), so the journal,
replay, verify and recovery read them unchanged (:class:`~tiffany.wal.Log`).

A *stream* is one such log (``wal_records`` rows keyed by ``(stream, seq)``,
its head in ``wal_streams``). One engine at a time writes a stream, the
holder of its lease:

* :meth:`PgLog.open` takes the lease (``owner``, a new ``epoch``,
  ``lease_until`` by the database's clock) if it is free or expired, and
  refuses with :class:`~tiffany.errors.WalLockedError` naming the holder
  otherwise.
* ``append`` buffers; ``commit`` is one transaction: ``UPDATE wal_streams
  SET head = last WHERE epoch = mine AND head = durable``, then the records
  by binary ``COPY``, then ``COMMIT``. The update takes the stream's row
  lock first, so commits and take-overs are serialized, and a writer whose
  lease was taken over (the epoch moved on) matches no row: it is fenced
  (:class:`~tiffany.errors.WalFailedError`, ``reason="fenced"``), writes
  nothing, and stops, as the file WAL does after a failed fsync.
  (Temporal's shard ``range_id`` works this way.)
* A heartbeat thread renews the lease every third of its length on a
  connection of its own (never the scheduler's thread); a commit renews it
  too. An engine paused past its lease (SIGSTOP, a partition) may find it
  taken: its next commit is fenced.
* Before a thread job starts, the runtime asks :attr:`PgLog.lease_deadline`
  (the lease's end by this host's clock, counted from before the statement
  that last set it): a job of an engine paused past its lease waits until
  the heartbeat renews the lease (``on_renewed``) or finds it gone (the
  fence), so the engine that woke up does not start a step its stream's
  new owner runs already. The clock is ``CLOCK_BOOTTIME``, which goes on
  counting while the process is stopped and while the host is suspended.

Discussion: the lease is on the stream, not on each run (Temporal's shards,
not DBOS's per-workflow ownership): one heartbeat per engine and one row
lock per group commit, whatever the number of runs; engines that share a
database each write their own stream, and a dead engine's stream is taken
over whole. The seq stays the clock of its stream, assigned by its one
writer, so readers, ``min_seq`` and the feed keep their meaning.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Final

import psycopg
import psycopg_pool
import structlog
import tenacity

from tiffany.config import conninfo
from tiffany.errors import WalCorruptionError, WalFailedError, WalFormatError, WalLockedError
from tiffany.wal import CommitListener, Span
from tiffany.wal.format import MAX_RECORD_BYTES, MAX_TYPE
from tiffany.wal.frame import check_record
from tiffany.wal.state import LogState, lease_clock
from tiffany.wal.writer import RotateListener

__all__ = [
    "DEFAULT_LEASE_S",
    "DEFAULT_STREAM",
    "PgLog",
    "PgStream",
    "conninfo",
    "new_owner",
    "streams",
]

log = structlog.get_logger("tiffany.wal.pg")

#: The stream an engine writes unless told otherwise.
DEFAULT_STREAM: Final = "main"
#: How long a lease lasts without renewal (docs/pg-journal.md, "Leases").
DEFAULT_LEASE_S: Final = 10.0
#: Rows a reader fetches per round trip.
READ_BATCH: Final = 20_000
#: Connections a stream keeps for its readers' statements (the projector's
#: tail; the checkpointer's checkpoints and releases), opened on first use.
READ_POOL_SIZE: Final = 2
#: How long a reader waits for one of them (while the database cannot be
#: reached) before :class:`~tiffany.errors.WalFailedError`, in seconds.
CONNECT_WAIT_S: Final = 10.0

_NOW: Final = "extract(epoch from clock_timestamp())::float8"

_ACQUIRE: Final = f"""
INSERT INTO wal_streams (stream, head, epoch, owner, lease_until)
VALUES (%(stream)s, %(base)s, 1, %(owner)s, {_NOW} + %(lease)s)
ON CONFLICT (stream) DO UPDATE
   SET epoch = wal_streams.epoch + 1, owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until
 WHERE wal_streams.lease_until < {_NOW}
RETURNING epoch, head
"""
_HOLDER: Final = f"SELECT owner, lease_until - {_NOW} FROM wal_streams WHERE stream = %s"
_LAST: Final = "SELECT max(seq) FROM wal_records WHERE stream = %s"
# One statement, so one round trip and one atomic commit (autocommit): the head
# moves only where the epoch is the writer's, and the records go in only where
# it moved (the CTE yields no row otherwise: nothing is inserted, the fence).
_COMMIT: Final = f"""
WITH head AS (
  UPDATE wal_streams SET head = %(last)s, lease_until = {_NOW} + %(lease)s
   WHERE stream = %(stream)s AND epoch = %(epoch)s AND head = %(prev)s
  RETURNING stream
)
INSERT INTO wal_records (stream, seq, rtype, payload)
SELECT head.stream, %(prev)s + r.i, r.rtype, r.payload
  FROM head, unnest(%(rtypes)b::smallint[], %(payloads)b::bytea[])
       WITH ORDINALITY AS r(rtype, payload, i)
"""
_RENEW: Final = f"UPDATE wal_streams SET lease_until = {_NOW} + %s WHERE stream = %s AND epoch = %s"
_RELEASE: Final = "UPDATE wal_streams SET lease_until = 0 WHERE stream = %s AND epoch = %s"
_READ: Final = (
    "SELECT seq, rtype, payload FROM wal_records WHERE stream = %s AND seq >= %s ORDER BY seq"
)
_RANGE: Final = (
    "SELECT seq, rtype, payload FROM wal_records"
    " WHERE stream = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s"
)
_CHECKPOINTS: Final = "SELECT seq, data FROM wal_checkpoints WHERE stream = %s ORDER BY seq DESC"
_SAVE_CHECKPOINT: Final = """
INSERT INTO wal_checkpoints (stream, seq, data) VALUES (%s, %s, %s)
ON CONFLICT (stream, seq) DO UPDATE SET data = EXCLUDED.data
"""
_PRUNE_CHECKPOINTS: Final = """
DELETE FROM wal_checkpoints WHERE stream = %s AND seq NOT IN
  (SELECT seq FROM wal_checkpoints WHERE stream = %s ORDER BY seq DESC LIMIT %s)
"""
_STREAMS: Final = (
    f"SELECT stream, head, epoch, owner, lease_until - {_NOW} FROM wal_streams ORDER BY stream"
)
_FIRST: Final = "SELECT min(seq) FROM wal_records WHERE stream = %s"
_RELEASE_BEFORE: Final = "DELETE FROM wal_records WHERE stream = %s AND seq < %s"
_MISSING_TABLES: Final = "the journal tables are missing: run `tiffany db upgrade` first"


def streams(url: str) -> list[dict[str, Any]]:
    """Return every stream in the database: its head, epoch, lease holder and time left."""
    with _connect(url, autocommit=True) as conn:
        try:
            rows = conn.execute(_STREAMS).fetchall()
        except psycopg.errors.UndefinedTable as exc:
            raise WalFailedError(_MISSING_TABLES, reason="schema") from exc
    return [
        {
            "stream": stream,
            "head": head,
            "epoch": epoch,
            "owner": owner,
            "lease_left_s": round(max(left, 0.0), 3),
            "held": left > 0,
        }
        for stream, head, epoch, owner, left in rows
    ]


def _connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(conninfo(url), **kwargs)
    except psycopg.Error as exc:
        raise WalFailedError(
            f"cannot reach the journal's database: {exc}", reason="unreachable"
        ) from exc


class _LeaseWait:
    """Waiting for a held lease (:meth:`PgLog.open`'s ``wait_s``), on tenacity.

    Only :class:`~tiffany.errors.WalLockedError` is retried, until ``wait_s``
    has passed since the first try (then it is raised). The wait before the
    next try is the lease's time left (a lease given back is taken at the
    next try), at most a quarter of a lease and a second, never past
    ``wait_s``. The holder is logged once, not once a try.
    """

    def __init__(self, wait_s: float, lease_s: float) -> None:
        self.wait_s = wait_s
        self.lease_s = lease_s
        self._told: object = None

    def retrying(self) -> tenacity.Retrying:
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(WalLockedError),
            stop=tenacity.stop_after_delay(self.wait_s),
            wait=self._wait,
            before_sleep=self._tell,
            reraise=True,
        )

    @staticmethod
    def _held(state: tenacity.RetryCallState) -> dict[str, Any]:
        exc = state.outcome.exception() if state.outcome is not None else None
        return exc.fields if isinstance(exc, WalLockedError) else {"lease_left_s": 0.0}

    def _wait(self, state: tenacity.RetryCallState) -> float:
        left = self.wait_s - (state.seconds_since_start or 0.0)
        lease_left = float(self._held(state)["lease_left_s"])
        return max(0.0, min(left, lease_left + 0.05, self.lease_s / 4, 1.0))

    def _tell(self, state: tenacity.RetryCallState) -> None:
        fields = self._held(state)
        if fields.get("owner") != self._told:  # once per holder, not per try
            self._told = fields.get("owner")
            log.warning("pgwal.waiting", **fields)


def new_owner() -> str:
    """A lease holder's name: ``host:pid:random`` (unique across restarts of a pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class PgStream:
    """A journal stream read from PostgreSQL (no lease: readers need none).

    Args:
        url: The database (a SQLAlchemy or libpq URL).
        stream: The stream's name.
    """

    def __init__(self, url: str, stream: str = DEFAULT_STREAM) -> None:
        self.url = url
        self.stream = stream
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None  # opened on first use
        self._pool_lock = threading.Lock()
        self._pool_closer: weakref.finalize[Any, Any] | None = None

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """An autocommit connection of the stream's pool for the ``with`` block.

        Discussion: psycopg_pool, not a connection kept by hand: a connection
        that broke is dropped on its return and a new one made in the
        background, and the checkpointer's statements reuse connections
        instead of opening one each. The writer's connection and the
        heartbeat's stay out of it: the fence's statement and the lease's
        renewal never wait behind a reader. A stream dropped without
        :meth:`close` (a verify's, a re-run's look-up of reused records)
        closes its pool as it is collected: the pool's threads hold the pool,
        not the stream, so nothing outlives it.
        """
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                pool = self._pool
                if pool is None:
                    pool = self._pool = psycopg_pool.ConnectionPool(
                        conninfo(self.url),
                        min_size=1,
                        max_size=READ_POOL_SIZE,
                        kwargs={"autocommit": True},
                        name=f"tiffany-wal-{self.stream}",
                        open=True,
                    )
                    self._pool_closer = weakref.finalize(self, pool.close)
        try:
            with pool.connection(timeout=CONNECT_WAIT_S) as conn:
                yield conn
        except psycopg_pool.PoolTimeout as exc:
            raise WalFailedError(
                f"cannot reach the journal's database within {CONNECT_WAIT_S:g} s: {exc}",
                reason="unreachable",
            ) from exc

    def rows(self, after: int, upto: int, limit: int) -> list[tuple[int, int, bytes]]:
        """Return ``(seq, rtype, payload)`` of the records with ``after < seq <= upto``.

        At most ``limit``, in order, on a connection kept between calls (a
        tail reads after every commit). ``upto`` must be committed: a record
        missing below it raises :class:`~tiffany.errors.WalCorruptionError`.
        """
        try:
            with self._connection() as conn, conn.cursor(binary=True) as cur:
                got = cur.execute(_RANGE, (self.stream, after, upto, limit)).fetchall()
        except psycopg.errors.UndefinedTable as exc:
            raise WalFailedError(_MISSING_TABLES, reason="schema") from exc
        want = min(upto - after, limit)
        if len(got) != want or (got and got[-1][0] != after + want):
            seen = {row[0] for row in got}
            gap = next(seq for seq in range(after + 1, after + want + 1) if seq not in seen)
            raise WalCorruptionError(
                f"stream {self.stream!r}: seq {gap} is missing below the committed seq {upto}",
                segment=self.stream,
                offset=0,
                seq=gap,
                reason="sequence gap",
            )
        return got

    def checkpoints(self) -> list[tuple[int, bytes]]:
        """Return the stream's checkpoints as ``(seq, bytes)``, newest first."""
        with self._connection() as conn:
            try:
                rows = conn.execute(_CHECKPOINTS, (self.stream,), binary=True).fetchall()
            except psycopg.errors.UndefinedTable as exc:
                raise WalFailedError(_MISSING_TABLES, reason="schema") from exc
        return [(seq, bytes(data)) for seq, data in rows]

    def first_seq(self) -> int:
        """The stream's first seq still held (records before it were released); 1 if empty."""
        with self._connection() as conn:
            row = conn.execute(_FIRST, (self.stream,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 1

    def release_before(self, seq: int) -> int:
        """Delete the stream's records below ``seq``; return how many (retain ``delete``).

        The caller (the checkpointer) passes a bound below every unfinished
        run's first record, the newest checkpoint and the store's mark.
        """
        with self._connection() as conn:
            return int(conn.execute(_RELEASE_BEFORE, (self.stream, seq)).rowcount)

    def save_checkpoint(self, seq: int, data: bytes, keep: int) -> None:
        """Store the checkpoint at ``seq`` and keep only the newest ``keep`` (one transaction)."""
        with self._connection() as conn, conn.transaction():
            conn.execute(_SAVE_CHECKPOINT, (self.stream, seq, data))
            conn.execute(_PRUNE_CHECKPOINTS, (self.stream, self.stream, keep))

    def close(self) -> None:
        """Close the readers' connections (the pool; a later read opens it again)."""
        with self._pool_lock:
            closer, self._pool, self._pool_closer = self._pool_closer, None, None
        if closer is not None:
            closer()  # pool.close(), once

    def spans(self, from_seq: int = 1, checked: Mapping[str, int] | None = None) -> Iterator[Span]:
        """Yield the committed records with ``seq >= from_seq``, in order (:func:`spans_of`).

        Each record's payload is its own ``bytes``; the seqs are checked to
        follow one another (a gap raises :class:`~tiffany.errors.WalCorruptionError`).
        ``checked`` is accepted for the interface: the database keeps its own checksums.
        """
        stream = self.stream
        with _connect(self.url) as conn, conn.cursor(name="tiffany_wal_read", binary=True) as cur:
            cur.itersize = READ_BATCH
            try:
                cur.execute(_READ, (stream, from_seq))
            except psycopg.errors.UndefinedTable as exc:
                raise WalFailedError(_MISSING_TABLES, reason="schema") from exc
            expected = None
            for seq, rtype, payload in cur:
                if expected is not None and seq != expected:
                    raise WalCorruptionError(
                        f"stream {stream!r}: seq {expected} is missing (next is {seq})",
                        segment=stream,
                        offset=0,
                        seq=expected,
                        reason="sequence gap",
                    )
                expected = seq + 1
                yield seq, rtype, payload, 0, len(payload), stream

    def __repr__(self) -> str:
        """Show the stream and the database (no password)."""
        return f"<PgStream {self.stream!r} at {self.url.split('@')[-1]}>"


class PgLog(PgStream, LogState):
    """A journal stream open for writing, under its lease; create it with :meth:`open`.

    Not thread-safe, like :class:`~tiffany.wal.Wal`: the kernel loop is the
    only caller (the heartbeat has its own connection and touches only the
    lease).
    """

    def __init__(self, url: str, stream: str, lease_s: float, owner: str | None = None) -> None:
        """Set up a closed log; :meth:`open` takes the lease."""
        super().__init__(url, stream)
        self.lease_s = lease_s
        self.owner = owner or new_owner()
        self.epoch = 0
        self.on_commit: CommitListener | None = None
        self.on_rotate: RotateListener | None = None  # a stream never rotates
        self.checked: Mapping[str, int] = {}
        self._conn: psycopg.Connection[Any] | None = None
        self._types: list[int] = []  # the buffer: record types and payloads, from durable + 1
        self._payloads: list[bytes] = []
        self._next_seq = 1
        self._durable_seq = 0
        self._base = 0  # the seq before this stream's first (an engine's range)
        self._failed: WalFailedError | None = None
        self._lost = threading.Event()  # the heartbeat found the lease gone
        self._held_until = 0.0  # lease_clock() before which the lease is surely ours
        # on_lost (LogState): called on the heartbeat's thread when the lease
        # turns out to be taken over; the engine stops driving the stream's runs.
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._closed = False

    @classmethod
    def open(
        cls,
        url: str,
        stream: str = DEFAULT_STREAM,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        heartbeat: bool = True,
        wait_s: float = 0.0,
        first_seq: int = 1,
        owner: str | None = None,
    ) -> PgLog:
        """Take the lease of ``stream`` and open it for appending after its head.

        Args:
            url: The database (``TIFFANY_DATABASE_URL``).
            stream: The stream's name (created on first use).
            lease_s: The lease's length; renewed every third of it.
            heartbeat: Renew the lease from a thread (tests turn it off to
                play an engine that stopped).
            wait_s: How long to wait for a held lease to be given back or to
                expire (a server waits as long as it takes: a standby, or an
                engine restarted after a crash waiting out its dead
                predecessor's lease); 0 refuses at once.
            first_seq: The seq of a new stream's first record (an engine's
                range starts there, ``tiffany/wire/shards.py``); an existing
                stream whose head lies below it is refused (another engine's).
            owner: The name the lease row gives its holder (default: a new
                :func:`new_owner`); an engine passes its own, written down
                first where its API looks (``tiffany/wire/shards.py``, owner notes).

        Raises:
            WalLockedError: Another engine holds a current lease on the
                stream (still, after ``wait_s``).
            WalFailedError: The database is unreachable or lacks the tables.
            WalCorruptionError: The stream's records do not reach its head.
        """
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        pg = cls(url, stream, lease_s, owner)
        pg._base = first_seq - 1
        pg._conn = _connect(url, autocommit=True)  # each commit is one statement
        try:
            _LeaseWait(wait_s, lease_s).retrying()(pg._acquire)
        except BaseException:
            pg._conn.close()
            raise
        if heartbeat:
            pg._beat = threading.Thread(
                target=pg._heartbeat, name="tiffany-pgwal-lease", daemon=True
            )
            pg._beat.start()
        log.info(
            "pgwal.opened", stream=stream, epoch=pg.epoch, head=pg._durable_seq, owner=pg.owner
        )
        return pg

    def _acquire(self) -> None:
        conn = self._conn
        assert conn is not None
        args = {
            "stream": self.stream,
            "owner": self.owner,
            "lease": self.lease_s,
            "base": self._base,
        }
        sent = lease_clock()
        try:
            with conn.cursor() as cur:
                row = cur.execute(_ACQUIRE, args).fetchone()
                if row is None:
                    holder = cur.execute(_HOLDER, (self.stream,)).fetchone()
                    owner, left = holder if holder else ("?", 0.0)
                    raise WalLockedError(
                        f"journal stream {self.stream!r} is leased to {owner} for "
                        f"{max(left, 0):.1f} s more; another engine is writing it",
                        stream=self.stream,
                        owner=owner,
                        lease_left_s=round(max(left, 0), 3),
                    )
                self.epoch, head = row
                self._held_until = sent + self.lease_s
                last = cur.execute(_LAST, (self.stream,)).fetchone()[0]  # type: ignore[index]
        except psycopg.errors.UndefinedTable as exc:
            raise WalFailedError(_MISSING_TABLES, reason="schema") from exc
        if head < self._base:
            raise WalFormatError(
                f"stream {self.stream!r}: its head (seq {head}) lies below this engine's "
                f"seqs (from {self._base + 1}): it is another engine's stream",
                segment=self.stream,
                first_seq=self._base + 1,
            )
        if last is None and head > self._base:
            last = head  # every record released (TIFFANY_WAL_RETAIN=delete)
        last = self._base if last is None else last
        if last != head:
            raise WalCorruptionError(
                f"stream {self.stream!r}: its head says seq {head}, its records end at {last}",
                segment=self.stream,
                offset=0,
                seq=min(head, last) + 1,
                reason="head mismatch",
            )
        self._durable_seq = head
        self._next_seq = head + 1

    # -- the Log interface -------------------------------------------------------------

    def append(self, rtype: int, payload: bytes) -> int:
        """Buffer one record and return its seq (no round trip)."""
        if self._failed is not None:
            self._refuse()
        if len(payload) > MAX_RECORD_BYTES or not 0 < rtype <= MAX_TYPE:
            check_record(rtype, len(payload))
        seq = self._next_seq
        self._types.append(rtype)
        self._payloads.append(payload)
        self._next_seq = seq + 1
        return seq

    def commit(self) -> int:
        """Commit the buffer in one statement (one round trip), fenced by the lease's epoch.

        Raises:
            WalFailedError: Fenced (the lease was taken over), or the
                database failed; the log is stopped either way.
        """
        if self._failed is not None:
            self._refuse()
        if not self._types:
            return self._durable_seq
        if self._lost.is_set():
            raise self._fail("the lease was lost (the heartbeat found a newer epoch)", "fenced")
        conn = self._conn
        assert conn is not None
        first, last = self._durable_seq + 1, self._next_seq - 1
        t0 = time.perf_counter()
        sent = lease_clock()
        args = {
            "last": last,
            "lease": self.lease_s,
            "stream": self.stream,
            "epoch": self.epoch,
            "prev": first - 1,
            "rtypes": self._types,
            "payloads": self._payloads,
        }
        try:
            written = conn.execute(_COMMIT, args).rowcount
        except psycopg.Error as exc:
            raise self._fail(f"commit failed: {exc}", "database", exc) from exc
        if written != last - first + 1:
            raise self._fail(
                f"fenced: stream {self.stream!r} was taken over (epoch {self.epoch} "
                f"is no longer current); nothing after seq {first - 1} was written",
                "fenced",
            )
        took = time.perf_counter() - t0
        self._held_until = max(self._held_until, sent + self.lease_s)  # the commit renewed it
        self._types, self._payloads = [], []
        self._durable_seq = last
        if self.on_commit is not None:
            self.on_commit(first, last, took)
        return last

    def close(self) -> None:
        """Commit what is buffered (unless failed), give the lease back, close the connections."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            if self._failed is None:
                self.commit()
                self._release()
        finally:
            if self._beat is not None:
                self._beat.join(timeout=self.lease_s)
            if self._conn is not None:
                self._conn.close()
            super().close()
            log.info("pgwal.closed", stream=self.stream, epoch=self.epoch, head=self._durable_seq)

    @property
    def lease_deadline(self) -> float | None:
        """Until when (:func:`lease_clock`) the lease is surely this engine's."""
        return self._held_until

    def __repr__(self) -> str:
        """Show the stream, the epoch and the seqs."""
        return self._repr(f"<PgLog {self.stream!r} epoch={self.epoch}")

    # -- the lease -------------------------------------------------------------------

    def _release(self) -> None:
        """Let the next engine take the stream at once (a clean stop)."""
        conn = self._conn
        assert conn is not None
        try:
            conn.execute(_RELEASE, (self.stream, self.epoch))
        except psycopg.Error as exc:
            log.warning("pgwal.release_failed", stream=self.stream, error=str(exc))

    def _heartbeat(self) -> None:
        """Renew the lease every third of its length; note when it is gone."""
        period = self.lease_s / 3
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.wait(period):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(conninfo(self.url), autocommit=True)
                sent = lease_clock()
                cur = conn.execute(_RENEW, (self.lease_s, self.stream, self.epoch))
                if cur.rowcount == 1:
                    self._held_until = max(self._held_until, sent + self.lease_s)
                    if self.on_renewed is not None:
                        self.on_renewed()
                else:
                    self._lost.set()
                    self._failing()  # the runtime starts no effect from here on
                    log.error("pgwal.lease_lost", stream=self.stream, epoch=self.epoch)
                    if self.on_lost is not None:
                        self.on_lost()
                    break
            except psycopg.Error as exc:  # the next beat tries again; the fence holds meanwhile
                log.warning("pgwal.heartbeat_failed", stream=self.stream, error=str(exc))
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    # -- failing ---------------------------------------------------------------------

    def _fail(
        self, message: str, reason: str, cause: BaseException | None = None
    ) -> WalFailedError:
        self._failed = WalFailedError(
            f"journal stream {self.stream!r}: {message}; the journal is stopped "
            f"(durable up to seq {self._durable_seq}, nothing after it is acknowledged)",
            path=self.stream,
            durable_seq=self._durable_seq,
            reason=reason,
        )
        self._failed.__cause__ = cause
        self._types, self._payloads = [], []
        self._stop.set()
        self._failing()
        log.error("pgwal.failed", stream=self.stream, reason=reason, durable_seq=self._durable_seq)
        return self._failed
