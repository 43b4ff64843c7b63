"""A store's in-process exact vector ranking: each namespace's matrix, kept at its newest write.

The :class:`~tiffany.memory.store.MemoryStore` ranks vectors here wherever
pgvector does not (``tiffany/memory/pgvector.py``): SQLite, and PostgreSQL
without the extension or with ``TIFFANY_MEMORY_PGVECTOR=off``. The product
itself is :class:`~tiffany.memory.search.VectorIndex`'s; this module keeps
its matrices in step with the database and owns the helper thread a hybrid
search runs its vector leg on (docs/memory.md, "Search").

A namespace's matrix is keyed by the namespace's newest write
(``mem_namespaces.store_seq``): a search that finds it older reads the rows
written since (their keys from ``mem_item_versions``) and patches it, or
loads the namespace afresh past :data:`REFRESH_REBUILD_ROWS` changed keys.
Refreshes are serialized by one lock (two searches of a stale namespace
read its rows once); searches of a fresh one take no lock.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

import numpy as np
from sqlalchemy import Connection, select

from tiffany.memory.search import Helping, VectorIndex
from tiffany.memory.tables import mem_item_versions, mem_items

__all__ = ["REFRESH_REBUILD_ROWS", "InProcessVectors"]

#: Changed rows past which a namespace's vectors are loaded afresh instead of patched.
REFRESH_REBUILD_ROWS: Final = 5_000


class InProcessVectors:
    """The namespaces' float32 matrices of one store, and its vector leg's helper thread.

    Args:
        dims: The embedder's dimensions.
        embedder_id: The embedder's id: only its items' vectors are ranked.
    """

    def __init__(self, dims: int, embedder_id: str) -> None:
        self.index = VectorIndex(dims)
        self._embedder_id = embedder_id
        self._refresh_lock = threading.Lock()
        # A hybrid search's vector product starts here while its text ranking
        # runs on the caller's thread (both release the GIL): made at first use.
        self._legs: ThreadPoolExecutor | None = None
        self._legs_lock = threading.Lock()

    def ranks(
        self, conn: Connection, ns: str, ns_seq: int, qvec: np.ndarray, n: int, at: float
    ) -> list[tuple[str, float]]:
        """The ``n`` nearest live items by cosine, the matrix brought to ``ns_seq`` first."""
        hits = self.index.top(ns, ns_seq, qvec, n, at)
        if hits is None:
            self.ensure(conn, ns, ns_seq)
            hits = self.index.top(ns, ns_seq, qvec, n, at)
        return hits or []

    def ensure(self, conn: Connection, ns: str, ns_seq: int) -> None:
        """Bring the namespace's matrix to ``ns_seq`` or newer (no-op when it is)."""
        have = self.index.seq_of(ns)
        if have is None or have < ns_seq:
            with self._refresh_lock:
                self._refresh(conn, ns, ns_seq)

    def start(
        self, ns: str, ns_seq: int, qvec: np.ndarray, n: int, at: float, helping: Helping
    ) -> Future[list[tuple[str, float]] | None]:
        """Start the product on the helper thread (the matrix :meth:`ensure`-d first)."""
        with self._legs_lock:
            if self._legs is None:
                self._legs = ThreadPoolExecutor(max_workers=2, thread_name_prefix="memory-vectors")
            legs = self._legs
        return legs.submit(self.index.top, ns, ns_seq, qvec, n, at, helping=helping)

    def close(self) -> None:
        """Drop the matrices and stop the helper thread (after its product)."""
        self.index.drop()
        with self._legs_lock:
            legs, self._legs = self._legs, None
        if legs is not None:
            legs.shutdown(wait=True)

    def _refresh(self, conn: Connection, ns: str, ns_seq: int) -> None:
        """Bring the namespace's matrix to ``ns_seq``: the rows written since, or all of them."""
        have = self.index.seq_of(ns)
        if have is not None and have >= ns_seq:
            return  # another search brought it here, or past (newer rows drop out by key)
        if have is not None and self._patch(conn, ns, have, ns_seq):
            return
        rows_all = conn.execute(
            select(mem_items.c.key, mem_items.c.vector, mem_items.c.expires_at)
            .where(mem_items.c.namespace == ns, mem_items.c.embedder == self._embedder_id)
            .order_by(mem_items.c.key)
        ).all()
        self.index.replace(ns, ns_seq, rows_all)

    def _patch(self, conn: Connection, ns: str, have: int, ns_seq: int) -> bool:
        """Patch the matrix with the keys written in ``(have, ns_seq]``; False: load afresh."""
        v = mem_item_versions.c
        changed = (
            conn.execute(
                select(v.key)
                .where(v.namespace == ns, v.store_seq > have, v.store_seq <= ns_seq)
                .distinct()
                .limit(REFRESH_REBUILD_ROWS + 1)
            )
            .scalars()
            .all()
        )
        if len(changed) > REFRESH_REBUILD_ROWS:
            return False
        # Swept items have no version row: their rows stay, masked by their
        # expiry, until their key is written again.
        rows = {
            r.key: r
            for r in conn.execute(
                select(
                    mem_items.c.key,
                    mem_items.c.vector,
                    mem_items.c.expires_at,
                    mem_items.c.embedder,
                ).where(mem_items.c.namespace == ns, mem_items.c.key.in_(changed))
            )
        }
        changes = []
        for key in sorted(changed):
            r = rows.get(key)
            if r is None or r.embedder != self._embedder_id:
                changes.append((key, None, None))
            else:
                changes.append((key, r.vector, r.expires_at))
        return bool(self.index.update(ns, have, ns_seq, changes))
