"""Store: run identity by RUN_START seq, quarantined records, why a step waits.

* ``runs.run_no`` is no longer unique: WALs written before run numbers were
  reserved per data dir hold several runs with one number (every ``tiffany
  run`` started at 1). ``runs.start_seq``, the sequence number of the run's
  RUN_START, is unique by construction and orders the runs list; it is
  filled for existing rows from ``journal_records``.
* ``dead_letters``: journal records the projection could not apply,
  quarantined so that projection goes on (``tiffany/projector/apply.py``).
* ``steps.waiting``: why a step waits (its tool is disabled on this engine).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 22:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Drop the unique run number, add ``start_seq``, ``dead_letters`` and ``steps.waiting``."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("uq_runs_run_no", type_="unique")
        batch.add_column(sa.Column("start_seq", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE runs SET start_seq = (SELECT MAX(j.seq) FROM journal_records j"
        " WHERE j.run_no = runs.run_no AND j.rtype = 'RUN_START')"
    )
    op.drop_index("ix_runs_status_created_at_run_no", table_name="runs")
    op.drop_index("ix_runs_created_at_run_no", table_name="runs")
    op.create_index("ix_runs_created_at_start_seq", "runs", ["created_at", "start_seq"])
    op.create_index(
        "ix_runs_status_created_at_start_seq", "runs", ["status", "created_at", "start_seq"]
    )
    op.create_index("ix_runs_run_no", "runs", ["run_no"])
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("waiting", sa.Text(), nullable=True))
    op.create_table(
        "dead_letters",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=True),
        sa.Column("run_no", sa.Integer(), nullable=False),
        sa.Column("rtype", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("excerpt", sa.Text(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_dead_letters")),
    )


def downgrade() -> None:
    """Undo :func:`upgrade` (fails if two runs share a number)."""
    op.drop_table("dead_letters")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("waiting")
    op.drop_index("ix_runs_run_no", table_name="runs")
    op.drop_index("ix_runs_status_created_at_start_seq", table_name="runs")
    op.drop_index("ix_runs_created_at_start_seq", table_name="runs")
    op.create_index("ix_runs_created_at_run_no", "runs", ["created_at", "run_no"])
    op.create_index(
        "ix_runs_status_created_at_run_no", "runs", ["status", "created_at", "run_no"]
    )
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("start_seq")
        batch.create_unique_constraint("uq_runs_run_no", ["run_no"])
