"""Journal: checkpoints of the PostgreSQL streams.

``wal_checkpoints`` holds each stream's newest checkpoints (the bytes a
checkpoint file holds), so that an engine's start on ``TIFFANY_JOURNAL=postgres``
reads only the records after one, as on the file WAL.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 14:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``wal_checkpoints``."""
    op.create_table(
        "wal_checkpoints",
        sa.Column("stream", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("stream", "seq", name=op.f("pk_wal_checkpoints")),
    )


def downgrade() -> None:
    """Drop ``wal_checkpoints``."""
    op.drop_table("wal_checkpoints")
