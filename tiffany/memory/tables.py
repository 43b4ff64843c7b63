"""The MemoryStore's tables (SQLAlchemy Core), in the store's database.

Alembic owns them (migrations/versions/20261129_1700_0014_memory.py) and
``alembic check`` compares them with this metadata (migrations/env.py). The
full-text index is not here: it is a different object on each dialect, made
by the migration and named ``mem_fts`` on both (:data:`FTS_TABLE`), which
``alembic check`` leaves alone:

* SQLite: ``CREATE VIRTUAL TABLE mem_fts USING fts5(nsid, text)``, its
  rowid the item's ``id``;
* PostgreSQL: ``mem_fts(item_id, namespace, tsv tsvector)`` with a GIN index.

Both are written in the transaction that writes the item.

Times are float seconds since the epoch. ``store_seq`` is one counter
(``mem_seq``, a single row bumped in each write's transaction) so any read
can say which writes it saw (``as_of``).
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)

__all__ = [
    "FTS_TABLE",
    "VECTORS_TABLE",
    "mem_applied",
    "mem_item_versions",
    "mem_items",
    "mem_links",
    "mem_namespaces",
    "mem_seq",
    "metadata",
]

#: The store's naming convention (tiffany/store/models.py), so names match Alembic's.
NAMING_CONVENTION: Final = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

#: The full-text index's name on both dialects (not in :data:`metadata`).
FTS_TABLE: Final = "mem_fts"
#: pgvector's table of vectors, on PostgreSQL where the extension is
#: (tiffany/memory/pgvector.py; not in :data:`metadata`).
VECTORS_TABLE: Final = "mem_vectors"

NS = 128
KEY = 256
REL = 64
ID = 200
OP = 512

#: The one row (id 1) whose ``seq`` is the newest write's store_seq.
mem_seq = Table(
    "mem_seq",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("seq", BigInteger, nullable=False),
)

#: The live items: one row per (namespace, key). ``id`` is the full-text row's id.
mem_items = Table(
    "mem_items",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("namespace", String(NS), nullable=False),
    Column("key", String(KEY), nullable=False),
    Column("value", Text, nullable=False),  # canonical JSON
    Column("text", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("expires_at", Double, nullable=True),
    Column("run_id", String(ID), nullable=True),
    Column("step_id", String(ID), nullable=True),
    Column("embedder", String(ID), nullable=False),
    Column("vector", LargeBinary, nullable=False),  # float32 little-endian, unit norm
    Column("bytes", Integer, nullable=False),
    Column("store_seq", BigInteger, nullable=False),
    UniqueConstraint("namespace", "key", name="uq_mem_items_namespace_key"),
    Index("ix_mem_items_namespace_expires_at", "namespace", "expires_at"),
    Index("ix_mem_items_namespace_store_seq", "namespace", "store_seq"),
)

#: Every write of an item, deletes included: its history.
mem_item_versions = Table(
    "mem_item_versions",
    metadata,
    Column("namespace", String(NS), primary_key=True),
    Column("key", String(KEY), primary_key=True),
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("value", Text, nullable=True),
    Column("text", Text, nullable=True),
    Column("deleted", Boolean, nullable=False),
    Column("op", String(OP), nullable=False),
    Column("run_id", String(ID), nullable=True),
    Column("step_id", String(ID), nullable=True),
    Column("at", Double, nullable=False),
    Column("store_seq", BigInteger, nullable=False),
    Index("ix_mem_item_versions_namespace_store_seq", "namespace", "store_seq"),
)

#: Links between items: (subject) -relation-> (object).
mem_links = Table(
    "mem_links",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("src_ns", String(NS), nullable=False),
    Column("src_key", String(KEY), nullable=False),
    Column("relation", String(REL), nullable=False),
    Column("dst_ns", String(NS), nullable=False),
    Column("dst_key", String(KEY), nullable=False),
    Column("props", Text, nullable=True),  # canonical JSON object
    Column("op", String(OP), nullable=False),
    Column("at", Double, nullable=False),
    Column("store_seq", BigInteger, nullable=False),
    UniqueConstraint(
        "src_ns", "src_key", "relation", "dst_ns", "dst_key", name="uq_mem_links_edge"
    ),
    Index("ix_mem_links_dst", "dst_ns", "dst_key"),
)

#: Each applied write by its op: the exactly-once record, and the write's result.
mem_applied = Table(
    "mem_applied",
    metadata,
    Column("op", String(OP), primary_key=True),
    Column("digest", String(64), nullable=False),
    Column("result", Text, nullable=True),  # JSON; set before the transaction commits
    Column("store_seq", BigInteger, nullable=True),
    Column("at", Double, nullable=False),
)

#: Per namespace: live items, their bytes, the newest write (the vector cache's key).
mem_namespaces = Table(
    "mem_namespaces",
    metadata,
    Column("namespace", String(NS), primary_key=True),
    Column("item_count", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("store_seq", BigInteger, nullable=False),
    Column("updated_at", Double, nullable=False),
)
