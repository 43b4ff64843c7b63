"""MemoryStore latency: search (hybrid, text, vector) and put, at N items in one namespace.

Prints a table; asserts nothing. The corpus is seeded: a Zipf vocabulary,
texts of ``--words`` words, 5% of them holding a "needle" term found nowhere
else. The namespace is loaded in bulk (rows written as ``put`` writes them,
in one transaction per 5,000: a 100,000-item load through ``put`` would time
the loading, not the store); then ``--puts`` single puts and ``--queries``
searches of each mode are timed one by one, after one warm-up search (the
vector matrix's first load, reported apart). Wall time and the process's
CPU time, every thread's (a search's text ranking and its vector product's
pieces run on two threads; nothing else runs in the process meanwhile): on
a shared machine the CPU time is the cost, the wall time adds the waits for
a core.

    .venv/bin/python bench/memory_latency.py --items 10000 100000
    .venv/bin/python bench/memory_latency.py --items 10000 --url postgresql://postgres@127.0.0.1/test

Before and after a change, in one run: ``--against PYTHON`` names another
checkout's interpreter (its ``.venv/bin/python``; the package is installed
editable, so it imports that checkout's code). The namespace is loaded once;
then two server processes, this checkout's and that one's, run the same
searches on the same database, query by query, taking turns at going first,
each timing its own search; the table has a row for each, and counts the
searches whose answers (keys and scores) differ. Puts are not timed then.

    .venv/bin/python bench/memory_latency.py --items 100000 --against ../main/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import random  # noqa: TID251 - a seeded corpus, not task code
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert, text, update

from tiffany.memory import HashingEmbedder, MemoryStore
from tiffany.memory.fulltext import namespace_token
from tiffany.memory.limits import canonical_json
from tiffany.memory.tables import mem_applied, mem_item_versions, mem_items, mem_namespaces, mem_seq
from tiffany.store.migrate import upgrade
from tiffany.store.session import make_engine

NS = "bench.users"
BATCH = 5_000


def corpus(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10)))
        for _ in range(20_000)
    ]
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    out = []
    for i in range(n):
        body = rng.choices(vocab, weights, k=words)
        if i % 20 == 0:
            body[rng.randrange(words)] = f"needle{i}"
        out.append(" ".join(body))
    return out


def bulk_load(store: MemoryStore, texts: list[str]) -> None:
    engine = store.engine
    sqlite = engine.dialect.name == "sqlite"
    embedder = store.embedder
    seq = 0
    for start in range(0, len(texts), BATCH):
        chunk = texts[start : start + BATCH]
        vectors = embedder.embed(chunk)
        with engine.begin() as conn:
            rows = []
            for j, body in enumerate(chunk):
                seq += 1
                value = canonical_json(body)
                rows.append(
                    {
                        "namespace": NS,
                        "key": f"k{start + j:07d}",
                        "value": value,
                        "text": body,
                        "version": 1,
                        "created_at": 0.0,
                        "updated_at": 0.0,
                        "expires_at": None,
                        "run_id": None,
                        "step_id": None,
                        "embedder": embedder.id,
                        "vector": np.asarray(vectors[j], dtype="<f4").tobytes(),
                        "bytes": len(value) + len(body),
                        "store_seq": seq,
                    }
                )
            ids = conn.execute(insert(mem_items).returning(mem_items.c.id), rows).scalars().all()
            if sqlite:
                conn.execute(
                    text("INSERT INTO mem_fts (rowid, nsid, text) VALUES (:id, :nsid, :text)"),
                    [
                        {"id": i, "nsid": namespace_token(NS), "text": r["text"]}
                        for i, r in zip(ids, rows, strict=True)
                    ],
                )
            else:
                conn.execute(
                    text(
                        "INSERT INTO mem_fts (item_id, namespace, tsv) VALUES (:id, :ns,"
                        " to_tsvector('simple', :text) || to_tsvector('simple', :nsid))"
                    ),
                    [
                        {"id": i, "ns": NS, "text": r["text"], "nsid": namespace_token(NS)}
                        for i, r in zip(ids, rows, strict=True)
                    ],
                )
            conn.execute(
                insert(mem_item_versions),
                [
                    {
                        "namespace": NS,
                        "key": r["key"],
                        "version": 1,
                        "value": r["value"],
                        "text": r["text"],
                        "deleted": False,
                        "op": f"bulk/{r['key']}",
                        "run_id": None,
                        "step_id": None,
                        "at": 0.0,
                        "store_seq": r["store_seq"],
                    }
                    for r in rows
                ],
            )
            conn.execute(
                insert(mem_applied),
                [
                    {"op": f"bulk/{r['key']}", "digest": "-", "result": "{}", "at": 0.0}
                    for r in rows
                ],
            )
    with engine.begin() as conn:
        if not sqlite:
            # What autovacuum does after a load: without statistics the planner
            # tests every row's tsvector instead of asking the GIN index.
            conn.execute(text("ANALYZE mem_fts"))
            conn.execute(text("ANALYZE mem_items"))
        conn.execute(update(mem_seq).values(seq=seq))
        conn.execute(
            insert(mem_namespaces).values(
                namespace=NS,
                item_count=len(texts),
                bytes=sum(len(t) * 2 for t in texts),
                store_seq=seq,
                updated_at=0.0,
            )
        )


class Timer:
    """Wall and CPU (the process's, every thread's) time of each timed block."""

    def __init__(self, op: str, n: int) -> None:
        self.op, self.n = op, n
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *exc: object) -> None:
        self.wall.append(time.perf_counter() - self._wall)
        self.cpu.append(time.process_time() - self._cpu)

    def row(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "n": self.n,
            "p50": pct(self.wall, 0.5),
            "p99": pct(self.wall, 0.99),
            "cpu50": pct(self.cpu, 0.5),
            "cpu99": pct(self.cpu, 0.99),
        }


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run(url: str, n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    engine = make_engine(url)
    upgrade(engine)
    store = MemoryStore(engine, embedder=HashingEmbedder(args.dims), max_items=n + args.puts + 200)
    texts = corpus(n, args.words, seed=n)
    t0 = time.perf_counter()
    bulk_load(store, texts)
    load_s = time.perf_counter() - t0
    rng = random.Random(7)
    queries = []
    for i in range(args.queries):
        words = rng.choice(texts).split()
        if i % 4 == 0:
            queries.append(f"needle{rng.randrange(0, n, 20)}")
        else:
            start = rng.randrange(len(words) - 6)
            queries.append(" ".join(words[start : start + 5]))
    if args.against:
        store.close()
        engine.dispose()
        rows = against(url, n, queries, args.against)
        for r in rows:
            r["load_s"] = load_s
            r["cold_ms"] = float("nan")
        return rows
    t0 = time.perf_counter()
    store.search(NS, "warm up", k=10, mode="vector")
    cold_ms = (time.perf_counter() - t0) * 1000
    rows = []
    for mode in MODES:
        timer = Timer(f"search {mode}", n)
        for q in queries:
            with timer:
                store.search(NS, q, k=10, mode=mode)
        rows.append(timer.row())
    timer = Timer("put", n)
    for i in range(args.puts):
        body = " ".join(rng.choice(texts).split()[: args.words])
        with timer:
            store.put(NS, None, body, op=f"bench/{uuid.uuid4()}/{i}")
    rows.append(timer.row())
    # A search right after a put: the matrix takes the new row (no reload).
    timer = Timer("search after a put", n)
    for i in range(min(args.puts, 100)):
        store.put(NS, None, f"fresh fact {i}", op=f"bench/after/{uuid.uuid4()}")
        with timer:
            store.search(NS, queries[i % len(queries)], k=10)
    rows.append(timer.row())
    for r in rows:
        r["load_s"] = load_s
        r["cold_ms"] = cold_ms
    store.close()
    engine.dispose()
    return rows


def serve(url: str) -> None:
    """A search server for ``--against``: one store, searches read from stdin, timed here."""
    engine = make_engine(url)
    store = MemoryStore(engine, embedder=HashingEmbedder(args_dims()), max_items=10**9)
    store.search(NS, "warm up", k=10, mode="vector")
    store.search(NS, "warm up", k=10, mode="hybrid")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        wall, cpu = time.perf_counter(), time.process_time()
        got = store.search(NS, req["q"], k=10, mode=req["mode"], now=req["now"])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        found = [[i["key"], i["score"]] for i in got["items"]]
        print(json.dumps({"wall": wall, "cpu": cpu, "found": found}), flush=True)
    store.close()
    engine.dispose()


def args_dims() -> int:
    return int(sys.argv[sys.argv.index("--dims") + 1]) if "--dims" in sys.argv else 256


def against(url: str, n: int, queries: list[str], other: str) -> list[dict[str, Any]]:
    """Each query and mode searched by this checkout's code and ``other``'s, taking turns."""
    here = Path(__file__).resolve()
    servers = {}
    for code, python in (("this", sys.executable), ("against", other)):
        servers[code] = subprocess.Popen(
            [python, str(here), "--serve", url, "--dims", str(args_dims())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for server in servers.values():
        assert server.stdout is not None
        assert json.loads(server.stdout.readline())["ready"]
    now = 1_800_000_000.0  # the reader's time, the same for both (nothing here expires)
    timers = {(m, c): Timer(f"search {m} ({c})", n) for m in MODES for c in servers}
    differ = dict.fromkeys(MODES, 0)
    turn = 0
    for q in queries:
        for mode in MODES:
            order = ["this", "against"] if turn % 2 else ["against", "this"]
            turn += 1
            found = {}
            for code in order:
                server = servers[code]
                assert server.stdin is not None
                assert server.stdout is not None
                server.stdin.write(json.dumps({"q": q, "mode": mode, "now": now}) + "\n")
                server.stdin.flush()
                r = json.loads(server.stdout.readline())
                timers[(mode, code)].wall.append(r["wall"])
                timers[(mode, code)].cpu.append(r["cpu"])
                found[code] = r["found"]
            differ[mode] += found["this"] != found["against"]
    for server in servers.values():
        assert server.stdin is not None
        server.stdin.close()
        server.wait()
    rows = []
    for mode in MODES:
        for code in servers:
            row = timers[(mode, code)].row()
            row["differ"] = differ[mode] if code == "this" else None
            rows.append(row)
    return rows


MODES = ("hybrid", "text", "vector")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--puts", type=int, default=300)
    parser.add_argument("--url", default="", help="PostgreSQL URL (default: a SQLite file)")
    parser.add_argument("--against", default="", help="another checkout's python: before/after")
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load_start = " ".join(f.read().split()[:3])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.items:
            if args.url:
                schema = f"bench_mem_{uuid.uuid4().hex[:8]}"
                admin = make_engine(args.url)
                with admin.begin() as conn:
                    conn.execute(text(f'CREATE SCHEMA "{schema}"'))
                sep = "&" if "?" in args.url else "?"
                url = f"{args.url}{sep}options=-csearch_path%3D{schema}"
                try:
                    rows += run(url, n, args)
                finally:
                    with admin.begin() as conn:
                        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
                    admin.dispose()
            else:
                rows += run(f"sqlite:///{Path(tmp) / f'mem-{n}.db'}", n, args)
    print(f"dims={args.dims} words/text={args.words} queries={args.queries} k=10")
    if args.against:
        print(f"this: {sys.executable}; against: {args.against}")
    print(f"{'op':<26}{'items':>9}{'p50 ms':>9}{'p99 ms':>9}{'cpu p50':>9}{'cpu p99':>9}")
    for r in rows:
        differ = "" if r.get("differ") is None else f"  answers differ: {r['differ']}"
        print(
            f"{r['op']:<26}{r['n']:>9}{r['p50']:>9.2f}{r['p99']:>9.2f}"
            f"{r['cpu50']:>9.2f}{r['cpu99']:>9.2f}{differ}"
        )
    for n in args.items:
        r = next(r for r in rows if r["n"] == n)
        cold = "" if args.against else f", first vector search {r['cold_ms']:.0f} ms"
        print(f"items={n}: bulk load {r['load_s']:.1f} s{cold}")
    with open("/proc/loadavg") as f:
        load_end = " ".join(f.read().split()[:3])
    print(f"load average at the start: {load_start}; at the end: {load_end}")


if __name__ == "__main__":
    main()
