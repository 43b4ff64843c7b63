"""Runs' model usage: a plan with a budget reports its tokens and dollars at its end.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 18:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``runs.usage``."""
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("usage", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop ``runs.usage``."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("usage")
