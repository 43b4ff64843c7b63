"""The MemoryStore: items in namespaces, links between them, search; writes exactly once.

The public interface is docs/memory.md's: writes
(:meth:`MemoryStore.put`, :meth:`~MemoryStore.delete`, :meth:`~MemoryStore.link`)
take an ``op``, the exactly-once key a run derives from its journal position;
reads answer JSON-able dicts in a deterministic order, what a run journals.

Invariants:

* A write is one transaction that claims its ``op`` first and is applied
  once or not at all (tiffany/memory/writes.py).
* A put's embedding is computed before the transaction (a model call never
  holds the database's write lock) and only when its op is new.
* Expired items are invisible to every read (filtered at read time, against
  the reader's clock), and swept by the writes of their namespace.
* A search reads in one snapshot (SQLite: a read transaction; PostgreSQL:
  ``REPEATABLE READ``): its ``as_of``, its ranks and its items agree.

The parts: ``limits`` (bounds), ``embed`` (vectors), ``fulltext`` and
``search`` (ranks), ``vectors`` (the in-process ranking's matrices, kept
at each namespace's newest write), ``pgvector`` (the vector ranking in
PostgreSQL, where the database has the extension), ``graph`` (walks), ``items`` (rows and
answers), ``writes`` (exactly once), ``tables``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from sqlalchemy import (
    Connection,
    Engine,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from tiffany.errors import MemoryFull, MemoryInvalid, MemoryNotFound
from tiffany.kernel.clock import Clock, MonotonicClock
from tiffany.memory import limits
from tiffany.memory.embed import (
    Embedder,
    HashingEmbedder,
    decode_vector,
    describe,
    embedder_from_settings,
    encode_vector,
    normalize,
)
from tiffany.memory.fulltext import fulltext_for
from tiffany.memory.graph import walk
from tiffany.memory.items import ITEM_COLUMNS, answer, by_key, epoch, iso, live
from tiffany.memory.pgvector import PgVectors, check_mode, open_for
from tiffany.memory.search import Helping, candidates, query_words, rrf
from tiffany.memory.tables import (
    mem_applied,
    mem_item_versions,
    mem_items,
    mem_links,
    mem_namespaces,
    mem_seq,
)
from tiffany.memory.vectors import InProcessVectors
from tiffany.memory.writes import Writes
from tiffany.store.session import make_engine

if TYPE_CHECKING:
    from tiffany.config import Settings

__all__ = ["MemoryStore", "derived_key", "iso"]

#: Decimals a score keeps in an answer (a journaled answer must not carry float noise).
SCORE_DECIMALS: Final = 6
#: The store's newest write and the namespace's (None: no such namespace), in one statement.
_SEQS = select(
    select(mem_seq.c.seq).where(mem_seq.c.id == 1).scalar_subquery(),
    select(mem_namespaces.c.store_seq)
    .where(mem_namespaces.c.namespace == bindparam("ns"))
    .scalar_subquery(),
)


# A put's statements, built once (tiffany/memory/writes.py says why).
#: A key's live row (``ns``, ``key``).
_CURRENT: Final = select(mem_items.c.id, mem_items.c.bytes, mem_items.c.created_at).where(
    mem_items.c.namespace == bindparam("ns"), mem_items.c.key == bindparam("key")
)
#: A namespace's live count (``ns``).
_HELD: Final = select(mem_namespaces.c.item_count).where(
    mem_namespaces.c.namespace == bindparam("ns")
)
#: A new item, answering its id.
_NEW_ITEM: Final = insert(mem_items).returning(mem_items.c.id)
#: An item's row rewritten (``b_id``, and the columns set).
_REWRITE_ITEM: Final = update(mem_items).where(mem_items.c.id == bindparam("b_id"))
#: A version appended.
_NEW_VERSION: Final = insert(mem_item_versions)


def derived_key(op: str) -> str:
    """The key a put without one gets: a digest of its op (a re-applied put gets the same)."""
    return "m-" + hashlib.blake2b(op.encode("utf-8"), digest_size=12).hexdigest()


def _digest(write: dict[str, Any]) -> str:
    """What an op's write is, for telling a re-application from a different write."""
    canonical = json.dumps(write, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _node(value: Any, field: str) -> tuple[str, str]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise MemoryInvalid(
            f"{field} must be a (namespace, key) pair",
            field=field,
            detail=[{"loc": field, "msg": "a (namespace, key) pair"}],
        )
    return limits.check_namespace(value[0], f"{field}.namespace"), limits.check_key(
        value[1], f"{field}.key"
    )


class MemoryStore:
    """Agent memory in the store's database (SQLite file or PostgreSQL).

    Thread-safe and blocking: call it from threads, never from the kernel's loop.

    Args:
        engine: The store's SQLAlchemy engine (:func:`tiffany.store.session.make_engine`),
            migrated to the memory revision (``tiffany db upgrade``).
        embedder: Computes a put's vector (default: :class:`HashingEmbedder`).
        clock: Where writes and reads read the time (TTL, ``created_at``).
        max_items: Items a namespace may hold (``TIFFANY_MEMORY_MAX_ITEMS``).
        pgvector: ``auto``: on PostgreSQL with pgvector ready, rank vectors in
            SQL (tiffany/memory/pgvector.py); ``off``: always in the process
            (``TIFFANY_MEMORY_PGVECTOR``).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        embedder: Embedder | None = None,
        clock: Clock | None = None,
        max_items: int = limits.DEFAULT_MAX_ITEMS,
        pgvector: str = "auto",
        _owns_engine: bool = False,
    ) -> None:
        self._engine = engine
        self._sqlite = engine.dialect.name == "sqlite"
        self._fulltext = fulltext_for(engine.dialect.name)
        self._writes = Writes(engine, self._fulltext)
        self.embedder: Embedder = embedder if embedder is not None else HashingEmbedder()
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self.max_items = max_items
        self._vectors = InProcessVectors(self.embedder.dims, self.embedder.id)
        self._owns_engine = _owns_engine
        self._pgvector_mode = check_mode(pgvector)
        # (writer of mem_vectors, vector path): read from the catalogue at first use.
        self._pgv: tuple[PgVectors | None, str] | None = None
        self._pgv_lock = threading.Lock()

    @classmethod
    def open(cls, database_url: str, **kwargs: Any) -> MemoryStore:
        """A store on its own engine for ``database_url`` (closed by :meth:`close`)."""
        return cls(make_engine(database_url), _owns_engine=True, **kwargs)

    @classmethod
    def from_settings(cls, settings: Settings, engine: Engine | None = None) -> MemoryStore:
        """The store ``settings`` describe: their database (or ``engine``), embedder, limit."""
        return cls(
            engine if engine is not None else make_engine(settings.database_url),
            embedder=embedder_from_settings(settings),
            max_items=settings.memory_max_items,
            pgvector=settings.memory_pgvector,
            _owns_engine=engine is None,
        )

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine it uses."""
        return self._engine

    @property
    def vector_index(self) -> str:
        """Which path ranks vectors: ``pgvector`` (in SQL) or ``exact`` (in the process)."""
        return self._pgvector()[1]

    def _pgvector(self) -> tuple[PgVectors | None, str]:
        """The pgvector writer (None: no ``mem_vectors``) and the vector path, found once."""
        found = self._pgv
        if found is None:
            with self._pgv_lock:
                if self._pgv is None:
                    self._pgv = open_for(self._engine, self._pgvector_mode)
                found = self._pgv
        return found

    def close(self) -> None:
        """Drop the in-process vectors; dispose of the engine if :meth:`open` made it."""
        self._vectors.close()
        if self._owns_engine:
            self._engine.dispose()

    # -- Writes ---------------------------------------------------------------

    def put(
        self,
        namespace: str,
        key: str | None,
        value: Any,
        text: str | None = None,
        *,
        op: str,
        ttl_s: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
        embedding: np.ndarray | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Write ``value`` under ``(namespace, key)``: a new item or its next version.

        Args:
            namespace: The item's namespace.
            key: Its key; None: a key derived from ``op``.
            value: A JSON value (at most 64 KiB of canonical JSON).
            text: The text indexed for search; None: derived from ``value``.
            op: The exactly-once key of this write.
            ttl_s: Seconds until it expires (None: never).
            run_id: The run that writes it, recorded with it.
            step_id: The step that writes it.
            embedding: Its vector, given (a rebuild from the journal); None:
                computed by the store's embedder.
            now: The write's time (default: the store's clock).

        Returns:
            ``{"namespace", "key", "version", "created", "embedder", "op",
            "store_seq", "vector", ...}``: also the write itself (``value``,
            ``text``, ``ttl_s``, ``run_id``, ``step_id``, ``at``,
            ``expires_at``), so that :meth:`apply` can redo it from the result.
        """
        return self._put(
            namespace, key, value, text, op, ttl_s, run_id, step_id, embedding, None, now
        )

    def _put(
        self,
        namespace: str,
        key: str | None,
        value: Any,
        text: str | None,
        op: str,
        ttl_s: float | None,
        run_id: str | None,
        step_id: str | None,
        embedding: np.ndarray | None,
        journaled: dict[str, Any] | None,
        now: float | None,
    ) -> dict[str, Any]:
        """:meth:`put`; ``journaled``: the embedder a rebuilt put's vector came from."""
        ns = limits.check_namespace(namespace)
        op = limits.check_op(op)
        item_key = derived_key(op) if key is None else limits.check_key(key)
        value_json = limits.check_value(value)
        item_text = limits.derive_text(value) if text is None else limits.check_text(text)
        ttl = limits.check_ttl(ttl_s)
        run = limits.check_id(run_id, "run_id")
        step = limits.check_id(step_id, "step_id")
        embedder = describe(self.embedder) if journaled is None else dict(journaled)
        vec: np.ndarray | None = None
        if embedding is not None:
            vec = self._given_vector(embedding, int(embedder["dims"]))
        digest = _digest(
            {
                "write": "put",
                "namespace": ns,
                "key": item_key,
                "value": value_json,
                "text": item_text,
                "ttl_s": ttl,
                "run_id": run,
                "step_id": step,
            }
        )
        earlier = self._writes.earlier(op, digest)
        if earlier is not None:
            return earlier
        if vec is None:
            vec = normalize(self.embedder.embed([item_text]))[0]
        at = self._clock.time() if now is None else now
        blob = np.asarray(vec, dtype="<f4").tobytes()
        pgv = self._pgvector()[0]

        def apply(conn: Connection, seq: int) -> dict[str, Any]:
            self._writes.sweep(conn, ns, at, seq)
            current = conn.execute(_CURRENT, {"ns": ns, "key": item_key}).first()
            version = self._writes.next_version(conn, ns, item_key)
            size = len(value_json.encode("utf-8")) + len(item_text.encode("utf-8"))
            expires_at = None if ttl is None else at + ttl
            row = {
                "value": value_json,
                "text": item_text,
                "version": version,
                "updated_at": at,
                "expires_at": expires_at,
                "run_id": run,
                "step_id": step,
                "embedder": embedder["id"],
                "vector": blob,
                "bytes": size,
                "store_seq": seq,
            }
            if current is None:
                held = conn.execute(_HELD, {"ns": ns}).scalar()
                if held is not None and held >= self.max_items:
                    raise MemoryFull(
                        f"namespace {ns!r} holds {held} items, its limit",
                        field="namespace",
                        detail={
                            "namespace": ns,
                            "limit": self.max_items,
                            "setting": "TIFFANY_MEMORY_MAX_ITEMS",
                        },
                    )
                item_id = conn.execute(
                    _NEW_ITEM, {"namespace": ns, "key": item_key, "created_at": at, **row}
                ).scalar_one()
                self._fulltext.insert(conn, item_id, ns, item_text)
                self._writes.count(conn, ns, 1, size, seq, at)
            else:
                item_id = current.id
                conn.execute(_REWRITE_ITEM, {"b_id": item_id, **row})
                self._fulltext.update(conn, item_id, ns, item_text)
                self._writes.count(conn, ns, 0, size - current.bytes, seq, at)
            if pgv is not None:
                pgv.write(
                    conn,
                    item_id=item_id,
                    namespace=ns,
                    key=item_key,
                    embedder=embedder["id"],
                    expires_at=expires_at,
                    store_seq=seq,
                    vec=vec,
                )
            conn.execute(
                _NEW_VERSION,
                {
                    "namespace": ns,
                    "key": item_key,
                    "version": version,
                    "value": value_json,
                    "text": item_text,
                    "deleted": False,
                    "op": op,
                    "run_id": run,
                    "step_id": step,
                    "at": at,
                    "store_seq": seq,
                },
            )
            return {
                "write": "put",
                "namespace": ns,
                "key": item_key,
                "version": version,
                "created": current is None,
                "embedder": embedder,
                "op": op,
                "store_seq": seq,
                "vector": encode_vector(vec),
                "value": json.loads(value_json),
                "text": item_text,
                "ttl_s": ttl,
                "run_id": run,
                "step_id": step,
                "at": iso(at),
                "expires_at": iso(expires_at),
            }

        return self._writes.run(op, digest, at, apply)

    def delete(
        self, namespace: str, key: str, *, op: str, now: float | None = None
    ) -> dict[str, Any]:
        """Delete an item (its history stays; its links go). ``deleted``: whether it was there."""
        ns = limits.check_namespace(namespace)
        item_key = limits.check_key(key)
        op = limits.check_op(op)
        digest = _digest({"write": "delete", "namespace": ns, "key": item_key})
        earlier = self._writes.earlier(op, digest)
        if earlier is not None:
            return earlier
        at = self._clock.time() if now is None else now

        def apply(conn: Connection, seq: int) -> dict[str, Any]:
            self._writes.sweep(conn, ns, at, seq)
            current = conn.execute(
                select(mem_items.c.id, mem_items.c.bytes).where(
                    mem_items.c.namespace == ns, mem_items.c.key == item_key
                )
            ).first()
            version = None
            if current is not None:
                version = self._writes.next_version(conn, ns, item_key)
                self._fulltext.delete(conn, [current.id])
                conn.execute(delete(mem_items).where(mem_items.c.id == current.id))
                self._writes.unlink(conn, [(ns, item_key)])
                conn.execute(
                    insert(mem_item_versions).values(
                        namespace=ns,
                        key=item_key,
                        version=version,
                        value=None,
                        text=None,
                        deleted=True,
                        op=op,
                        run_id=None,
                        step_id=None,
                        at=at,
                        store_seq=seq,
                    )
                )
                self._writes.count(conn, ns, -1, -current.bytes, seq, at)
            return {
                "write": "delete",
                "namespace": ns,
                "key": item_key,
                "deleted": current is not None,
                "version": version,
                "op": op,
                "store_seq": seq,
                "at": iso(at),
            }

        return self._writes.run(op, digest, at, apply)

    def link(
        self,
        subject: tuple[str, str],
        relation: str,
        obj: tuple[str, str],
        *,
        op: str,
        props: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Link two live items: ``subject -relation-> obj`` (again: its props replaced).

        Refused with :class:`MemoryNotFound` (``field`` ``subject`` or
        ``object``) when either item is not there.
        """
        src = _node(subject, "subject")
        rel = limits.check_relation(relation)
        dst = _node(obj, "object")
        op = limits.check_op(op)
        props_json = limits.check_props(props)
        digest = _digest(
            {"write": "link", "subject": src, "relation": rel, "object": dst, "props": props_json}
        )
        earlier = self._writes.earlier(op, digest)
        if earlier is not None:
            return earlier
        at = self._clock.time() if now is None else now

        def apply(conn: Connection, seq: int) -> dict[str, Any]:
            for field, (ns, key) in (("subject", src), ("object", dst)):
                there = conn.execute(
                    select(mem_items.c.id).where(
                        mem_items.c.namespace == ns, mem_items.c.key == key, live(at)
                    )
                ).first()
                if there is None:
                    raise MemoryNotFound(
                        f"no item {key!r} in namespace {ns!r}",
                        field=field,
                        detail={"namespace": ns, "key": key},
                    )
            edge = (
                (mem_links.c.src_ns == src[0])
                & (mem_links.c.src_key == src[1])
                & (mem_links.c.relation == rel)
                & (mem_links.c.dst_ns == dst[0])
                & (mem_links.c.dst_key == dst[1])
            )
            found = conn.execute(select(mem_links.c.id).where(edge)).first()
            fields = {"props": props_json, "op": op, "at": at, "store_seq": seq}
            if found is None:
                conn.execute(
                    insert(mem_links).values(
                        src_ns=src[0],
                        src_key=src[1],
                        relation=rel,
                        dst_ns=dst[0],
                        dst_key=dst[1],
                        **fields,
                    )
                )
            else:
                conn.execute(update(mem_links).where(mem_links.c.id == found.id).values(**fields))
            return {
                "write": "link",
                "subject": {"namespace": src[0], "key": src[1]},
                "relation": rel,
                "object": {"namespace": dst[0], "key": dst[1]},
                "props": None if props_json is None else json.loads(props_json),
                "created": found is None,
                "op": op,
                "store_seq": seq,
                "at": iso(at),
            }

        return self._writes.run(op, digest, at, apply)

    def apply(self, result: dict[str, Any]) -> dict[str, Any]:
        """Re-apply a write from its journaled result (idempotent on its op).

        A put keeps its journaled vector (no model call), key and times.
        """
        write = result.get("write")
        at = epoch(result.get("at"))
        if write == "put":
            # The journaled vector, labelled with the embedder that made it:
            # under another embedder it is kept, and found by text only.
            return self._put(
                result["namespace"],
                result["key"],
                result["value"],
                result["text"],
                result["op"],
                result.get("ttl_s"),
                result.get("run_id"),
                result.get("step_id"),
                decode_vector(result["vector"]),
                result["embedder"],
                at,
            )
        if write == "delete":
            return self.delete(result["namespace"], result["key"], op=result["op"], now=at)
        if write == "link":
            subject, obj = result["subject"], result["object"]
            return self.link(
                (subject["namespace"], subject["key"]),
                result["relation"],
                (obj["namespace"], obj["key"]),
                op=result["op"],
                props=result.get("props"),
                now=at,
            )
        raise MemoryInvalid(
            f"not the result of a memory write: write={write!r}",
            field="write",
            detail=[{"loc": "write", "msg": "put, delete or link"}],
        )

    # -- Reads ----------------------------------------------------------------

    def get(self, namespace: str, key: str, *, now: float | None = None) -> dict[str, Any] | None:
        """The live item ``(namespace, key)``, or None."""
        ns = limits.check_namespace(namespace)
        item_key = limits.check_key(key)
        at = self._clock.time() if now is None else now
        with self._engine.connect() as conn:
            row = conn.execute(
                select(*ITEM_COLUMNS).where(
                    mem_items.c.namespace == ns, mem_items.c.key == item_key, live(at)
                )
            ).first()
        return None if row is None else answer(row)

    def search(
        self,
        namespace: str,
        query: str,
        k: int = 10,
        *,
        mode: str = "hybrid",
        now: float | None = None,
    ) -> dict[str, Any]:
        """The ``k`` items of ``namespace`` that best match ``query``, best first.

        ``mode``: ``hybrid`` (full-text and vector ranks fused by RRF),
        ``text`` or ``vector``. Each item carries its ``score`` (RRF sum,
        ``bm25``-derived / ``ts_rank_cd``, or cosine), ``as_of`` the newest
        write the answer saw.
        """
        ns = limits.check_namespace(namespace)
        limits.check_query(query)
        n = limits.check_k(k)
        how = limits.check_mode(mode)
        at = self._clock.time() if now is None else now
        words = query_words(query)
        qvec: np.ndarray | None = None
        if how != "text":
            qvec = normalize(self.embedder.embed([query]))[0]
        in_sql = how != "text" and self.vector_index == "pgvector"
        with self._read() as conn:
            seqs = conn.execute(_SEQS, {"ns": ns}).one()
            as_of, ns_seq = int(seqs[0] or 0), seqs[1]
            hits: list[tuple[str, float]] = []
            if ns_seq is not None:
                wanted = candidates(n)
                text_hits: list[tuple[str, float]] = []
                vector_hits: list[tuple[str, float]] = []
                vector_leg: Future[list[tuple[str, float]] | None] | None = None
                helping = Helping()
                if qvec is not None and np.any(qvec) and how == "hybrid" and words and not in_sql:
                    # Both legs at once: the product on a helper thread, the
                    # text's SQL here (the vectors are brought to ns_seq first,
                    # on this connection: the helper never touches it); then
                    # this thread takes the product's pieces that are left.
                    self._vectors.ensure(conn, ns, ns_seq)
                    vector_leg = self._vectors.start(ns, ns_seq, qvec, wanted, at, helping)
                if how != "vector" and words:
                    text_hits = self._fulltext.ranks(conn, ns, words, wanted, at)
                if vector_leg is not None and vector_leg.cancel():
                    vector_leg = None  # the helper was busy: the product is this thread's
                if vector_leg is not None:
                    helping.help()
                    vector_hits = vector_leg.result() or []
                elif qvec is not None and np.any(qvec):
                    vector_hits = self._vector_ranks(conn, ns, ns_seq, qvec, wanted, at)
                if how == "text":
                    hits = text_hits[:n]
                elif how == "vector":
                    hits = vector_hits[:n]
                else:
                    hits = rrf(([k for k, _ in text_hits], [k for k, _ in vector_hits]), n)
            items = by_key(conn, ns, [k for k, _ in hits], at)
        out = []
        for key, score in hits:
            item = items.get(key)
            if item is not None:
                out.append({**item, "score": round(score, SCORE_DECIMALS)})
        return {
            "items": out,
            "mode": how,
            "embedder": describe(self.embedder),
            "as_of": as_of,
            "vector_index": None if how == "text" else self.vector_index,
        }

    def neighbors(
        self,
        namespace: str,
        key: str,
        *,
        relation: str | None = None,
        depth: int = 1,
        limit: int = 50,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Items linked to ``(namespace, key)`` up to ``depth`` links away, nearest first.

        Both directions (``direction``: ``out`` along a link, ``in`` against
        it); each item once, at its nearest depth. Within a depth: by
        relation, direction (out first), namespace, key. Expired or deleted
        items are not reached (nor reached through).
        """
        ns = limits.check_namespace(namespace)
        item_key = limits.check_key(key)
        rel = None if relation is None else limits.check_relation(relation)
        max_depth = limits.check_depth(depth)
        cap = limits.check_limit(limit)
        at = self._clock.time() if now is None else now
        with self._read() as conn:
            return {"items": walk(conn, (ns, item_key), rel, max_depth, cap, at)}

    def namespaces(self, *, now: float | None = None) -> list[dict[str, Any]]:
        """Every namespace with live items: ``{"namespace", "items", "bytes", "updated_at"}``."""
        at = self._clock.time() if now is None else now
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(
                    mem_items.c.namespace,
                    func.count(),
                    func.sum(mem_items.c.bytes),
                    func.max(mem_items.c.updated_at),
                )
                .where(live(at))
                .group_by(mem_items.c.namespace)
                .order_by(mem_items.c.namespace)
            ).all()
        return [
            {"namespace": ns, "items": int(count), "bytes": int(size or 0), "updated_at": iso(last)}
            for ns, count, size, last in rows
        ]

    def items(
        self,
        namespace: str,
        *,
        after: str | None = None,
        limit: int = 50,
        now: float | None = None,
    ) -> dict[str, Any]:
        """A page of a namespace's live items by key: ``{"items", "next"}``.

        ``next`` is the ``after`` of the next page (None: the last page).
        """
        ns = limits.check_namespace(namespace)
        cap = limits.check_limit(limit)
        if after is not None and (not isinstance(after, str) or len(after) > limits.KEY_MAX_CHARS):
            raise MemoryInvalid(
                "after must be a key", field="after", detail=[{"loc": "after", "msg": "a key"}]
            )
        at = self._clock.time() if now is None else now
        query = select(*ITEM_COLUMNS).where(mem_items.c.namespace == ns, live(at))
        if after is not None:
            query = query.where(mem_items.c.key > after)
        with self._engine.connect() as conn:
            rows = conn.execute(query.order_by(mem_items.c.key).limit(cap + 1)).all()
        page = [answer(r) for r in rows[:cap]]
        return {"items": page, "next": page[-1]["key"] if len(rows) > cap else None}

    def history(self, namespace: str, key: str) -> list[dict[str, Any]]:
        """Every version of an item, oldest first (deletes included: ``deleted``)."""
        ns = limits.check_namespace(namespace)
        item_key = limits.check_key(key)
        v = mem_item_versions.c
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(v.version, v.value, v.text, v.op, v.run_id, v.step_id, v.at, v.deleted)
                .where(v.namespace == ns, v.key == item_key)
                .order_by(v.version)
            ).all()
        return [
            {
                "version": r.version,
                "value": None if r.value is None else json.loads(r.value),
                "text": r.text,
                "op": r.op,
                "run_id": r.run_id,
                "step_id": r.step_id,
                "at": iso(r.at),
                "deleted": bool(r.deleted),
            }
            for r in rows
        ]

    def links(self, namespace: str, key: str) -> list[dict[str, Any]]:
        """The links from and to an item, oldest first."""
        ns = limits.check_namespace(namespace)
        item_key = limits.check_key(key)
        c = mem_links.c
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(mem_links)
                .where(
                    or_(
                        (c.src_ns == ns) & (c.src_key == item_key),
                        (c.dst_ns == ns) & (c.dst_key == item_key),
                    )
                )
                .order_by(c.store_seq, c.id)
            ).all()
        return [
            {
                "subject": {"namespace": r.src_ns, "key": r.src_key},
                "relation": r.relation,
                "object": {"namespace": r.dst_ns, "key": r.dst_key},
                "props": None if r.props is None else json.loads(r.props),
                "op": r.op,
                "at": iso(r.at),
            }
            for r in rows
        ]

    def applied(self, op: str) -> dict[str, Any] | None:
        """The result of the write applied under ``op``, or None."""
        op = limits.check_op(op)
        with self._engine.connect() as conn:
            stored = conn.execute(
                select(mem_applied.c.result).where(mem_applied.c.op == op)
            ).scalar()
        return None if stored is None else dict(json.loads(stored))

    # -- Writes' machinery ----------------------------------------------------

    @staticmethod
    def _given_vector(embedding: Any, dims: int) -> np.ndarray:
        vec = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if vec.shape[0] != dims or not np.all(np.isfinite(vec)):
            raise MemoryInvalid(
                f"embedding must be {dims} finite numbers",
                field="embedding",
                detail=[{"loc": "embedding", "msg": f"{dims} finite numbers"}],
            )
        row: np.ndarray = normalize(vec)[0]
        return row

    # -- Reads' machinery -----------------------------------------------------

    @contextlib.contextmanager
    def _read(self) -> Iterator[Connection]:
        """A connection whose statements share one snapshot (a search's, a walk's)."""
        with self._engine.connect() as conn:
            if self._sqlite:
                conn.exec_driver_sql("BEGIN")
            else:
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
                # The planner walked every row's tsvector (a LIMIT looked
                # cheap; bench/README.md, "Figures behind design choices in
                # the code") instead of asking the GIN index; a search's
                # statements all have an index to use.
                conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            try:
                yield conn
            finally:
                conn.rollback()

    def _vector_ranks(
        self, conn: Connection, ns: str, ns_seq: int, qvec: np.ndarray, n: int, at: float
    ) -> list[tuple[str, float]]:
        """The ``n`` nearest items by cosine (the namespace's vectors brought to ``ns_seq``)."""
        pgv, path = self._pgvector()
        if path == "pgvector" and pgv is not None:
            return pgv.ranks(conn, ns, self.embedder.id, qvec, n, at)
        return self._vectors.ranks(conn, ns, ns_seq, qvec, n, at)
