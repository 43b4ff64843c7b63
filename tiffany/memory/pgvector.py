"""The vector leg in PostgreSQL, where the server has pgvector (the ``vector`` extension).

Where the store is PostgreSQL and its database has the ``vector`` extension
and the ``mem_vectors`` table (docs/memory.md, "pgvector"), every put also
writes its vector into ``mem_vectors`` (in the item's transaction, like the
full-text row), and a search's vector leg is one statement::

    SELECT key, embedding <#> :q FROM mem_vectors
     WHERE namespace = :ns AND embedder = :id AND dims = :dims AND <live>
     ORDER BY 2, key LIMIT :n

an exact scan of the namespace's rows (no approximate index: below). Without
the extension (or with ``TIFFANY_MEMORY_PGVECTOR=off``) the store ranks its
vectors exactly in the process (tiffany/memory/search.py): the fallback.

Invariants:

* ``mem_vectors`` holds one row per live item of ``mem_items`` (``item_id``,
  ``ON DELETE CASCADE``: a delete or a sweep removes it), written in the
  same transaction as the item, with the item's ``store_seq``: a row whose
  seq differs from its item's is stale, and :func:`install` rewrites it.
* Rows are unit length (the store normalises every vector), so the inner
  product ``<#>`` (negated by pgvector) is the cosine the exact path ranks
  by: score ``= -(embedding <#> q)``, ties by key.
* The extension's types and operators are named with its schema
  (``"public".vector``, ``OPERATOR("public".<#>)``): the store's
  ``search_path`` need not hold it.
* Creating the extension needs a superuser (pgvector is not a trusted
  extension): the store never tries it at start. ``tiffany db pgvector``
  (:func:`install`) creates it when it can, makes the table and fills it;
  the store's start only reads the catalogue (:func:`probe`) and logs why
  it falls back.

Discussion: the leg runs as an exact scan. An HNSW index needs a fixed
dimension (a partial expression index per ``dims``), is global across
namespaces (a namespace filter after an approximate scan returns fewer than
``k`` rows unless pgvector's iterative scan is on), and its answers depend
on insertion order, which a replay across machines does not share; the
exact scan has recall 1 and answers what the in-process path answers.

Rejected: a ``vector`` column on ``mem_items``. The items' rows are wide
(value and text); a scan of a narrow table of vectors reads less, and the
table exists only where the extension does (``alembic check`` leaves it
alone, as it leaves ``mem_fts``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
from sqlalchemy import Connection, Engine, text

from tiffany.memory.tables import VECTORS_TABLE

__all__ = [
    "EXTENSION",
    "MODES",
    "TABLE",
    "InstallReport",
    "PgVectors",
    "Probe",
    "check_mode",
    "install",
    "open_for",
    "probe",
    "vector_text",
]

log = logging.getLogger(__name__)

#: The extension's name in ``pg_available_extensions`` / ``pg_extension``.
EXTENSION: Final = "vector"
#: The table of vectors (not in the tables' metadata: it exists where the extension does).
TABLE: Final = VECTORS_TABLE
#: ``TIFFANY_MEMORY_PGVECTOR``: ``auto`` searches with pgvector where it is ready; ``off`` never.
MODES: Final = ("auto", "off")
PgvectorMode = Literal["auto", "off"]
#: Rows a sync reads and writes at a time.
_SYNC_BATCH_ROWS: Final = 1_000


def check_mode(mode: str) -> str:
    """Return ``mode`` if it is one of :data:`MODES`, else raise ValueError."""
    if mode not in MODES:
        raise ValueError(f"TIFFANY_MEMORY_PGVECTOR must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def vector_text(vec: np.ndarray) -> str:
    """A vector in pgvector's text form (``[0.5, -0.25, ...]``), exact for float32.

    A float32 widened to a Python float prints the shortest decimal of that
    double; pgvector parses it with ``strtof``, whose nearest float32 is the
    original value.
    """
    return str(np.asarray(vec, dtype=np.float32).tolist())


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Probe:
    """What the database offers: the extension (available, created where) and the table."""

    available: str | None  # the version the server can install, or None
    schema: str | None  # where the extension is created in this database, or None
    version: str | None  # the created version
    table: bool  # mem_vectors exists in the store's schema

    @property
    def ready(self) -> bool:
        """Whether searches can run in SQL."""
        return self.schema is not None and self.table

    def why_not(self) -> str:
        """Why the store falls back to the exact in-process path (empty when :attr:`ready`)."""
        if self.ready:
            return ""
        if self.schema is None and self.available is None:
            return (
                "the PostgreSQL server has no 'vector' extension (pg_available_extensions); "
                "install pgvector on the server to use it"
            )
        if self.schema is None:
            return (
                f"pgvector {self.available} is available on the server but not created in "
                "this database: `tiffany db pgvector` (as a superuser) creates it"
            )
        return f"the vector extension is created but {TABLE} is not: run `tiffany db pgvector`"


def probe(conn: Connection) -> Probe:
    """Read the catalogue: is pgvector available, created, and is ``mem_vectors`` there?"""
    available = conn.execute(
        text("SELECT default_version FROM pg_available_extensions WHERE name = :e"),
        {"e": EXTENSION},
    ).scalar()
    created = conn.execute(
        text(
            "SELECT n.nspname, e.extversion FROM pg_extension e"
            " JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = :e"
        ),
        {"e": EXTENSION},
    ).first()
    table = conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": TABLE}).scalar()
    return Probe(
        available=available,
        schema=None if created is None else created[0],
        version=None if created is None else created[1],
        table=bool(table),
    )


@dataclass
class InstallReport:
    """What :func:`install` found and did."""

    probe: Probe
    created_extension: bool = False
    created_table: bool = False
    synced: int = 0
    rows: int = 0


def install(conn: Connection, *, create_extension: bool) -> InstallReport:
    """Make ``mem_vectors`` where the extension is (creating it first if asked), and fill it.

    Idempotent: the table and its index are made if missing, and every item
    whose vector row is missing or stale (another ``store_seq``) is written.
    Without the extension (and not asked, or not able, to create it) it
    changes nothing and reports why (``probe.why_not()``).

    Raises:
        sqlalchemy.exc.DBAPIError: ``CREATE EXTENSION`` was refused (not a superuser).
    """
    report = InstallReport(probe=probe(conn))
    if report.probe.schema is None:
        if not create_extension or report.probe.available is None:
            return report
        conn.execute(text(f"CREATE EXTENSION IF NOT EXISTS {EXTENSION}"))
        report.created_extension = True
        report.probe = probe(conn)
    schema = report.probe.schema
    assert schema is not None  # created just above, or already there
    if not report.probe.table:
        conn.execute(
            text(
                f"CREATE TABLE {TABLE} ("
                " item_id integer PRIMARY KEY REFERENCES mem_items (id) ON DELETE CASCADE,"
                " namespace varchar(128) NOT NULL,"
                " key varchar(256) NOT NULL,"
                " embedder varchar(200) NOT NULL,"
                " dims integer NOT NULL,"
                " expires_at double precision,"
                " store_seq bigint NOT NULL,"
                f" embedding {_ident(schema)}.vector NOT NULL)"
            )
        )
        conn.execute(
            text(f"CREATE INDEX ix_{TABLE}_namespace ON {TABLE} (namespace, embedder, dims)")
        )
        report.created_table = True
        report.probe = probe(conn)
    report.synced = _sync(conn, PgVectors(schema))
    report.rows = int(conn.execute(text(f"SELECT count(*) FROM {TABLE}")).scalar_one())
    return report


def _sync(conn: Connection, vectors: PgVectors) -> int:
    """Write the vector rows that are missing or stale; answer how many."""
    stale = text(
        "SELECT i.id, i.namespace, i.key, i.embedder, i.expires_at, i.store_seq, i.vector"
        f" FROM mem_items i LEFT JOIN {TABLE} v ON v.item_id = i.id"
        " WHERE v.item_id IS NULL OR v.store_seq <> i.store_seq ORDER BY i.id"
    )
    done = 0
    batch: list[dict[str, Any]] = []
    for row in conn.execute(stale).all():
        vec = np.frombuffer(bytes(row.vector), dtype="<f4")
        batch.append(
            vectors.row(
                row.id, row.namespace, row.key, row.embedder, row.expires_at, row.store_seq, vec
            )
        )
        if len(batch) >= _SYNC_BATCH_ROWS:
            vectors.write_many(conn, batch)
            done += len(batch)
            batch = []
    if batch:
        vectors.write_many(conn, batch)
        done += len(batch)
    return done


class PgVectors:
    """The store's pgvector leg: writes a put's vector row, ranks a namespace in SQL.

    Args:
        schema: The schema the extension's types and operators live in.
    """

    def __init__(self, schema: str) -> None:
        self.schema = schema
        vector = f"{_ident(schema)}.vector"
        self._upsert = text(
            f"INSERT INTO {TABLE}"
            " (item_id, namespace, key, embedder, dims, expires_at, store_seq, embedding)"
            " VALUES (:item_id, :namespace, :key, :embedder, :dims, :expires_at, :store_seq,"
            f" CAST(:embedding AS {vector}))"
            " ON CONFLICT (item_id) DO UPDATE SET namespace = excluded.namespace,"
            " key = excluded.key, embedder = excluded.embedder, dims = excluded.dims,"
            " expires_at = excluded.expires_at, store_seq = excluded.store_seq,"
            " embedding = excluded.embedding"
        )
        self._ranks = text(
            f"SELECT key, embedding OPERATOR({_ident(schema)}.<#>) CAST(:q AS {vector}) AS d"
            f" FROM {TABLE}"
            " WHERE namespace = :ns AND embedder = :embedder AND dims = :dims"
            " AND (expires_at IS NULL OR expires_at > :now)"
            " ORDER BY d, key LIMIT :n"
        )

    @staticmethod
    def row(
        item_id: int,
        namespace: str,
        key: str,
        embedder: str,
        expires_at: float | None,
        store_seq: int,
        vec: np.ndarray,
    ) -> dict[str, Any]:
        """One vector row's parameters."""
        return {
            "item_id": item_id,
            "namespace": namespace,
            "key": key,
            "embedder": embedder,
            "dims": int(vec.shape[0]),
            "expires_at": expires_at,
            "store_seq": store_seq,
            "embedding": vector_text(vec),
        }

    def write(self, conn: Connection, **fields: Any) -> None:
        """Write (or rewrite) an item's vector row in the item's transaction."""
        conn.execute(self._upsert, self.row(**fields))

    def write_many(self, conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
        """Write many rows built by :meth:`row`."""
        conn.execute(self._upsert, list(rows))

    def ranks(
        self,
        conn: Connection,
        ns: str,
        embedder: str,
        qvec: np.ndarray,
        n: int,
        now: float,
    ) -> list[tuple[str, float]]:
        """The ``n`` live items of ``ns`` nearest ``qvec`` (inner product), best first, by key."""
        rows = conn.execute(
            self._ranks,
            {
                "q": vector_text(qvec),
                "ns": ns,
                "embedder": embedder,
                "dims": int(qvec.shape[0]),
                "now": now,
                "n": n,
            },
        ).all()
        return [(key, -float(d)) for key, d in rows]


def open_for(engine: Engine, mode: str) -> tuple[PgVectors | None, str]:
    """The store's choice at start: its vector rows' writer, and the path its searches take.

    Answers ``(writer, path)``: ``writer`` keeps ``mem_vectors`` current
    wherever the table is ready (``off`` included, so that turning pgvector
    back on finds it whole); ``path`` is ``"pgvector"`` where it is ready and
    ``mode`` is ``auto``, else ``"exact"``. Where the table is ready, the
    rows missing or stale are written first (an anti-join of ``mem_items``
    and ``mem_vectors``: DML only). Logs the path on PostgreSQL (and why not
    pgvector); nothing on SQLite.
    """
    if engine.dialect.name != "postgresql":
        return None, "exact"
    with engine.begin() as conn:
        found = probe(conn)
        writer = PgVectors(found.schema) if found.ready and found.schema is not None else None
        # Rows a process without the table's writer left out (it ran before
        # `tiffany db pgvector`): written now, before this store ranks by them.
        synced = 0 if writer is None else _sync(conn, writer)
    if writer is None:
        log.warning("memory vectors: path=exact (%s)", found.why_not())
        return None, "exact"
    if synced:
        log.info("memory vectors: %d missing or stale rows of %s written", synced, TABLE)
    if mode == "off":
        log.info("memory vectors: path=exact (TIFFANY_MEMORY_PGVECTOR=off)")
        return writer, "exact"
    log.info(
        "memory vectors: path=pgvector (pgvector %s in schema %s)", found.version, found.schema
    )
    return writer, "pgvector"
