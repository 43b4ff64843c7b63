"""Store: the decoded journal records of every run.

``journal_records`` holds each WAL record of the journal, decoded, keyed by
its sequence number, with an index on (run_no, seq) for a run's records in
order (the dashboard's journal table and ``GET /api/runs/{id}/events``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 13:20:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``journal_records``."""
    op.create_table(
        "journal_records",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("run_no", sa.Integer(), nullable=False),
        sa.Column("rtype", sa.String(length=16), nullable=False),
        sa.Column("ltid", sa.Integer(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_journal_records")),
    )
    op.create_index(
        "ix_journal_records_run_no_seq", "journal_records", ["run_no", "seq"], unique=False
    )


def downgrade() -> None:
    """Drop ``journal_records``."""
    op.drop_index("ix_journal_records_run_no_seq", table_name="journal_records")
    op.drop_table("journal_records")
