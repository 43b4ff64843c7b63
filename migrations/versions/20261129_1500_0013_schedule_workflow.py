"""Schedules of workflows: a schedule names a ``@workflow`` or holds a plan.

A tick submits ``{"workflow": NAME, "inputs": ...}`` as ``POST /api/runs``
does, so ``schedules.workflow`` holds the name and ``schedules.plan`` is
empty for such a row (one of the two is set: the API and the CLI check it).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 15:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``schedules.workflow``; a workflow's row has no plan."""
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("workflow", sa.String(length=200), nullable=True))
        batch.alter_column("plan", existing_type=sa.JSON(), nullable=True)


def downgrade() -> None:
    """Drop the workflows' schedules (a plan column cannot hold them), then the column."""
    op.execute("DELETE FROM schedules WHERE plan IS NULL")
    with op.batch_alter_table("schedules") as batch:
        batch.alter_column("plan", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("workflow")
