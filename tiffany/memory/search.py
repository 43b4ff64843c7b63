"""Search: full-text ranks and exact vector ranks, fused by reciprocal rank.

* **Text**: SQLite FTS5 ``bm25()``, or PostgreSQL ``ts_rank_cd`` over a
  ``tsvector`` (tiffany/memory/fulltext.py): a natural-language query
  finds the items that share its words (the rarer words first), ranked by
  how well.
* **Vector**: exact cosine over every item of the namespace embedded by the
  store's embedder: one float32 matrix per namespace held in the process
  (:class:`VectorIndex`), its rows unit-length so the cosine is one
  matrix-vector product (column-major: a sparse query reads only its
  nonzero columns), the top found with ``np.argpartition``. The matrix
  is keyed by the namespace's newest ``store_seq`` (``mem_namespaces``): a
  write makes the next search fetch only the rows written since.
* **Hybrid**: reciprocal rank fusion, ``sum(1 / (60 + rank))`` over both
  lists (Cormack et al. 2009): scale-free, so bm25 and cosine need no
  normalising against each other. Ties break on the key.

Rejected: an approximate index (HNSW, IVF). Exact search over 100,000
vectors of 256 dimensions is one BLAS call of a few milliseconds, its
answers are reproducible, and its recall is 1. A two-stage search in numpy
(sign bits or a random projection, then exact rescoring of the best ``C``)
was measured on the bench's corpus (``bench/memory_ann.py``; docs/memory.md,
"Why the vector search stays exact"): reaching recall@10 0.95 takes
rescoring ~10% of the rows, which costs as much as the exact scan. sqlite-vec's ``vec0`` would
move the same scan into SQLite, where PostgreSQL without pgvector could not
follow; one index for both dialects keeps one behaviour.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from threadpoolctl import ThreadpoolController

__all__ = [
    "RRF_K",
    "SPARSE_SHARE",
    "Helping",
    "NamespaceVectors",
    "SharedProduct",
    "VectorIndex",
    "candidates",
    "fts_query_pg",
    "fts_query_sqlite",
    "query_words",
    "rrf",
]

#: Reciprocal rank fusion's constant.
RRF_K: Final = 60
#: A query's words searched at most (the rest are ignored).
MAX_QUERY_WORDS: Final = 32
#: Words as FTS5's unicode61 tokenizer sees them: letters and digits.
_WORD: Final = re.compile(r"[^\W_]+", re.UNICODE)
#: A search fetches this many candidates of each ranking for k results.
_CANDIDATES_PER_K: Final = 3
_MIN_CANDIDATES: Final = 30
#: Rows held free at the end of a namespace's matrix, as a share of its rows.
_GROWTH: Final = 0.25
#: The process's BLAS libraries (found once: it reads the loaded libraries).
_BLAS: ThreadpoolController | None = None


def _one_blas_thread() -> Any:
    """A context in which BLAS runs on the calling thread only.

    Discussion: a matrix-vector product of 100,000 x 256 is memory-bound;
    OpenBLAS splits it over every core and its threads then spin between
    calls. On a busy two-core machine that made a 10,000-item search many
    times slower at the median (the spinning threads took the core the
    caller needed; bench/README.md, "Figures behind design choices in the
    code"). One thread: a steady cost, and the same floating-point sums on
    every machine.

    Rejected: a counted context over the libraries found once, setting the
    count directly (a fraction of ``limit``'s cost), entered by one thread
    and left by another: with this OpenBLAS (0.3.31, pthreads) a
    ``set_num_threads(2)`` from a second thread, after the first had set 1,
    was ignored, and the process stayed at one thread. The context is
    entered and left by the thread that owns the product.
    """
    global _BLAS
    if _BLAS is None:
        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def candidates(k: int) -> int:
    """How many of each ranking a search of ``k`` results fuses."""
    return max(k * _CANDIDATES_PER_K, _MIN_CANDIDATES)


def query_words(query: str) -> list[str]:
    """The distinct words of ``query``, lower-cased, in order (at most 32)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
        if len(seen) >= MAX_QUERY_WORDS:
            break
    return list(seen)


def fts_query_sqlite(words: Sequence[str], conjunction: str = "OR") -> str:
    """An FTS5 query: each word a quoted string, joined by ``OR`` (or ``AND``)."""
    return f" {conjunction} ".join('"' + w.replace('"', '""') + '"' for w in words)


def fts_query_pg(words: Sequence[str], conjunction: str = "|") -> str:
    """A ``to_tsquery('simple', ...)`` text: each word a quoted lexeme, ``|``-joined (or ``&``)."""
    quoted = ("'" + w.replace("\\", "\\\\").replace("'", "''") + "'" for w in words)
    return f" {conjunction} ".join(quoted)


def rrf(rankings: Iterable[Sequence[str]], k: int) -> list[tuple[str, float]]:
    """Fuse rankings (keys, best first) by reciprocal rank; the best ``k``, ties by key."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


#: A query with at most one in this many of its dimensions nonzero is
#: multiplied by its nonzero columns alone (:func:`_product`).
SPARSE_SHARE: Final = 3
#: Rows from which a product is cut in pieces that two threads share.
SPLIT_ROWS: Final = 32_768
#: Rows of one piece of a shared product (a multiple of :data:`_SPLIT_ALIGN`).
PIECE_ROWS: Final = 8_192
#: Pieces meet at a multiple of this many rows: the kernel's blocks of
#: rows stay whole, so every row's sum is the one thread's, bit for bit.
_SPLIT_ALIGN: Final = 64
_HELPER: ThreadPoolExecutor | None = None
_HELPER_LOCK = threading.Lock()


def _helper() -> ThreadPoolExecutor:
    """The thread that shares a vector search's product (made at first use)."""
    global _HELPER
    with _HELPER_LOCK:
        if _HELPER is None:
            _HELPER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-product")
        return _HELPER


class SharedProduct:
    """``matrix @ query`` in aligned pieces, computed by whichever threads call :meth:`work`.

    The thread that owns the product (it holds the matrix still, under the
    :class:`VectorIndex`'s lock) calls :meth:`result`; any other thread may
    call :meth:`work` meanwhile and take pieces that are not yet started. No
    thread waits for another to start: a helper that comes late finds the
    pieces done, and the owner has done them itself.

    Discussion: the product is memory-bound and one core does not draw all
    of the memory's bandwidth, so two threads finish it sooner than one. The
    pieces are handed out one at a time rather than as two fixed halves: a
    hybrid search's caller first runs its text ranking and then takes the
    pieces that are left, so the two cores stay busy whatever each leg
    costs, and on a busy machine a helper that waits for a core holds no
    half that the owner must wait for. Each row's sum is the one thread's,
    bit for bit: the rows are split, not the columns, at multiples of 64
    rows (at an odd row the kernel's blocking of the rows around it changed
    the last bit of some sums; aligned, 35 shapes from 33,769 to 100,000
    rows and 64 to 1,536 dims came out equal). The BLAS thread limit is set
    by the owner for the whole product (it is the process's setting).
    """

    __slots__ = (
        "_bounds",
        "_done",
        "_failed",
        "_left",
        "_lock",
        "_matrix",
        "_next",
        "_query",
        "out",
    )

    def __init__(self, matrix: np.ndarray, query: np.ndarray) -> None:
        rows = matrix.shape[0]
        self._matrix = matrix
        self._query = query
        self.out = np.empty(rows, dtype=np.result_type(matrix, query))
        step = max(_SPLIT_ALIGN, PIECE_ROWS // _SPLIT_ALIGN * _SPLIT_ALIGN)
        self._bounds = [(a, min(a + step, rows)) for a in range(0, rows, step)]
        self._next = 0
        self._left = len(self._bounds)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._failed: BaseException | None = None
        if not self._bounds:
            self._done.set()

    def work(self) -> None:
        """Compute pieces until none is left to start (pieces others started are theirs)."""
        bounds = self._bounds
        while True:
            with self._lock:
                i = self._next
                if i >= len(bounds):
                    return
                self._next = i + 1
            a, b = bounds[i]
            try:
                np.matmul(self._matrix[a:b], self._query, out=self.out[a:b])
            except BaseException as exc:  # the owner raises it: it must not wait forever
                self._failed = exc
                raise
            finally:
                with self._lock:
                    self._left -= 1
                    if not self._left:
                        self._done.set()

    def result(self) -> np.ndarray:
        """The whole product: the owner computes what is left, then waits for pieces in flight."""
        self.work()
        self._done.wait()
        if self._failed is not None:
            raise self._failed
        return self.out


class Helping:
    """Where a search's product is offered to the search's own thread.

    A hybrid search's vector leg runs on a helper thread and offers its
    product here (:meth:`offer`); the search's thread, its text ranking done,
    calls :meth:`help` and computes the pieces that are left.
    """

    __slots__ = ("_lock", "_product")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._product: SharedProduct | None = None

    def offer(self, product: SharedProduct) -> None:
        """Make ``product`` available to :meth:`help` (called by its owner)."""
        with self._lock:
            self._product = product

    def help(self) -> None:
        """Take the offered product's pieces that are left (nothing offered yet: none)."""
        with self._lock:
            product = self._product
        if product is not None:
            product.work()


def _product(
    matrix: np.ndarray, query: np.ndarray, *, split: bool = True, helping: Helping | None = None
) -> np.ndarray:
    """``matrix @ query``: a sparse query's columns, or from :data:`SPLIT_ROWS` rows in pieces.

    A query with at most one in :data:`SPARSE_SHARE` of its dimensions
    nonzero (a short text hashed by the ``HashingEmbedder``: a few dozen of
    256) is multiplied by those columns alone, on this thread: the matrix is
    column-major, so each column is one contiguous read, and zeros add
    nothing to a sum. Otherwise from :data:`SPLIT_ROWS` rows the product is
    cut in pieces shared with a second thread: the search's own
    (``helping``: a hybrid search's caller, once its text ranking is done)
    or else the module's helper. ``split=False``: the whole product on this
    thread.
    """
    rows, dims = matrix.shape
    nonzero = np.flatnonzero(query)
    if len(nonzero) * SPARSE_SHARE <= dims:
        # A sparse query (a short text hashed: a few dozen of 256 slots) needs
        # only its own columns, each contiguous in the column-major matrix.
        sparse: np.ndarray = matrix[:, nonzero] @ query[nonzero]
        return sparse
    if rows < SPLIT_ROWS or not split:
        whole: np.ndarray = matrix @ query
        return whole
    product = SharedProduct(matrix, query)
    if helping is not None:
        helping.offer(product)
    else:
        _helper().submit(product.work)
    return product.result()


@dataclass
class NamespaceVectors:
    """One namespace's vectors as of ``seq``: a matrix with a row per live item.

    The matrix is column-major (``order="F"``): a dimension's values over
    every row are contiguous, so a sparse query reads only its own columns.

    Rows of deleted items are zeroed and marked dead (``alive``) and reused
    by the next new key; ``expires`` holds each row's expiry (``inf``: none).
    """

    seq: int
    dims: int
    matrix: np.ndarray
    expires: np.ndarray
    alive: np.ndarray
    keys: list[str | None]
    rows: dict[str, int] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    used: int = 0
    expiring: int = 0

    @classmethod
    def empty(cls, dims: int, seq: int, capacity: int = 64) -> NamespaceVectors:
        """A namespace with no vectors yet."""
        return cls(
            seq=seq,
            dims=dims,
            matrix=np.zeros((capacity, dims), dtype=np.float32, order="F"),
            expires=np.full(capacity, np.inf),
            alive=np.zeros(capacity, dtype=bool),
            keys=[None] * capacity,
        )

    def _grow(self, needed: int) -> None:
        capacity = self.matrix.shape[0]
        if needed <= capacity:
            return
        new = max(needed, int(capacity * (1 + _GROWTH)) + 64)
        matrix = np.zeros((new, self.dims), dtype=np.float32, order="F")
        matrix[:capacity] = self.matrix
        expires = np.full(new, np.inf)
        expires[:capacity] = self.expires
        alive = np.zeros(new, dtype=bool)
        alive[:capacity] = self.alive
        self.matrix, self.expires, self.alive = matrix, expires, alive
        self.keys.extend([None] * (new - capacity))

    def set(self, key: str, vector: np.ndarray, expires_at: float | None) -> None:
        """Put ``key``'s vector in (a new row, a freed row, or its own)."""
        row = self.rows.get(key)
        if row is None:
            if self.free:
                row = self.free.pop()
            else:
                self._grow(self.used + 1)
                row = self.used
                self.used += 1
            self.rows[key] = row
            self.keys[row] = key
        elif self.expires[row] != np.inf:
            self.expiring -= 1
        self.matrix[row] = vector
        self.alive[row] = True
        self.expires[row] = np.inf if expires_at is None else expires_at
        if expires_at is not None:
            self.expiring += 1

    def remove(self, key: str) -> None:
        """Take ``key`` out (its row is zeroed and reused)."""
        row = self.rows.pop(key, None)
        if row is None:
            return
        if self.expires[row] != np.inf:
            self.expiring -= 1
        self.matrix[row] = 0.0
        self.alive[row] = False
        self.expires[row] = np.inf
        self.keys[row] = None
        self.free.append(row)

    def top(
        self,
        query: np.ndarray,
        n: int,
        now: float,
        *,
        split: bool = True,
        helping: Helping | None = None,
    ) -> list[tuple[str, float]]:
        """The ``n`` live rows nearest ``query`` (cosine), best first, ties by key.

        ``split``, ``helping``: how a large product is shared (:func:`_product`).
        """
        used = self.used
        if used == 0 or n <= 0:
            return []
        with _one_blas_thread():
            scores = _product(self.matrix[:used], query, split=split, helping=helping)
        dead = ~self.alive[:used]
        if self.expiring:
            dead |= self.expires[:used] <= now
        if self.free or self.expiring:
            scores[dead] = -np.inf
        live = used - int(np.count_nonzero(dead)) if (self.free or self.expiring) else used
        n = min(n, live)
        if n <= 0:
            return []
        if n < used:
            # The n-th best score, then every row at least as good (ties at
            # the boundary all kept, so the key decides among them).
            pick = np.argpartition(scores, used - n)[used - n :]
            floor = scores[pick].min()
            pick = np.flatnonzero(scores >= floor)
        else:
            pick = np.flatnonzero(scores > -np.inf)
        keys = self.keys
        found = [(keys[i], float(scores[i])) for i in pick.tolist()]
        found.sort(key=lambda ks: (-ks[1], ks[0]))
        return [(k, s) for k, s in found[:n] if k is not None]


class VectorIndex:
    """The process's vectors, a :class:`NamespaceVectors` per namespace (thread-safe).

    Callers hand it the rows written since the copy's ``seq``; it never reads
    the database itself.
    """

    def __init__(self, dims: int) -> None:
        self.dims = dims
        self._lock = threading.Lock()
        self._spaces: dict[str, NamespaceVectors] = {}

    def seq_of(self, namespace: str) -> int | None:
        """The ``store_seq`` the namespace's copy is at (None: no copy)."""
        with self._lock:
            space = self._spaces.get(namespace)
            return None if space is None else space.seq

    def replace(
        self, namespace: str, seq: int, rows: Iterable[tuple[str, Any, float | None]]
    ) -> None:
        """Load the namespace afresh from ``(key, vector bytes, expires_at)`` rows at ``seq``."""
        keys: list[str] = []
        blobs: list[bytes] = []
        expiries: list[float] = []
        for key, blob, expires_at in rows:
            keys.append(key)
            blobs.append(bytes(blob))
            expiries.append(np.inf if expires_at is None else float(expires_at))
        n = len(keys)
        space = NamespaceVectors.empty(self.dims, seq, capacity=max(64, int(n * (1 + _GROWTH))))
        if n:
            matrix = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(n, self.dims)
            space.matrix[:n] = matrix
            space.expires[:n] = expiries
            space.alive[:n] = True
            space.keys[:n] = keys
            space.rows = {k: i for i, k in enumerate(keys)}
            space.used = n
            space.expiring = sum(1 for e in expiries if e != np.inf)
        with self._lock:
            self._spaces[namespace] = space

    def update(
        self,
        namespace: str,
        from_seq: int,
        seq: int,
        changes: Iterable[tuple[str, Any, float | None]],
    ) -> bool:
        """Apply the changes since ``from_seq`` (a None vector: removed); False if it moved."""
        with self._lock:
            space = self._spaces.get(namespace)
            if space is None or space.seq != from_seq:
                return False
            for key, blob, expires_at in changes:
                if blob is None:
                    space.remove(key)
                else:
                    space.set(key, np.frombuffer(bytes(blob), dtype="<f4"), expires_at)
            space.seq = seq
            return True

    def top(
        self,
        namespace: str,
        seq: int,
        query: np.ndarray,
        n: int,
        now: float,
        *,
        split: bool = True,
        helping: Helping | None = None,
    ) -> list[tuple[str, float]] | None:
        """The nearest ``n`` keys if the copy is at ``seq`` or newer, else None (refresh first).

        A newer copy (another thread's search refreshed it) may name keys the
        caller's snapshot lacks: the caller reads the items in its snapshot,
        and those drop out.
        """
        with self._lock:
            space = self._spaces.get(namespace)
            if space is None or space.seq < seq:
                return None
            return space.top(query, n, now, split=split, helping=helping)

    def drop(self, namespace: str | None = None) -> None:
        """Forget one namespace's copy (or every copy)."""
        with self._lock:
            if namespace is None:
                self._spaces.clear()
            else:
                self._spaces.pop(namespace, None)
