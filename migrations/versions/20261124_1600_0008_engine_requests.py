"""Engine requests: submissions and run commands through the database.

With the journal in PostgreSQL (``TIFFANY_JOURNAL=postgres``) an API process
needs no engine socket: it inserts a request (a submission, a cancel, a
verify), the engines claim pending ones with ``FOR UPDATE SKIP LOCKED`` and
store their answer (docs/engines.md). ``idem_key`` is unique: a repeated
``Idempotency-Key`` finds the first submission's row, on any API replica.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 16:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``engine_requests``."""
    op.create_table(
        "engine_requests",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("op", sa.String(length=16), nullable=False),
        sa.Column("engine", sa.Integer(), nullable=True),
        sa.Column("run_id", sa.String(length=128), nullable=True),
        sa.Column("idem_key", sa.String(length=255), nullable=True),
        sa.Column("digest", sa.String(length=64), nullable=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("claimed_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_requests")),
        sa.UniqueConstraint("idem_key", name=op.f("uq_engine_requests_idem_key")),
    )
    op.create_index(
        op.f("ix_engine_requests_run_id"), "engine_requests", ["run_id"], unique=False
    )
    op.create_index(
        "ix_engine_requests_state_id", "engine_requests", ["state", "id"], unique=False
    )


def downgrade() -> None:
    """Drop ``engine_requests``."""
    op.drop_index("ix_engine_requests_state_id", table_name="engine_requests")
    op.drop_index(op.f("ix_engine_requests_run_id"), table_name="engine_requests")
    op.drop_table("engine_requests")
