"""The MemoryStore's tables (tiffany/memory/tables.py, docs/memory.md).

Items, their versions, links, the applied ops (exactly-once) and per
namespace counts, with the one-row ``mem_seq`` counter; the full-text index
``mem_fts`` is dialect-specific (an FTS5 virtual table on SQLite, a table
with a ``tsvector`` and a GIN index on PostgreSQL) and not in the models'
metadata (migrations/env.py leaves it out of ``alembic check``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29 17:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create the memory tables, the full-text index, and ``mem_seq``'s row."""
    op.create_table(
        "mem_seq",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mem_seq")),
    )
    op.execute("INSERT INTO mem_seq (id, seq) VALUES (1, 0)")
    op.create_table(
        "mem_items",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("namespace", sa.String(length=128), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("step_id", sa.String(length=200), nullable=True),
        sa.Column("embedder", sa.String(length=200), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("store_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mem_items")),
        sa.UniqueConstraint("namespace", "key", name="uq_mem_items_namespace_key"),
    )
    op.create_index("ix_mem_items_namespace_expires_at", "mem_items", ["namespace", "expires_at"])
    op.create_index("ix_mem_items_namespace_store_seq", "mem_items", ["namespace", "store_seq"])
    op.create_table(
        "mem_item_versions",
        sa.Column("namespace", sa.String(length=128), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("deleted", sa.Boolean(), nullable=False),
        sa.Column("op", sa.String(length=512), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("step_id", sa.String(length=200), nullable=True),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("store_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "key", "version", name=op.f("pk_mem_item_versions")),
    )
    op.create_index(
        "ix_mem_item_versions_namespace_store_seq",
        "mem_item_versions",
        ["namespace", "store_seq"],
    )
    op.create_table(
        "mem_links",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("src_ns", sa.String(length=128), nullable=False),
        sa.Column("src_key", sa.String(length=256), nullable=False),
        sa.Column("relation", sa.String(length=64), nullable=False),
        sa.Column("dst_ns", sa.String(length=128), nullable=False),
        sa.Column("dst_key", sa.String(length=256), nullable=False),
        sa.Column("props", sa.Text(), nullable=True),
        sa.Column("op", sa.String(length=512), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("store_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mem_links")),
        sa.UniqueConstraint(
            "src_ns", "src_key", "relation", "dst_ns", "dst_key", name="uq_mem_links_edge"
        ),
    )
    op.create_index("ix_mem_links_dst", "mem_links", ["dst_ns", "dst_key"])
    op.create_table(
        "mem_applied",
        sa.Column("op", sa.String(length=512), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("store_seq", sa.BigInteger(), nullable=True),
        sa.Column("at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("op", name=op.f("pk_mem_applied")),
    )
    op.create_table(
        "mem_namespaces",
        sa.Column("namespace", sa.String(length=128), nullable=False),
        sa.Column("item_count", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("store_seq", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", name=op.f("pk_mem_namespaces")),
    )
    if op.get_bind().dialect.name == "sqlite":
        # Its rowid is the item's id; nsid a token naming the namespace
        # (tiffany/memory/fulltext.py); written in the item's transaction.
        op.execute(
            "CREATE VIRTUAL TABLE mem_fts USING fts5("
            "nsid, text, tokenize = 'unicode61 remove_diacritics 2')"
        )
    else:
        op.execute(
            "CREATE TABLE mem_fts ("
            " item_id integer PRIMARY KEY REFERENCES mem_items (id) ON DELETE CASCADE,"
            " namespace varchar(128) NOT NULL,"
            " tsv tsvector NOT NULL)"
        )
        op.execute("CREATE INDEX ix_mem_fts_tsv ON mem_fts USING gin (tsv)")
        op.execute("CREATE INDEX ix_mem_fts_namespace ON mem_fts (namespace)")


def downgrade() -> None:
    """Drop the memory tables (memory is lost: a rebuild from the journal restores it)."""
    op.execute("DROP TABLE mem_fts")
    op.drop_table("mem_namespaces")
    op.drop_table("mem_applied")
    op.drop_index("ix_mem_links_dst", table_name="mem_links")
    op.drop_table("mem_links")
    op.drop_index("ix_mem_item_versions_namespace_store_seq", table_name="mem_item_versions")
    op.drop_table("mem_item_versions")
    op.drop_index("ix_mem_items_namespace_store_seq", table_name="mem_items")
    op.drop_index("ix_mem_items_namespace_expires_at", table_name="mem_items")
    op.drop_table("mem_items")
    op.drop_table("mem_seq")
