"""The vector search is exact: its top 10 are numpy's over the same vectors, after writes too.

docs/memory.md ("Why the vector search stays exact") rests on this: recall@10
is 1 by construction, and the in-process matrix follows the namespace's
writes (a changed item re-scored, a deleted one gone).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tiffany.memory import HashingEmbedder, MemoryStore

NS = "exact"
ITEMS = 1_500
K = 10


def _texts(n: int, seed: int) -> list[str]:
    """Seeded texts over a Zipf-ish vocabulary (bench/memory.py's shape, smaller)."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}x{(i * 7919) % 1000}" for i in range(2_000)]
    p = 1.0 / (np.arange(len(vocab)) + 2.7) ** 1.07
    p /= p.sum()
    return [" ".join(vocab[j] for j in rng.choice(len(vocab), size=40, p=p)) for _ in range(n)]


def _exact(store: MemoryStore, texts: dict[str, str], query: str) -> list[tuple[str, float]]:
    keys = sorted(texts)
    vectors = store.embedder.embed([texts[k] for k in keys])
    q = store.embedder.embed([query])[0]
    scores = vectors @ q
    ranked = sorted(zip(keys, scores.tolist(), strict=True), key=lambda ks: (-ks[1], ks[0]))
    return ranked[:K]


def _check(store: MemoryStore, texts: dict[str, str], queries: list[str]) -> None:
    for query in queries:
        got = store.search(NS, query, k=K, mode="vector")["items"]
        want = _exact(store, texts, query)
        assert len(got) == K
        # Same scores as numpy's top 10; each key's score its own (float sums
        # may order near-ties differently: the scores, not only keys, decide).
        assert [g["score"] for g in got] == pytest.approx([s for _, s in want], abs=2e-6)
        own = dict(_exact(store, {g["key"]: texts[g["key"]] for g in got}, query))
        for g in got:
            assert g["score"] == pytest.approx(own[g["key"]], abs=2e-6)


def test_vector_search_is_numpys_exact_top_10_and_follows_writes(store: MemoryStore) -> None:
    corpus = _texts(ITEMS, seed=3)
    texts = {f"k{i:05d}": t for i, t in enumerate(corpus)}
    for i, (key, text) in enumerate(texts.items()):
        store.put(NS, key, {"n": i}, text, op=f"put-{i}")
    queries = [" ".join(t.split()[5:11]) for t in _texts(20, seed=4)]
    queries += [" ".join(corpus[i].split()[10:16]) for i in range(0, ITEMS, 150)]
    _check(store, texts, queries)

    # Writes after the matrix was loaded: updates, deletes, new keys.
    fresh = _texts(60, seed=5)
    for i in range(20):
        key = f"k{i * 7:05d}"
        texts[key] = fresh[i]
        store.put(NS, key, {"n": -i}, fresh[i], op=f"update-{i}")
    for i in range(20):
        key = f"k{i * 11 + 3:05d}"
        if key in texts:
            del texts[key]
            store.delete(NS, key, op=f"delete-{i}")
    for i in range(20, 60):
        key = f"n{i:05d}"
        texts[key] = fresh[i]
        store.put(NS, key, {"n": i}, fresh[i], op=f"new-{i}")
    queries += [" ".join(t.split()[:6]) for t in fresh[:40:4]]
    _check(store, texts, queries)


def test_the_same_query_answers_the_same_in_another_process_copy(
    store: MemoryStore, tmp_path: Path
) -> None:
    corpus = _texts(300, seed=6)
    for i, text in enumerate(corpus):
        store.put(NS, f"k{i:04d}", {"n": i}, text, op=f"put-{i}")
    query = " ".join(corpus[42].split()[:6])
    first = store.search(NS, query, k=K, mode="vector")
    store.put(NS, "k0042", {"n": 42}, corpus[7], op="rewrite-42")  # patched into the matrix
    store.put(NS, "k0042", {"n": 42}, corpus[42], op="restore-42")
    patched = store.search(NS, query, k=K, mode="vector")
    other = MemoryStore(store.engine, embedder=HashingEmbedder())  # loads the matrix afresh
    try:
        loaded = other.search(NS, query, k=K, mode="vector")
    finally:
        other.close()
    keys = [[(i["key"], i["score"]) for i in a["items"]] for a in (first, patched, loaded)]
    assert keys[0] == keys[1] == keys[2]
    assert len(keys[0]) == K


def test_a_large_namespace_splits_its_product_and_stays_exact() -> None:
    """Past SPLIT_ROWS the product runs in pieces two threads share: the same sums, the same top."""
    from tiffany.memory.search import SPLIT_ROWS, VectorIndex, _one_blas_thread, _product

    rng = np.random.default_rng(7)
    rows = SPLIT_ROWS + 1_001
    matrix = rng.standard_normal((rows, 384)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    query = matrix[123] + 0.1 * rng.standard_normal(384).astype(np.float32)
    query /= np.linalg.norm(query)
    with _one_blas_thread():
        whole = matrix @ query
        split = _product(matrix, query)
    assert np.array_equal(split, whole)  # bit for bit: the rows are split at an aligned row

    index = VectorIndex(384)
    keys = [f"k{i:06d}" for i in range(rows)]
    index.replace("big", 1, ((k, matrix[i].tobytes(), None) for i, k in enumerate(keys)))
    got = index.top("big", 1, query, K, now=0.0)
    assert got is not None
    best = np.argsort(-whole, kind="stable")[:K]
    assert [k for k, _ in got] == [keys[i] for i in best]
    assert got[0][0] == "k000123"


@pytest.mark.parametrize(("rows", "dims"), [(33_769, 256), (50_000, 384), (100_000, 64)])
def test_a_shared_product_is_one_threads_bit_for_bit_whoever_takes_the_pieces(
    rows: int, dims: int
) -> None:
    """A SharedProduct's pieces, taken by the owner alone or by two threads, sum as one thread."""
    import threading

    from tiffany.memory.search import PIECE_ROWS, Helping, SharedProduct, _one_blas_thread, _product

    rng = np.random.default_rng(rows)
    matrix = rng.standard_normal((rows, dims)).astype(np.float32)
    query = rng.standard_normal(dims).astype(np.float32)
    with _one_blas_thread():
        whole = matrix @ query
        alone = SharedProduct(matrix, query).result()
        shared = SharedProduct(matrix, query)
        started = threading.Event()

        def helper() -> None:
            started.set()
            shared.work()

        thread = threading.Thread(target=helper)
        thread.start()
        started.wait(timeout=30)
        both = shared.result()
        thread.join(timeout=30)
        # A hybrid search's way: the product offered, the caller's thread helping.
        helping = Helping()
        leg = threading.Thread(target=lambda: _product(matrix, query, helping=helping))
        leg.start()
        helping.help()
        leg.join(timeout=30)
    assert PIECE_ROWS % 64 == 0
    assert np.array_equal(alone, whole)
    assert np.array_equal(both, whole)


def test_a_sparse_query_reads_its_columns_and_ranks_as_the_whole_product() -> None:
    """A short query hashed has a few dozen nonzero slots: those columns alone, the same top."""
    from tiffany.memory.search import SPARSE_SHARE, SPLIT_ROWS, _one_blas_thread, _product

    embedder = HashingEmbedder()
    texts = _texts(2_000, seed=11)
    rows = np.asfortranarray(embedder.embed(texts))  # the index's layout
    for query in ("w3x21 w17x119 w5x35", texts[42][:60]):
        q = embedder.embed([query])[0]
        nonzero = np.count_nonzero(q)
        assert 0 < nonzero * SPARSE_SHARE <= embedder.dims  # the sparse path is the one taken
        with _one_blas_thread():
            got = _product(rows, q)
        whole = np.ascontiguousarray(rows) @ q
        assert np.allclose(got, whole, rtol=0, atol=1e-6)
        assert list(np.argsort(-got, kind="stable")[:K]) == list(
            np.argsort(-whole, kind="stable")[:K]
        )

    # A dense query on the column-major layout, past SPLIT_ROWS: pieces, bit for bit.
    rng = np.random.default_rng(3)
    big = np.asfortranarray(rng.standard_normal((SPLIT_ROWS + 1_001, 256)).astype(np.float32))
    dense = rng.standard_normal(256).astype(np.float32)
    with _one_blas_thread():
        assert np.array_equal(_product(big, dense), big @ dense)
