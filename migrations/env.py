"""Alembic environment for Tiffany's SQL store.

URL, in order of precedence:

1. a connection handed over by the caller in ``config.attributes["connection"]``
   (how ``tiffany db upgrade`` and the tests run migrations in-process);
2. the ``TIFFANY_DATABASE_URL`` environment variable;
3. ``sqlalchemy.url`` in alembic.ini (SQLite in the default data dir).

SQLite gets ``render_as_batch`` so that ALTER TABLE migrations work on it.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from pathlib import Path

from alembic import context
from sqlalchemy import engine_from_config, pool
from sqlalchemy.engine import Connection, make_url

from tiffany.memory.tables import FTS_TABLE, VECTORS_TABLE
from tiffany.memory.tables import metadata as memory_metadata
from tiffany.store.models import Base
from tiffany.store.session import normalize_url

config = context.config

if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

# The schema's metadata, for `alembic revision --autogenerate` and `alembic check`:
# the store's models and the MemoryStore's tables.
target_metadata = [Base.metadata, memory_metadata]


def include_name(name: str | None, type_: str, _parent: object) -> bool:
    """Leave the memory's full-text index to its migration: a different object per dialect.

    (An FTS5 virtual table and its shadow tables on SQLite, a tsvector table on
    PostgreSQL: neither is in the metadata.)
    """
    if type_ == "table" and name is not None:
        # mem_vectors exists only where pgvector does (migration 0015).
        return not (name in (FTS_TABLE, VECTORS_TABLE) or name.startswith(f"{FTS_TABLE}_"))
    return True


def database_url() -> str:
    """Return the URL to migrate: TIFFANY_DATABASE_URL, else alembic.ini's."""
    url = os.environ.get("TIFFANY_DATABASE_URL", "").strip()
    if not url:
        url = config.get_main_option("sqlalchemy.url") or ""
    if not url:
        raise RuntimeError("no database URL: set TIFFANY_DATABASE_URL or sqlalchemy.url")
    return url


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _ensure_sqlite_dir(url: str) -> None:
    """Create the directory of a SQLite file (the data dir may not exist yet)."""
    database = make_url(url).database
    if _is_sqlite(url) and database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    dialect = (
        connection.dialect.name
        if connection is not None
        else make_url(url or "").get_backend_name()
    )
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        render_as_batch=dialect == "sqlite",
        compare_type=True,
        include_name=include_name,
        literal_binds=connection is None,
        dialect_opts={"paramstyle": "named"} if connection is None else {},
    )


def run_migrations_offline() -> None:
    """Emit the migration SQL to standard output (``alembic upgrade head --sql``)."""
    _configure(url=database_url())
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations against a live database."""
    given = config.attributes.get("connection")
    if given is not None:
        _run_on(given)
        return

    url = database_url()
    _ensure_sqlite_dir(url)
    section = config.get_section(config.config_ini_section, {})
    section["sqlalchemy.url"] = normalize_url(url).render_as_string(hide_password=False)
    engine = engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _run_on(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
