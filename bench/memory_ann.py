"""Could a two-stage (approximate) vector search beat the MemoryStore's exact one? Measured.

    python bench/memory_ann.py                  # 100,000 items (~2 min to embed, ~3 min to score)
    python bench/memory_ann.py --items 30000    # quicker

The MemoryStore's vector search is exact: one float32 matrix-vector product
over a namespace (100,000 x 256 is ~100 MB read a query, memory-bound, one
BLAS thread). This script measures, on ``bench/memory.py``'s corpus (the same
generator, seed and ``HashingEmbedder`` vectors) and on random unit queries,
what a two-stage search built from numpy alone would give: stage 1 a cheap
scan keeping the top ``C`` candidates, stage 2 exact float32 rescoring of
them. Reported: recall@10 of the two-stage top 10 against exact (mean and
worst query) and, at the end, the two-stage latency against exact.

Stage-1 methods:

* ``sign``: the vectors' sign bits packed as uint64 (``np.packbits``),
  Hamming distance with ``np.bitwise_count`` to the query's sign bits;
* ``sign-centred-q2``: the sign bits of ``vector - mean`` (the namespace's
  mean: data-dependent), scored against the query's signs weighted by its
  magnitudes quantized to 2 bits (two bit planes: an asymmetric estimate of
  the dot product);
* ``rp-M``: a fixed-seed Gaussian random projection to ``M`` dims, float32.

Nothing is asserted; the figures are in docs/memory.md ("Why exact").
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from memory import embed_all, make_corpus  # noqa: E402

K = 10
#: Seed of the random queries and of the random projections.
SEED = 7


def pack(bits: np.ndarray) -> np.ndarray:
    """Boolean rows to uint64 words, word-major ([words, rows]: each word's column contiguous)."""
    return np.ascontiguousarray(np.packbits(bits, axis=1, bitorder="little").view("<u8").T)


Scorer = Callable[[np.ndarray], np.ndarray]


def sign_scorer(vectors: np.ndarray) -> Scorer:
    codes = pack(vectors > 0)

    def score(q: np.ndarray) -> np.ndarray:
        qc = pack((q > 0)[None])[:, 0]
        dist = np.bitwise_count(codes[0] ^ qc[0]).astype(np.int32)
        for w in range(1, codes.shape[0]):
            dist += np.bitwise_count(codes[w] ^ qc[w])
        return -dist  # larger is nearer

    return score


def centred_q2_scorer(vectors: np.ndarray) -> Scorer:
    codes = pack(vectors > vectors.mean(axis=0))

    def score(q: np.ndarray) -> np.ndarray:
        mag = np.abs(q)
        level = np.round(mag / (mag.max() / 3)).astype(np.int64)
        neg = pack((q < 0)[None])[:, 0]
        planes = [pack(((level >> b) & 1).astype(bool)[None])[:, 0] for b in (0, 1)]
        total = np.zeros(codes.shape[1], dtype=np.int32)
        for w in range(codes.shape[0]):
            agree = codes[w] ^ neg[w]  # a set bit: the vector's side agrees with q's sign
            for b, plane in enumerate(planes):
                total += np.bitwise_count(agree & plane[w]).astype(np.int32) << b
        return total

    return score


def rp_scorer(vectors: np.ndarray, dims: int) -> Scorer:
    proj = np.random.default_rng(SEED).standard_normal((vectors.shape[1], dims)).astype(np.float32)
    low = np.ascontiguousarray(vectors @ proj)

    def score(q: np.ndarray) -> np.ndarray:
        out: np.ndarray = low @ (q @ proj)
        return out

    return score


def two_stage(vectors: np.ndarray, scorer: Scorer, q: np.ndarray, c: int) -> np.ndarray:
    est = scorer(q)
    pick = np.argpartition(est, len(est) - c)[len(est) - c :]
    scores = vectors[pick] @ q
    top: np.ndarray = pick[np.argpartition(-scores, K)[:K]]
    return top


def exact(vectors: np.ndarray, q: np.ndarray) -> np.ndarray:
    scores = vectors @ q
    top: np.ndarray = np.argpartition(-scores, K)[:K]
    return top


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=42, help="the corpus's (bench/memory.py's)")
    ap.add_argument("--candidates", default="1000,2000,5000,10000,20000")
    ap.add_argument("--cache", type=Path, help="a directory keeping the embedded corpus")
    args = ap.parse_args()
    cs = [int(c) for c in args.candidates.split(",")]
    cached = args.cache / f"ann-{args.items}-{args.seed}.npz" if args.cache else None
    if cached is not None and cached.exists():
        saved = np.load(cached)
        vectors, qvectors = saved["vectors"], saved["qvectors"]
    else:
        t0 = time.perf_counter()
        c = make_corpus(args.items, args.queries, min(10_000, args.items), args.seed)
        vectors, _ = embed_all(c["texts"], 2)
        qvectors, _ = embed_all(c["queries"], 1)
        print(f"corpus embedded in {time.perf_counter() - t0:.0f} s", flush=True)
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cached, vectors=vectors, qvectors=qvectors)
    rng = np.random.default_rng(SEED)
    randq = rng.standard_normal((args.queries, vectors.shape[1])).astype(np.float32)
    randq /= np.linalg.norm(randq, axis=1, keepdims=True)
    query_sets = {"bench queries": qvectors, "random queries": randq}
    truth = {name: [set(exact(vectors, q).tolist()) for q in qs] for name, qs in query_sets.items()}
    mean = vectors.mean(axis=0)
    print(
        f"{len(vectors):,} vectors x {vectors.shape[1]} dims; |mean| {np.linalg.norm(mean):.2f}, "
        f"|vector - mean| {np.linalg.norm(vectors - mean, axis=1).mean():.2f} on average"
    )
    for name, qs in query_sets.items():
        s = np.sort(vectors @ qs.T, axis=0)[::-1]
        print(
            f"  {name}: cosine of the 1st {s[0].mean():.3f}, 10th {s[9].mean():.3f}, "
            f"1,000th {s[999].mean():.3f}, median {np.median(s, axis=0).mean():.3f}"
        )
    scorers = {
        "sign": sign_scorer(vectors),
        "sign-centred-q2": centred_q2_scorer(vectors),
        "rp-64": rp_scorer(vectors, 64),
        "rp-128": rp_scorer(vectors, 128),
    }
    print("\nrecall@10 against exact (mean / worst query), C candidates rescored exactly")
    print(f"{'method':<18}{'queries':<16}" + "".join(f"{'C=' + f'{c:,}':>16}" for c in cs))
    for method, scorer in scorers.items():
        for name, qs in query_sets.items():
            line = f"{method:<18}{name:<16}"
            for c in cs:
                rec = [
                    len(set(two_stage(vectors, scorer, q, c).tolist()) & truth[name][i]) / K
                    for i, q in enumerate(qs)
                ]
                line += f"{f'{np.mean(rec):.3f} / {min(rec):.1f}':>16}"
            print(line, flush=True)
    print("\nlatency ms (p50 / p99, one BLAS thread, 3 passes over the bench queries)")
    timed: dict[str, Callable[[np.ndarray], np.ndarray]] = {"exact": lambda q: exact(vectors, q)}
    for c in (10_000, 20_000):
        timed[f"sign-centred-q2 C={c:,}"] = lambda q, c=c: two_stage(
            vectors, scorers["sign-centred-q2"], q, c
        )
    timed["rp-128 C=5,000"] = lambda q: two_stage(vectors, scorers["rp-128"], q, 5000)
    with threadpool_limits(1, "blas"):
        for label, fn in timed.items():
            ts = []
            for _ in range(3):
                for q in qvectors:
                    t0 = time.perf_counter()
                    fn(q)
                    ts.append(time.perf_counter() - t0)
            p50, p99 = np.percentile(ts, [50, 99]) * 1e3
            print(f"  {label:<28}{p50:>7.2f} / {p99:.2f}", flush=True)


if __name__ == "__main__":
    main()
