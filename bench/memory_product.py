"""The vector search's product alone: a sparse query's columns against the whole matrix.

A MemoryStore namespace's vectors are one float32 matrix (rows = items),
column-major; a search multiplies it by the query (tiffany/memory/search.py,
``_product``). A query embedded by the ``HashingEmbedder`` from a few words
sets a few dozen of its 256 slots, and is multiplied by those columns alone;
a dense query (a model's embedding) takes the whole product. This prints
both, on one BLAS thread, beside the row-major product the index used
before, for a matrix of ``--rows`` random unit rows:

    .venv/bin/python bench/memory_product.py              # 100,000 x 256
    .venv/bin/python bench/memory_product.py --rows 10000

Prints p50 / p99 ms over ``--repeat`` products of each; asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from tiffany.memory import HashingEmbedder
from tiffany.memory.search import _one_blas_thread, _product

QUERIES = {
    "3 words (a needle query)": "zebra lantern quixotic",
    "6 words": "the man went to the market yesterday",
    "12 words": "a long query of twelve words that a user might type in a box",
}


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """p50 and p99 milliseconds of ``fn`` over ``repeat`` calls (after 3 warm-ups)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    embedder = HashingEmbedder()
    dims = embedder.dims
    rng = np.random.default_rng(42)
    rows = rng.standard_normal((args.rows, dims)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    column_major = np.asfortranarray(rows)
    print(f"{args.rows:,} x {dims} float32, one BLAS thread, {args.repeat} products each")
    print(
        f"{'query':34s} {'nonzero':>8s} {'row-major whole':>18s} {'this index':>18s} {'ratio':>7s}"
    )
    dense = rng.standard_normal(dims).astype(np.float32)
    dense /= np.linalg.norm(dense)
    cases = [(name, embedder.embed([text])[0]) for name, text in QUERIES.items()]
    cases.append(("dense (a model's embedding)", dense))
    with _one_blas_thread():
        for name, query in cases:
            before = timed(lambda q=query: rows @ q, args.repeat)
            after = timed(lambda q=query: _product(column_major, q, split=False), args.repeat)
            cells = [f"{p50:.2f} / {p99:.2f}" for p50, p99 in (before, after)]
            ratio = before[0] / after[0]
            nonzero = int(np.count_nonzero(query))
            print(f"{name:34s} {nonzero:8d} {cells[0]:>18s} {cells[1]:>18s} {ratio:6.1f}x")
    print("(p50 / p99 ms; ratio: the row-major whole product's p50 over this index's)")


if __name__ == "__main__":
    main()
