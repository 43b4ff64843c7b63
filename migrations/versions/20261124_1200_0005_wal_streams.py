"""Journal: the WAL in PostgreSQL, as streams of records with a fenced writer lease.

``wal_streams`` holds each stream's head (last committed seq) and its
writer's lease (owner, epoch, expiry); ``wal_records`` the records, keyed by
(stream, seq). They are the journal itself when ``TIFFANY_JOURNAL=postgres``
(``tiffany.wal.pg``); on SQLite they stay empty.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 12:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``wal_streams`` and ``wal_records``."""
    op.create_table(
        "wal_streams",
        sa.Column("stream", sa.String(length=64), nullable=False),
        sa.Column("head", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("lease_until", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("stream", name=op.f("pk_wal_streams")),
    )
    op.create_table(
        "wal_records",
        sa.Column("stream", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("rtype", sa.SmallInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("stream", "seq", name=op.f("pk_wal_records")),
    )


def downgrade() -> None:
    """Drop ``wal_records`` and ``wal_streams``."""
    op.drop_table("wal_records")
    op.drop_table("wal_streams")
