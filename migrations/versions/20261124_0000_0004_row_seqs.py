"""Store: tasks and steps carry the WAL seq of the last record that changed them.

``runs.last_seq`` already did; ``tasks.last_seq`` and ``steps.last_seq``
now do too, so that every row a reader sees names the point of the journal
it reflects (docs/clock.md). Existing rows get their run's ``last_seq``: a
bound the row is known to be consistent with (the projector stamps the
exact seq from the next record that changes the row on).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 00:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``last_seq`` to ``tasks`` and ``steps``, filled from the run's."""
    for table in ("tasks", "steps"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("last_seq", sa.BigInteger(), nullable=True))
        op.execute(
            f"UPDATE {table} SET last_seq ="  # noqa: S608 - a fixed table name
            f" (SELECT r.last_seq FROM runs r WHERE r.run_id = {table}.run_id)"
        )


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    for table in ("steps", "tasks"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("last_seq")
