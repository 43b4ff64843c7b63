"""pgvector's table of memory vectors, where the database has the ``vector`` extension.

On PostgreSQL whose database has the ``vector`` extension created, make
``mem_vectors`` (one row per live item: its namespace, key, embedder, dims,
expiry, ``store_seq`` and its vector as pgvector's ``vector``) and fill it
from ``mem_items``: tiffany/memory/pgvector.py's :func:`install`, the same
function ``tiffany db pgvector`` runs. Anywhere else (SQLite; PostgreSQL
without the extension) it changes nothing: memory ranks its vectors exactly
in the process, and ``tiffany db pgvector`` turns pgvector on later.

It never creates the extension itself: that needs a superuser, and the
extension is the database's, not the store's (docs/memory.md, "pgvector").

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 20:00:00+00:00
"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Make and fill ``mem_vectors`` where the ``vector`` extension is created; else nothing."""
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    from tiffany.memory.pgvector import install

    install(bind, create_extension=False)


def downgrade() -> None:
    """Drop ``mem_vectors`` if it is there (the vectors stay in ``mem_items``)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TABLE IF EXISTS mem_vectors")
