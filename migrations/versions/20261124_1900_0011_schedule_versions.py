"""Schedules: a version per row and a clock, so the runner reads changes, not every row.

The runner fired ticks by reading every schedule every 0.25 s (20,000 idle
schedules cost the engine 88% of a core). It now waits for the next due
tick and asks only for the rows whose ``version`` moved
(``ix_schedules_version``); ``schedule_clock`` hands out the versions in
commit order. ``ix_schedules_created_at_id`` pages ``GET /api/schedules``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``schedules.version``, its index, the paging index and ``schedule_clock``."""
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("version", sa.BigInteger(), server_default="0", nullable=False))
        batch.create_index("ix_schedules_version", ["version"])
        batch.create_index("ix_schedules_created_at_id", ["created_at", "id"])
    clock = op.create_table(
        "schedule_clock",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_clock")),
    )
    op.bulk_insert(clock, [{"id": 1, "seq": 0}])


def downgrade() -> None:
    """Drop ``schedule_clock`` and what ``schedules`` gained."""
    op.drop_table("schedule_clock")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_index("ix_schedules_created_at_id")
        batch.drop_index("ix_schedules_version")
        batch.drop_column("version")
