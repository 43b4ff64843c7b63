"""The exactly-once write: claim the op, apply, bump the seq, store the result; one transaction.

Invariants (docs/memory.md, "Exactly once"):

* A write claims its ``op`` in ``mem_applied`` first. An op there with the
  same digest: the stored result is answered and nothing is written; with
  another digest: refused (``MemoryInvalid``, ``field="op"``).
* Then it applies, bumps ``mem_seq`` (the store's one counter) and stores
  its result in the claim. Any exception rolls all of it back: a write is
  applied once or not at all.
* ``mem_namespaces`` moves with every put, delete and sweep: the live count
  the size limit reads, and the newest ``store_seq`` the vector index is
  keyed by.

Discussion: on SQLite a write starts with ``BEGIN IMMEDIATE``: the file is
shared with the projector (another process that writes), and a deferred
transaction that reads first and then writes can fail at once with
``SQLITE_BUSY`` when another writer committed in between (the busy handler
cannot help a stale snapshot). Taking the write lock first makes the busy
timeout apply. On PostgreSQL the claim is ``INSERT ... ON CONFLICT DO
NOTHING``: a second transaction claiming the same op waits on the first's
row and then reads its result; the ``mem_seq`` row's update serializes the
writes after their claims, so the counts they read are current.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Engine,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)

from tiffany.errors import MemoryInvalid
from tiffany.memory.fulltext import FullText
from tiffany.memory.tables import (
    mem_applied,
    mem_item_versions,
    mem_items,
    mem_links,
    mem_namespaces,
    mem_seq,
)

__all__ = ["APPLIED_OF", "Apply", "Writes"]

#: A write's body: given the transaction and its ``store_seq``, apply and answer the result.
Apply = Callable[[Connection, int], dict[str, Any]]

# The write path's statements, built once. Discussion: a put runs about 13
# statements; building each anew (``select(...).where(...)``, ``.values()``)
# and computing its cache key took more of a put's CPU than SQLite did. A
# statement object built once keeps its cache key (SQLAlchemy memoizes it),
# so only its parameters change from one write to the next. Bind parameters
# are named ``b_*`` where a column of the same name is set.

#: An op's claim: its digest and stored result (``op``).
APPLIED_OF: Final = select(mem_applied.c.digest, mem_applied.c.result).where(
    mem_applied.c.op == bindparam("op")
)
#: A new claim (``op``, ``digest``, ``at``).
_CLAIM: Final = insert(mem_applied)
#: The store's counter moved by one, answering the new ``store_seq``.
_BUMP: Final = (
    update(mem_seq).where(mem_seq.c.id == 1).values(seq=mem_seq.c.seq + 1).returning(mem_seq.c.seq)
)
#: The claim's result stored (``b_op``, ``b_result``, ``b_seq``).
_STORE_RESULT: Final = (
    update(mem_applied)
    .where(mem_applied.c.op == bindparam("b_op"))
    .values(result=bindparam("b_result"), store_seq=bindparam("b_seq"))
)
#: The newest version of a key (``ns``, ``key``).
_LAST_VERSION: Final = select(func.max(mem_item_versions.c.version)).where(
    mem_item_versions.c.namespace == bindparam("ns"), mem_item_versions.c.key == bindparam("key")
)
#: A namespace's counts moved (``b_ns``, ``b_items``, ``b_size``, ``b_seq``, ``b_at``).
_COUNT: Final = (
    update(mem_namespaces)
    .where(mem_namespaces.c.namespace == bindparam("b_ns"))
    .values(
        item_count=mem_namespaces.c.item_count + bindparam("b_items"),
        bytes=mem_namespaces.c.bytes + bindparam("b_size"),
        store_seq=bindparam("b_seq"),
        updated_at=bindparam("b_at"),
    )
)
#: A namespace's first counts.
_NEW_NAMESPACE: Final = insert(mem_namespaces)
#: A namespace's expired items (``ns``, ``at``).
_EXPIRED: Final = select(mem_items.c.id, mem_items.c.key, mem_items.c.bytes).where(
    mem_items.c.namespace == bindparam("ns"),
    mem_items.c.expires_at.is_not(None),
    mem_items.c.expires_at <= bindparam("at"),
)


class _OpTaken(Exception):
    """Inside a write: its op was applied before; ``result`` is what it answered."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("op applied before")
        self.result = result


