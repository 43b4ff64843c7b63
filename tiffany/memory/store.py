"""The MemoryStore: items in namespaces, links between them, search; writes exactly once.

The public interface is docs/memory.md's (and /work's MEMORY_SPEC): writes
(:meth:`MemoryStore.put`, :meth:`~MemoryStore.delete`, :meth:`~MemoryStore.link`)
take an ``op``, the exactly-once key a run derives from its journal position;
reads answer JSON-able dicts in a deterministic order, what a run journals.

Invariants:

* A write is one transaction: it claims its ``op`` in ``mem_applied`` first
  (an op already there with the same digest returns the stored result and
  writes nothing; with another digest it is refused, ``field="op"``), then
  applies, bumps ``mem_seq`` and stores its result in the claim. Any
  exception rolls all of it back, so a write is applied once or not at all,
  whatever kills the process between two writes.
* A put's embedding is computed before the transaction (a model call never
  holds the database's write lock) and only when its op is new.
* Expired items are invisible to every read (filtered at read time, against
  the reader's clock), and swept by the writes of their namespace.
* ``mem_namespaces`` holds each namespace's live count, bytes and newest
  ``store_seq`` (moved by puts, deletes and sweeps): the size limit and the
  vector index's freshness read it.

Discussion: on SQLite a write starts with ``BEGIN IMMEDIATE``: the file is
shared with the projector (another process that writes), and a deferred
transaction that reads first and then writes can fail at once with
``SQLITE_BUSY`` when another writer committed in between (the busy handler
cannot help a stale snapshot). Taking the write lock first makes the busy
timeout apply. On PostgreSQL the ``mem_seq`` row's update serializes the
writes after their claims, so the counts they read are current.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Final

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
    text,
    tuple_,
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
    encode_vector,
    normalize,
)
from tiffany.memory.fulltext import fulltext_for
from tiffany.memory.search import VectorIndex, candidates, query_words, rrf
from tiffany.memory.tables import (
    mem_applied,
    mem_item_versions,
    mem_items,
    mem_links,
    mem_namespaces,
    mem_seq,
)
from tiffany.store.session import make_engine

__all__ = ["MemoryStore", "derived_key", "iso"]

#: Decimals a score keeps in an answer (a journaled answer must not carry float noise).
SCORE_DECIMALS: Final = 6
#: Changed rows past which a namespace's vectors are loaded afresh instead of patched.
_REFRESH_REBUILD_ROWS: Final = 5_000

#: The store's newest write and the namespace's (None: no such namespace), in one statement.
_SEQS = select(
    select(mem_seq.c.seq).where(mem_seq.c.id == 1).scalar_subquery(),
    select(mem_namespaces.c.store_seq)
    .where(mem_namespaces.c.namespace == bindparam("ns"))
    .scalar_subquery(),
)

_ITEM_COLUMNS = (
    mem_items.c.namespace,
    mem_items.c.key,
    mem_items.c.value,
    mem_items.c.text,
    mem_items.c.version,
    mem_items.c.created_at,
    mem_items.c.updated_at,
    mem_items.c.run_id,
    mem_items.c.step_id,
    mem_items.c.expires_at,
)


def iso(at: float | None) -> str | None:
    """ISO-8601 UTC (microseconds, ``Z``) of epoch seconds, or None."""
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(at: str | None) -> float | None:
    if at is None:
        return None
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def derived_key(op: str) -> str:
    """The key a put without one gets: a digest of its op (a re-applied put gets the same)."""
    return "m-" + hashlib.blake2b(op.encode("utf-8"), digest_size=12).hexdigest()


def _digest(write: dict[str, Any]) -> str:
    """What an op's write is, for telling a re-application from a different write."""
    canonical = json.dumps(write, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _live(now: float) -> Any:
    return or_(mem_items.c.expires_at.is_(None), mem_items.c.expires_at > now)


def _item(row: Any) -> dict[str, Any]:
    return {
        "namespace": row.namespace,
        "key": row.key,
        "value": json.loads(row.value),
        "text": row.text,
        "version": row.version,
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
        "run_id": row.run_id,
        "step_id": row.step_id,
        "expires_at": iso(row.expires_at),
    }


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


class _OpTaken(Exception):
    """Inside a write: its op was applied before; ``result`` is what it answered."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("op applied before")
        self.result = result


class MemoryStore:
    """Agent memory in the store's database (SQLite file or PostgreSQL).

    Thread-safe and blocking: call it from threads, never from the kernel's loop.

    Args:
        engine: The store's SQLAlchemy engine (:func:`tiffany.store.session.make_engine`),
            migrated to the memory revision (``tiffany db upgrade``).
        embedder: Computes a put's vector (default: :class:`HashingEmbedder`).
        clock: Where writes and reads read the time (TTL, ``created_at``).
        max_items: Items a namespace may hold (``TIFFANY_MEMORY_MAX_ITEMS``).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        embedder: Embedder | None = None,
        clock: Clock | None = None,
        max_items: int = limits.DEFAULT_MAX_ITEMS,
        _owns_engine: bool = False,
    ) -> None:
        self._engine = engine
        self._sqlite = engine.dialect.name == "sqlite"
        self._fulltext = fulltext_for(engine.dialect.name)
        self.embedder: Embedder = embedder if embedder is not None else HashingEmbedder()
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self.max_items = max_items
        self._vectors = VectorIndex(self.embedder.dims)
        self._refresh_lock = threading.Lock()
        self._owns_engine = _owns_engine

    @classmethod
    def open(cls, database_url: str, **kwargs: Any) -> MemoryStore:
        """A store on its own engine for ``database_url`` (closed by :meth:`close`)."""
        return cls(make_engine(database_url), _owns_engine=True, **kwargs)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine it uses."""
        return self._engine

    def close(self) -> None:
        """Drop the in-process vectors; dispose of the engine if :meth:`open` made it."""
        self._vectors.drop()
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
        ns = limits.check_namespace(namespace)
        op = limits.check_op(op)
        item_key = derived_key(op) if key is None else limits.check_key(key)
        value_json = limits.check_value(value)
        item_text = limits.derive_text(value) if text is None else limits.check_text(text)
        ttl = limits.check_ttl(ttl_s)
        run = limits.check_id(run_id, "run_id")
        step = limits.check_id(step_id, "step_id")
        embedder = describe(self.embedder)
        vec: np.ndarray | None = None
        if embedding is not None:
            vec = self._given_vector(embedding)
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
        earlier = self._earlier(op, digest)
        if earlier is not None:
            return earlier
        if vec is None:
            vec = normalize(self.embedder.embed([item_text]))[0]
        at = self._clock.time() if now is None else now
        blob = np.asarray(vec, dtype="<f4").tobytes()

        def apply(conn: Connection, seq: int) -> dict[str, Any]:
            self._sweep(conn, ns, at, seq)
            current = conn.execute(
                select(mem_items.c.id, mem_items.c.bytes, mem_items.c.created_at).where(
                    mem_items.c.namespace == ns, mem_items.c.key == item_key
                )
            ).first()
            version = self._next_version(conn, ns, item_key)
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
                held = conn.execute(
                    select(mem_namespaces.c.item_count).where(mem_namespaces.c.namespace == ns)
                ).scalar()
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
                    insert(mem_items)
                    .values(namespace=ns, key=item_key, created_at=at, **row)
                    .returning(mem_items.c.id)
                ).scalar_one()
                self._fulltext.insert(conn, item_id, ns, item_text)
                self._count(conn, ns, 1, size, seq, at)
            else:
                item_id = current.id
                conn.execute(update(mem_items).where(mem_items.c.id == item_id).values(**row))
                self._fulltext.update(conn, item_id, ns, item_text)
                self._count(conn, ns, 0, size - current.bytes, seq, at)
            conn.execute(
                insert(mem_item_versions).values(
                    namespace=ns,
                    key=item_key,
                    version=version,
                    value=value_json,
                    text=item_text,
                    deleted=False,
                    op=op,
                    run_id=run,
                    step_id=step,
                    at=at,
                    store_seq=seq,
                )
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

        return self._write(op, digest, at, apply)

    def delete(
        self, namespace: str, key: str, *, op: str, now: float | None = None
    ) -> dict[str, Any]:
        """Delete an item (its history stays; its links go). ``deleted``: whether it was there."""
        ns = limits.check_namespace(namespace)
        item_key = limits.check_key(key)
        op = limits.check_op(op)
        digest = _digest({"write": "delete", "namespace": ns, "key": item_key})
        earlier = self._earlier(op, digest)
        if earlier is not None:
            return earlier
        at = self._clock.time() if now is None else now

        def apply(conn: Connection, seq: int) -> dict[str, Any]:
            self._sweep(conn, ns, at, seq)
            current = conn.execute(
                select(mem_items.c.id, mem_items.c.bytes).where(
                    mem_items.c.namespace == ns, mem_items.c.key == item_key
                )
            ).first()
            version = None
            if current is not None:
                version = self._next_version(conn, ns, item_key)
                self._fulltext.delete(conn, [current.id])
                conn.execute(delete(mem_items).where(mem_items.c.id == current.id))
                self._unlink(conn, [(ns, item_key)])
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
                self._count(conn, ns, -1, -current.bytes, seq, at)
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

        return self._write(op, digest, at, apply)

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
        earlier = self._earlier(op, digest)
        if earlier is not None:
            return earlier
        at = self._clock.time() if now is None else now

        def apply(conn: Connection, seq: int) -> dict[str, Any]:
            for field, (ns, key) in (("subject", src), ("object", dst)):
                there = conn.execute(
                    select(mem_items.c.id).where(
                        mem_items.c.namespace == ns, mem_items.c.key == key, _live(at)
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

        return self._write(op, digest, at, apply)

    def apply(self, result: dict[str, Any]) -> dict[str, Any]:
        """Re-apply a write from its journaled result (idempotent on its op).

        A put keeps its journaled vector (no model call), key and times.
        """
        write = result.get("write")
        at = _epoch(result.get("at"))
        if write == "put":
            vector = decode_vector(result["vector"])
            return self.put(
                result["namespace"],
                result["key"],
                result["value"],
                result["text"],
                op=result["op"],
                ttl_s=result.get("ttl_s"),
                run_id=result.get("run_id"),
                step_id=result.get("step_id"),
                embedding=vector,
                now=at,
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
                select(*_ITEM_COLUMNS).where(
                    mem_items.c.namespace == ns, mem_items.c.key == item_key, _live(at)
                )
            ).first()
        return None if row is None else _item(row)

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
        with self._read() as conn:
            seqs = conn.execute(_SEQS, {"ns": ns}).one()
            as_of, ns_seq = int(seqs[0] or 0), seqs[1]
            hits: list[tuple[str, float]] = []
            if ns_seq is not None:
                wanted = candidates(n)
                text_hits: list[tuple[str, float]] = []
                vector_hits: list[tuple[str, float]] = []
                if how != "vector" and words:
                    text_hits = self._fulltext.ranks(conn, ns, words, wanted, at)
                if qvec is not None and np.any(qvec):
                    vector_hits = self._vector_ranks(conn, ns, ns_seq, qvec, wanted, at)
                if how == "text":
                    hits = text_hits[:n]
                elif how == "vector":
                    hits = vector_hits[:n]
                else:
                    hits = rrf(([k for k, _ in text_hits], [k for k, _ in vector_hits]), n)
            items = self._items_by_key(conn, ns, [k for k, _ in hits], at)
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
        found: list[dict[str, Any]] = []
        with self._read() as conn:
            if not self._items_by_key(conn, ns, [item_key], at):
                return {"items": []}
            seen = {(ns, item_key)}
            frontier = [(ns, item_key)]
            for level in range(1, max_depth + 1):
                if not frontier or len(found) >= cap:
                    break
                edges = self._edges(conn, frontier, rel)
                fresh: list[tuple[str, str, str, str]] = []
                for relation_name, direction, other_ns, other_key in edges:
                    if (other_ns, other_key) in seen:
                        continue
                    seen.add((other_ns, other_key))
                    fresh.append((relation_name, direction, other_ns, other_key))
                values = self._values(conn, [(n, k) for _, _, n, k in fresh], at)
                frontier = []
                for relation_name, direction, other_ns, other_key in fresh:
                    value = values.get((other_ns, other_key), _MISSING)
                    if value is _MISSING:
                        continue
                    frontier.append((other_ns, other_key))
                    found.append(
                        {
                            "namespace": other_ns,
                            "key": other_key,
                            "relation": relation_name,
                            "direction": direction,
                            "depth": level,
                            "value": value,
                        }
                    )
                    if len(found) >= cap:
                        break
        return {"items": found}

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
                .where(_live(at))
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
        query = select(*_ITEM_COLUMNS).where(mem_items.c.namespace == ns, _live(at))
        if after is not None:
            query = query.where(mem_items.c.key > after)
        with self._engine.connect() as conn:
            rows = conn.execute(query.order_by(mem_items.c.key).limit(cap + 1)).all()
        page = [_item(r) for r in rows[:cap]]
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

    def _given_vector(self, embedding: Any) -> np.ndarray:
        vec = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if vec.shape[0] != self.embedder.dims or not np.all(np.isfinite(vec)):
            raise MemoryInvalid(
                f"embedding must be {self.embedder.dims} finite numbers",
                field="embedding",
                detail=[{"loc": "embedding", "msg": f"{self.embedder.dims} finite numbers"}],
            )
        row: np.ndarray = normalize(vec)[0]
        return row

    def _earlier(self, op: str, digest: str) -> dict[str, Any] | None:
        """The stored result of ``op`` if it was applied (refused if for another write)."""
        with self._engine.connect() as conn:
            row = conn.execute(
                select(mem_applied.c.digest, mem_applied.c.result).where(mem_applied.c.op == op)
            ).first()
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
    def _transaction(self) -> Iterator[Connection]:
        with self._engine.connect() as conn:
            try:
                if self._sqlite:
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def _write(self, op: str, digest: str, at: float, apply: Any) -> dict[str, Any]:
        """Claim ``op``, apply, bump the seq and store the result: one transaction."""
        try:
            with self._transaction() as conn:
                self._claim(conn, op, digest, at)
                seq = conn.execute(
                    update(mem_seq)
                    .where(mem_seq.c.id == 1)
                    .values(seq=mem_seq.c.seq + 1)
                    .returning(mem_seq.c.seq)
                ).scalar_one()
                result: dict[str, Any] = apply(conn, seq)
                conn.execute(
                    update(mem_applied)
                    .where(mem_applied.c.op == op)
                    .values(result=json.dumps(result, sort_keys=True), store_seq=seq)
                )
        except _OpTaken as taken:
            return taken.result
        return result

    def _claim(self, conn: Connection, op: str, digest: str, at: float) -> None:
        """Insert ``op``'s claim, or raise :class:`_OpTaken` with its earlier result."""
        if self._sqlite:
            # The write lock is held (BEGIN IMMEDIATE): no one else can claim meanwhile.
            row = conn.execute(
                select(mem_applied.c.digest, mem_applied.c.result).where(mem_applied.c.op == op)
            ).first()
            if row is None:
                conn.execute(insert(mem_applied).values(op=op, digest=digest, at=at))
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
            row = conn.execute(
                select(mem_applied.c.digest, mem_applied.c.result).where(mem_applied.c.op == op)
            ).first()
            assert row is not None
        raise _OpTaken(self._same(op, digest, row.digest, row.result))

    @staticmethod
    def _next_version(conn: Connection, ns: str, key: str) -> int:
        last = conn.execute(
            select(func.max(mem_item_versions.c.version)).where(
                mem_item_versions.c.namespace == ns, mem_item_versions.c.key == key
            )
        ).scalar()
        return int(last or 0) + 1

    @staticmethod
    def _count(conn: Connection, ns: str, items: int, size: int, seq: int, at: float) -> None:
        """Move the namespace's live count and bytes; mark it changed at ``seq``."""
        changed = conn.execute(
            update(mem_namespaces)
            .where(mem_namespaces.c.namespace == ns)
            .values(
                item_count=mem_namespaces.c.item_count + items,
                bytes=mem_namespaces.c.bytes + size,
                store_seq=seq,
                updated_at=at,
            )
        ).rowcount
        if not changed:
            conn.execute(
                insert(mem_namespaces).values(
                    namespace=ns, item_count=items, bytes=size, store_seq=seq, updated_at=at
                )
            )

    def _sweep(self, conn: Connection, ns: str, at: float, seq: int) -> None:
        """Remove the namespace's expired items (their history stays)."""
        gone = conn.execute(
            select(mem_items.c.id, mem_items.c.key, mem_items.c.bytes).where(
                mem_items.c.namespace == ns,
                mem_items.c.expires_at.is_not(None),
                mem_items.c.expires_at <= at,
            )
        ).all()
        if not gone:
            return
        ids = [r.id for r in gone]
        self._fulltext.delete(conn, ids)
        conn.execute(delete(mem_items).where(mem_items.c.id.in_(ids)))
        self._unlink(conn, [(ns, r.key) for r in gone])
        self._count(conn, ns, -len(gone), -sum(r.bytes for r in gone), seq, at)

    @staticmethod
    def _unlink(conn: Connection, nodes: Sequence[tuple[str, str]]) -> None:
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

    # -- Reads' machinery -----------------------------------------------------

    @contextlib.contextmanager
    def _read(self) -> Iterator[Connection]:
        """A connection whose statements share one snapshot (a search's, a walk's)."""
        with self._engine.connect() as conn:
            if self._sqlite:
                conn.exec_driver_sql("BEGIN")
            else:
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            try:
                yield conn
            finally:
                conn.rollback()

    def _vector_ranks(
        self, conn: Connection, ns: str, ns_seq: int, qvec: np.ndarray, n: int, at: float
    ) -> list[tuple[str, float]]:
        """The ``n`` nearest items by cosine (the namespace's vectors brought to ``ns_seq``)."""
        hits = self._vectors.top(ns, ns_seq, qvec, n, at)
        if hits is None:
            with self._refresh_lock:
                self._refresh(conn, ns, ns_seq)
            hits = self._vectors.top(ns, ns_seq, qvec, n, at)
        return hits or []

    def _refresh(self, conn: Connection, ns: str, ns_seq: int) -> None:
        """Bring the namespace's vectors to ``ns_seq``: the rows written since, or all of them."""
        have = self._vectors.seq_of(ns)
        if have is not None and have >= ns_seq:
            return  # another search brought it here, or past (newer rows drop out by key)
        embedder_id = self.embedder.id
        if have is not None and have < ns_seq:
            v = mem_item_versions.c
            changed = (
                conn.execute(
                    select(v.key)
                    .where(v.namespace == ns, v.store_seq > have, v.store_seq <= ns_seq)
                    .distinct()
                    .limit(_REFRESH_REBUILD_ROWS + 1)
                )
                .scalars()
                .all()
            )
            # Swept items have no version row: their rows stay, masked by
            # their expiry, until their key is written again.
            if len(changed) <= _REFRESH_REBUILD_ROWS:
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
                    if r is None or r.embedder != embedder_id:
                        changes.append((key, None, None))
                    else:
                        changes.append((key, r.vector, r.expires_at))
                if self._vectors.update(ns, have, ns_seq, changes):
                    return
        rows_all = conn.execute(
            select(mem_items.c.key, mem_items.c.vector, mem_items.c.expires_at)
            .where(mem_items.c.namespace == ns, mem_items.c.embedder == embedder_id)
            .order_by(mem_items.c.key)
        ).all()
        self._vectors.replace(ns, ns_seq, rows_all)

    def _items_by_key(
        self, conn: Connection, ns: str, keys: Sequence[str], at: float
    ) -> dict[str, dict[str, Any]]:
        if not keys:
            return {}
        rows = conn.execute(
            select(*_ITEM_COLUMNS).where(
                mem_items.c.namespace == ns, mem_items.c.key.in_(list(keys)), _live(at)
            )
        ).all()
        return {r.key: _item(r) for r in rows}

    def _values(
        self, conn: Connection, nodes: Sequence[tuple[str, str]], at: float
    ) -> dict[tuple[str, str], Any]:
        out: dict[tuple[str, str], Any] = {}
        for start in range(0, len(nodes), 200):
            chunk = list(nodes[start : start + 200])
            rows = conn.execute(
                select(mem_items.c.namespace, mem_items.c.key, mem_items.c.value).where(
                    tuple_(mem_items.c.namespace, mem_items.c.key).in_(chunk), _live(at)
                )
            ).all()
            for r in rows:
                out[(r.namespace, r.key)] = json.loads(r.value)
        return out

    @staticmethod
    def _edges(
        conn: Connection, frontier: Sequence[tuple[str, str]], relation: str | None
    ) -> list[tuple[str, str, str, str]]:
        """Links touching ``frontier``: ``(relation, direction, other ns, other key)``, sorted."""
        c = mem_links.c
        edges: set[tuple[str, str, str, str]] = set()
        for start in range(0, len(frontier), 200):
            chunk = list(frontier[start : start + 200])
            out_q = select(c.relation, c.dst_ns, c.dst_key).where(
                tuple_(c.src_ns, c.src_key).in_(chunk)
            )
            in_q = select(c.relation, c.src_ns, c.src_key).where(
                tuple_(c.dst_ns, c.dst_key).in_(chunk)
            )
            if relation is not None:
                out_q = out_q.where(c.relation == relation)
                in_q = in_q.where(c.relation == relation)
            edges.update((r, "out", n, k) for r, n, k in conn.execute(out_q))
            edges.update((r, "in", n, k) for r, n, k in conn.execute(in_q))
        return sorted(edges, key=lambda e: (e[0], e[1] != "out", e[2], e[3]))


_MISSING: Final = object()
