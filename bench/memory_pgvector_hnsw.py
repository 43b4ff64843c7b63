"""Would an HNSW index beat the MemoryStore's exact pgvector scan? Recall and latency, measured.

    python bench/memory_pgvector_hnsw.py                 # 100,000 items
    python bench/memory_pgvector_hnsw.py --items 10000   # quicker

The MemoryStore ranks vectors in PostgreSQL with an exact scan of the
namespace's rows (tiffany/memory/pgvector.py). This script measures, on
``bench/memory.py``'s corpus (the same generator, seed 42 and
``HashingEmbedder`` vectors, its 200 queries), what pgvector's HNSW index
would give instead: the table is a private schema's copy of the store's
``mem_vectors`` shape (loaded with ``COPY``, not through the store: only the
vector leg is measured), the exact scan is the store's statement, the
product the in-process path runs (numpy, one BLAS thread) is timed beside
it, and the HNSW index (``vector_ip_ops``, pgvector's defaults ``m`` 16,
``ef_construction`` 64) is read at several ``hnsw.ef_search``. Reported:
recall@10 against numpy's exact top 10 (mean and worst query), p50 / p99 of
the statement's wall time (3 passes over the queries), the index's build
time and size. Needs a database with the ``vector`` extension
(``--url``; bench/memory.py's ``--pgvector-url`` default). Nothing is
asserted; the figures are in bench/README.md.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
import uuid
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from memory import PGVECTOR_URL, embed_all, make_corpus, pgvector_database  # noqa: E402

K = 10
NS = "bench"
EMBEDDER = "hashing-blake2b-v1-256"


def vec_text(v: np.ndarray) -> str:
    return str(np.asarray(v, dtype=np.float32).tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=42, help="the corpus's (bench/memory.py's)")
    ap.add_argument("--ef", default="40,100,200,400", help="hnsw.ef_search values")
    ap.add_argument("--url", default=PGVECTOR_URL)
    args = ap.parse_args()
    why = pgvector_database(args.url)
    if why:
        print(f"not run: {why}")
        return
    t0 = time.perf_counter()
    c = make_corpus(args.items, args.queries, min(10_000, args.items), args.seed)
    vectors, _ = embed_all(c["texts"], 2)
    qvectors, _ = embed_all(c["queries"], 1)
    print(
        f"corpus: {len(vectors):,} x {vectors.shape[1]} "
        f"embedded in {time.perf_counter() - t0:.0f} s"
    )
    truth = [set(np.argsort(-(vectors @ q), kind="stable")[:K].tolist()) for q in qvectors]

    schema = f"bench_hnsw_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(args.url))
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(args.url).update_query_dict({"options": f"-csearch_path={schema},public"})
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE TABLE mem_vectors (item_id integer PRIMARY KEY,"
                    " namespace varchar(128) NOT NULL, key varchar(256) NOT NULL,"
                    " embedder varchar(200) NOT NULL, dims integer NOT NULL,"
                    " expires_at double precision, store_seq bigint NOT NULL,"
                    " embedding vector NOT NULL)"
                )
            )
            conn.execute(
                text(
                    "CREATE INDEX ix_mem_vectors_namespace"
                    " ON mem_vectors (namespace, embedder, dims)"
                )
            )
            buf = io.StringIO()
            for i, v in enumerate(vectors):
                buf.write(f"{i}\t{NS}\tm{i:06d}\t{EMBEDDER}\t{len(v)}\t\\N\t{i}\t{vec_text(v)}\n")
            raw = conn.connection.dbapi_connection
            assert raw is not None
            with raw.cursor() as cur, cur.copy("COPY mem_vectors FROM STDIN") as copy:
                copy.write(buf.getvalue())
            conn.execute(text("ANALYZE mem_vectors"))
        exact_sql = text(
            "SELECT item_id, embedding <#> CAST(:q AS vector) AS d FROM mem_vectors"
            " WHERE namespace = :ns AND embedder = :e AND dims = :dims"
            " AND (expires_at IS NULL OR expires_at > :now) ORDER BY d, key LIMIT :n"
        )
        # The HNSW index orders by the bare distance (no key, no filter it can use).
        ann_sql = text(
            "SELECT item_id FROM mem_vectors WHERE namespace = :ns AND embedder = :e"
            " AND dims = 256 AND (expires_at IS NULL OR expires_at > :now)"
            " ORDER BY (embedding::vector(256)) <#> CAST(:q AS vector(256)) LIMIT :n"
        )

        def run(sql: object, setup: list[str]) -> tuple[float, float, float, float]:
            ts: list[float] = []
            rec: list[float] = []
            with engine.connect() as conn:
                for s in setup:
                    conn.execute(text(s))
                for p in range(3):
                    for i, q in enumerate(qvectors):
                        params = {"q": vec_text(q), "ns": NS, "e": EMBEDDER, "dims": 256}
                        params |= {"now": 0.0, "n": K}
                        t = time.perf_counter()
                        got = [r[0] for r in conn.execute(sql, params)]  # type: ignore[call-overload]
                        ts.append(time.perf_counter() - t)
                        if p == 0:
                            rec.append(len(set(got) & truth[i]) / K)
                conn.rollback()
            p50, p99 = np.percentile(ts, [50, 99]) * 1e3
            return float(np.mean(rec)), float(min(rec)), float(p50), float(p99)

        print(f"\n{'search':<34}{'recall@10 mean / worst':>24}{'p50 ms':>10}{'p99 ms':>10}")
        with threadpool_limits(1, "blas"):  # the in-process path's product, at the same load
            ts = []
            for _ in range(3):
                for q in qvectors:
                    t = time.perf_counter()
                    scores = vectors @ q
                    np.argpartition(scores, len(scores) - K)[-K:]
                    ts.append(time.perf_counter() - t)
        p50, p99 = np.percentile(ts, [50, 99]) * 1e3
        print(f"{'in-process exact (numpy)':<34}{'1.000 / 1.0':>24}{p50:>10.2f}{p99:>10.2f}")
        r = run(exact_sql, ["SET enable_seqscan = off"])  # as the store's search transaction
        rec = f"{r[0]:.3f} / {r[1]:.1f}"
        print(f"{'exact scan (the store)':<34}{rec:>24}{r[2]:>10.2f}{r[3]:>10.2f}")
        t = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE INDEX ix_mem_vectors_hnsw ON mem_vectors USING hnsw"
                    " ((embedding::vector(256)) vector_ip_ops) WHERE dims = 256"
                )
            )
            size = conn.execute(text("SELECT pg_relation_size('ix_mem_vectors_hnsw')")).scalar_one()
        print(f"(HNSW index built in {time.perf_counter() - t:.1f} s, {size / 2**20:.0f} MiB)")
        with engine.connect() as conn:
            plan = conn.execute(
                text(f"EXPLAIN {ann_sql.text}"),
                {"q": vec_text(qvectors[0]), "ns": NS, "e": EMBEDDER, "now": 0.0, "n": K},
            ).scalars()
            uses = any("ix_mem_vectors_hnsw" in line for line in plan)
        print(f"(the HNSW statement {'uses' if uses else 'does NOT use'} the index)")
        for ef in [int(x) for x in args.ef.split(",")]:
            r = run(ann_sql, [f"SET hnsw.ef_search = {ef}"])
            label = f"HNSW ef_search={ef}"
            print(f"{label:<34}{f'{r[0]:.3f} / {r[1]:.1f}':>24}{r[2]:>10.2f}{r[3]:>10.2f}")
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


if __name__ == "__main__":
    main()