class Writes:
    """The write path of one store: its engine, its dialect's full-text index."""

    def __init__(self, engine: Engine, fulltext: FullText) -> None:
        self._engine = engine
        self._sqlite = engine.dialect.name == "sqlite"
        self._fulltext = fulltext

    def earlier(self, op: str, digest: str) -> dict[str, Any] | None:
        """The stored result of ``op`` if it was applied (refused if for another write)."""
        with self._engine.connect() as conn:
            row = conn.execute(APPLIED_OF, {"op": op}).first()
        if row is None or row.result is None:
            return None
        return self._same(op, digest, row.digest, row.result)

    @staticmethod
    def _same(op: str, digest: str, stored_digest: str, stored: str) -> dict[str, Any]:
        if stored_digest != digest:
            raise MemoryInvalid(
                f"op {op!r} was applied to another write",
                field="op",
                detail=[{"loc": "op", "msg": "applied to another write"}],
            )
        return dict(json.loads(stored))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction (SQLite: the file's write lock taken first); rolled back on error."""
        with self._engine.connect() as conn:
            try:
                if self._sqlite:
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    # A transaction even on an engine made for reads (the
                    # API's is AUTOCOMMIT: each statement its own commit).
                    conn = conn.execution_options(isolation_level="READ COMMITTED")
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def run(self, op: str, digest: str, at: float, apply: Apply) -> dict[str, Any]:
        """Claim ``op``, apply, bump the seq and store the result: one transaction."""
        try:
            with self.transaction() as conn:
                self._claim(conn, op, digest, at)
                seq = conn.execute(_BUMP).scalar_one()
                result: dict[str, Any] = apply(conn, seq)
                conn.execute(
                    _STORE_RESULT,
                    {"b_op": op, "b_result": json.dumps(result, sort_keys=True), "b_seq": seq},
                )
        except _OpTaken as taken:
            return taken.result
        return result

    def _claim(self, conn: Connection, op: str, digest: str, at: float) -> None:
        """Insert ``op``'s claim, or raise :class:`_OpTaken` with its earlier result."""
        if self._sqlite:
            # The write lock is held (BEGIN IMMEDIATE): no one else can claim meanwhile.
            row = conn.execute(APPLIED_OF, {"op": op}).first()
            if row is None:
                conn.execute(_CLAIM, {"op": op, "digest": digest, "at": at})
                return
        else:
            claimed = conn.execute(
                text(
                    "INSERT INTO mem_applied (op, digest, at) VALUES (:op, :digest, :at)"
                    " ON CONFLICT (op) DO NOTHING RETURNING op"
                ),
                {"op": op, "digest": digest, "at": at},
            ).first()
            if claimed is not None:
                return
            # Another transaction claimed it and committed (ours waited on its row).
            row = conn.execute(APPLIED_OF, {"op": op}).first()
            assert row is not None
        raise _OpTaken(self._same(op, digest, row.digest, row.result))

    @staticmethod
    def next_version(conn: Connection, ns: str, key: str) -> int:
        """The version the next write of ``(ns, key)`` takes (history continues past deletes)."""
        last = conn.execute(_LAST_VERSION, {"ns": ns, "key": key}).scalar()
        return int(last or 0) + 1

    @staticmethod
    def count(conn: Connection, ns: str, items: int, size: int, seq: int, at: float) -> None:
        """Move the namespace's live count and bytes; mark it changed at ``seq``."""
        changed = conn.execute(
            _COUNT, {"b_ns": ns, "b_items": items, "b_size": size, "b_seq": seq, "b_at": at}
        ).rowcount
        if not changed:
            conn.execute(
                _NEW_NAMESPACE,
                {
                    "namespace": ns,
                    "item_count": items,
                    "bytes": size,
                    "store_seq": seq,
                    "updated_at": at,
                },
            )

    def sweep(self, conn: Connection, ns: str, at: float, seq: int) -> None:
        """Remove the namespace's expired items (their history stays)."""
        gone = conn.execute(_EXPIRED, {"ns": ns, "at": at}).all()
        if not gone:
            return
        ids = [r.id for r in gone]
        self._fulltext.delete(conn, ids)
        conn.execute(delete(mem_items).where(mem_items.c.id.in_(ids)))
        self.unlink(conn, [(ns, r.key) for r in gone])
        self.count(conn, ns, -len(gone), -sum(r.bytes for r in gone), seq, at)

    @staticmethod
    def unlink(conn: Connection, nodes: Sequence[tuple[str, str]]) -> None:
        """Remove every link from or to ``nodes``."""
        c = mem_links.c
        for start in range(0, len(nodes), 200):
            chunk = list(nodes[start : start + 200])
            conn.execute(
                delete(mem_links).where(
                    or_(
                        tuple_(c.src_ns, c.src_key).in_(chunk),
                        tuple_(c.dst_ns, c.dst_key).in_(chunk),
                    )
                )
            )
