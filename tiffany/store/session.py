"""Engines and sessions of the store: built at entry points, never at import.

:func:`make_engine` turns a URL from the settings into an engine set up for
the store's access pattern: one writer (the projector) and many readers (the
API). On SQLite that means WAL journal mode (readers never block the
writer), foreign keys on (SQLite's default is off) and a busy timeout
instead of an immediate ``database is locked``; on PostgreSQL, the psycopg
(3) driver and a pool that checks connections before handing them out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import msgspec
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "checkpoint",
    "driver_errors",
    "is_sqlite",
    "json_text",
    "make_engine",
    "make_reader_engine",
    "normalize_url",
    "session_factory",
]

#: How long a SQLite connection waits for a lock before failing.
SQLITE_BUSY_TIMEOUT_MS: Final = 5_000


def normalize_url(url: str | URL) -> URL:
    """Return ``url`` with PostgreSQL pinned to the psycopg (3) driver.

    ``postgresql://`` (what operators write) would otherwise mean psycopg2,
    which the store does not depend on.
    """
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def is_sqlite(url: str | URL) -> bool:
    """True when ``url`` names a SQLite database."""
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_pragmas(memory: bool, busy_timeout_ms: int) -> Any:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            # First: the journal mode's pragma reads the file, and may meet a
            # lock (until now the driver's own 5 s timeout applied).
            cur.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
            if not memory:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
        finally:
            cur.close()

    return on_connect


def json_text(value: Any) -> str:
    """A JSON column's text, as the store's engines write it (``make_engine``)."""
    return msgspec.json.encode(value).decode()


def make_engine(
    url: str | URL, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS, **kwargs: Any
) -> Engine:
    """Create the store's engine for ``url`` (SQLite file or PostgreSQL).

    Args:
        url: A SQLAlchemy URL (``settings.database_url``).
        busy_timeout_ms: How long a SQLite connection waits for a lock.
        **kwargs: Passed on to :func:`sqlalchemy.create_engine`.

    The directory of a SQLite file is created if missing (the data dir may
    not exist yet on a first start).
    """
    parsed = normalize_url(url)
    # JSON columns hold values records.jsonable made plain: msgspec writes and
    # reads them several times faster than the json module (the projector
    # spent a noticeable share of its time in json.dumps).
    kwargs.setdefault("json_serializer", json_text)
    kwargs.setdefault("json_deserializer", msgspec.json.decode)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        memory = database in ("", ":memory:") or database.startswith("file::memory:")
        if not memory:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("connect_args", {}).setdefault("check_same_thread", False)
        engine = create_engine(parsed, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas(memory, busy_timeout_ms))
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)


def make_reader_engine(
    url: str | URL,
    connections: int,
    name: str = "tiffany-api",
    *,
    busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
) -> Engine:
    """The engine of a process that only reads the store (the API): ``connections`` kept open.

    On PostgreSQL its sessions show as ``name`` in ``pg_stat_activity``
    (``application_name``, unless the URL sets one); ``busy_timeout_ms``:
    as :func:`make_engine`'s (SQLite only).

    On PostgreSQL a read is its statements alone: autocommit (no ``BEGIN``
    before it, no ``ROLLBACK`` when its connection goes back to the pool)
    and no ``SELECT 1`` ping at each checkout. Reading a run took six round
    trips for three SELECTs, and each round trip is two context switches,
    which on a busy machine is where a read's time goes. Consistency is what
    it was: PostgreSQL's default isolation (read committed) gives each
    statement its own snapshot inside a transaction too. A connection that
    died (the server restarted) fails its read with a disconnect error, and
    the pool drops it and its siblings; the caller retries the read once
    (``tiffany.ports.reads``).
    """
    kwargs: dict[str, Any] = {"pool_size": connections, "max_overflow": 0}
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        kwargs.update(isolation_level="AUTOCOMMIT", pool_pre_ping=False)
        if "application_name" not in parsed.query:
            kwargs["connect_args"] = {"application_name": name}
    return make_engine(url, busy_timeout_ms=busy_timeout_ms, **kwargs)


def checkpoint(engine: Engine) -> int:
    """Copy a SQLite store's WAL into the database file now; return its frames copied so far.

    SQLite does this itself at the commit that grows its WAL past 1,000
    pages (``wal_autocheckpoint``): that commit then copies and syncs
    megabytes, and whatever waits on it (a ``min_seq`` read) waits too. The
    projector calls this when it has nothing to apply, so the commits that
    follow are short. ``PASSIVE``: it never waits for a reader, and copies
    what no reader still needs. No-op (0) on PostgreSQL or an in-memory
    database.
    """
    if engine.dialect.name != "sqlite":
        return 0
    with engine.connect() as conn:
        row = conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").first()
    # (busy, frames in the WAL, frames of it in the database file): -1s when
    # not in WAL mode (memory).
    return max(int(row[2]), 0) if row is not None else 0


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Return a session factory bound to ``engine`` (objects stay usable after commit)."""
    return sessionmaker(engine, expire_on_commit=False)


@contextlib.contextmanager
def driver_errors(conn: Connection, sql: str, params: Any, *, many: bool = False) -> Iterator[Any]:
    """Yield ``conn``'s DB-API connection; raise a driver error as SQLAlchemy would.

    For statements run on the driver's own cursors (the projector's batches,
    the API's pipelined reads): the error is SQLAlchemy's wrapper
    (:meth:`DBAPIError.instance`: ``OperationalError``, ``IntegrityError``...)
    with ``connection_invalidated`` set on a disconnect, and the connection
    is then invalidated (the pool opens a new one), as SQLAlchemy's own
    execution does, so callers read these errors as they read any other.
    """
    dialect = conn.dialect
    dbapi = dialect.loaded_dbapi
    raw = conn.connection
    try:
        yield raw
    except dbapi.Error as exc:
        gone = dialect.is_disconnect(exc, raw, None)
        if gone:
            conn.invalidate()
        raise sa_exc.DBAPIError.instance(
            sql,
            params,
            exc,
            dbapi.Error,
            connection_invalidated=gone,
            dialect=dialect,
            ismulti=many,
        ) from exc
