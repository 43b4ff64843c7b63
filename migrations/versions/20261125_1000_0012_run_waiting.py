"""Runs that need someone: the ``waiting`` status and ``runs.waiting_for``.

A run whose live steps all wait for a client's signal or an operator (a
step held for its tool or function) is ``waiting``; ``waiting_for`` lists
what its tasks wait for (``tiffany/store/waits.py``). The status CHECK
gains the value; a downgrade shows such runs ``running`` again.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 10:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = "status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')"
_WITH_WAITING = "status IN ('pending', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')"


def upgrade() -> None:
    """Add ``runs.waiting_for`` and the ``waiting`` status."""
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("waiting_for", sa.JSON(), nullable=True))
        batch.drop_constraint(op.f("ck_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_runs_status"), _WITH_WAITING)


def downgrade() -> None:
    """Drop ``runs.waiting_for``; waiting runs show ``running`` again."""
    op.execute("UPDATE runs SET status = 'running' WHERE status = 'waiting'")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(op.f("ck_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_runs_status"), _STATUSES)
        batch.drop_column("waiting_for")
