"""Store: which journal the projection is of (``projector_state.journal``).

The store's mark is a seq of one journal; another journal's seqs name other
records. A projector claims an empty store for its journal and refuses a
store that holds another's (the PostgreSQL journal, issue 11: two streams,
or a file WAL then a stream, fed into one store skipped each other's
records). NULL is the file WAL: every existing store was fed by it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 15:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``projector_state.journal`` (NULL: the file WAL, which fed every store so far)."""
    with op.batch_alter_table("projector_state") as batch:
        batch.add_column(sa.Column("journal", sa.String(length=128), nullable=True))


def downgrade() -> None:
    """Drop ``projector_state.journal``."""
    with op.batch_alter_table("projector_state") as batch:
        batch.drop_column("journal")
