"""The MemoryStore against LangGraph's stores: put and search latency, memory, recall, same run.

    python bench/memory.py              # 10,000 and 100,000 items (~7.5 min, more when busy)
    python bench/memory.py --quick      # 1,000 and 5,000 items, a smoke run (~1.5 min)
    python bench/memory.py --no-peers   # Tiffany only

**Corpus.** ``--seed``ed synthetic texts of 180-220 words (about 200) drawn
from a Zipf-Mandelbrot vocabulary of 30,000 made-up words (frequent words
short, as in natural text); 5% of the texts carry one "needle", a made-up
term found nowhere else. Item i: key ``m{i:06d}``, value ``{"text": text}``,
all in one namespace. Queries (``--queries``, 200): half a needle term and
two other words of its text, half six consecutive words of a text; every
query's text lies in the first size's items.

**The same embeddings for everyone.** Every text and query is embedded once,
here (``--embed-workers`` processes), with Tiffany's ``HashingEmbedder`` (its
default dims), and saved
(``vectors.npy``, ``texts.txt``, ...) to the work directory. Every store's
embedding function then looks the vector up by its text: LangGraph's index
``embed`` function and, for Tiffany, an ``Embedder`` with the
HashingEmbedder's id, dims and kind. No store pays for embedding in these
figures; what the HashingEmbedder itself costs a text is printed apart.

**Stores**, each in a fresh process of its own (``_memory_cell.py`` times
them all alike: bulk-load, single puts, searches, memory):

* Tiffany ``MemoryStore`` on a SQLite file (its engine migrated as ``tiffany
  db upgrade`` does), and on the local PostgreSQL (a private schema,
  ``--pg-url``) when it answers, up to ``--pg-max`` (10,000) items: the
  MemoryStore has no bulk write, so every item is a ``put`` and a commit,
  and 100,000 of them would take the run past its budget. The PostgreSQL
  cell ranks vectors exactly in the process (``pgvector="off"``); a second
  cell, ``(postgresql, pgvector)``, runs on a database with the ``vector``
  extension (``--pgvector-url``; made, with the extension, if missing) and
  ranks them in SQL with pgvector (exact too), up to ``--pgvector-max``
  (100,000) items; ``--no-pgvector`` leaves it out;
* LangGraph ``SqliteStore`` on a file with its vector index (sqlite-vec), at
  the journal mode and ``synchronous`` Tiffany's SQLite store runs with, and
  LangGraph ``InMemoryStore`` with the same index (``memory_langgraph_driver.py``,
  in ``bench/.envs/langgraph``, built from PyPI on first use).

**Measured**, at each size (10,000 and 100,000 items; the store grows from
one to the next): the bulk load of all but the last ``--puts`` (200) items,
the fastest way the store allows (each says how: LangGraph's in batches
of 1,000 ``PutOp``s, Tiffany's one ``put`` at a time, from 8 threads on
PostgreSQL); then those ``--puts`` items one call each (put p50/p99); then
``--queries`` searches for the top 10 by vector similarity (Tiffany: its
``vector`` and ``hybrid`` modes), each timed, ``--passes`` (5) times over
the queries, until done or ``--budget-s`` (15 s) has passed (search
p50/p99, and how many were timed); memory per item (the RSS the store's process gained since before
it opened the store, over N; the database's bytes over N); recall@10 of each
vector search against numpy's exact top 10 over the same vectors (exact
search scores 1.0, reported anyway), and the share of needle queries whose
needle's text came back in the top 10.

**A write's cost in the journal**: a plan of ``memory.put`` steps run with
``tiffany run`` on a fresh data dir, once with 10 and once with 110 steps;
the WAL's growth (the bytes of its records: frame and payload) between
the two, over 100, is what a ``memory.put`` step adds (by record type: a
step's result is journaled in its WAKE and in its tasks' TASK_EXITs); a
plan of trivial ``python`` steps, measured alike, is printed beside it.

The figures are printed side by side with the ratios, and the targets of
issue 42 beside them (Tiffany's search p99 at 100,000 items under 5 ms, and
at least 3x LangGraph SqliteStore's); nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import venv
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _memory_cell import Corpus, K, emit, index_of, key, run_cell  # noqa: E402

ENVS = ROOT / "bench" / ".envs"
#: The bench's LangGraph environment (bench/plans.py's), numpy added for the vector index.
LANGGRAPH_SPEC = "langgraph==1.2.24 langgraph-checkpoint-sqlite==3.1.2 numpy"
PG_URL = os.environ.get("TIFFANY_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
#: A database with the ``vector`` extension (made, with it, when missing and the user may).
PGVECTOR_URL = os.environ.get(
    "TIFFANY_BENCH_PGVECTOR", "postgresql+psycopg://postgres@127.0.0.1:5432/tiffany_bench_pgvector"
)
NAMESPACE = "bench"
#: Threads putting at once in Tiffany's bulk load on PostgreSQL.
PG_BULK_THREADS = 8
#: Issue 42's targets.
TARGET_P99_MS = 5.0
TARGET_VS_SQLITESTORE = 3.0

# -- the corpus ------------------------------------------------------------------------

VOCABULARY = 30_000
ZIPF_S = 1.07  # exponent and shift of the Zipf-Mandelbrot law over word ranks
ZIPF_Q = 2.7
WORDS_MIN, WORDS_MAX = 180, 220
NEEDLE_SHARE = 0.05
SHORT_WORDS = 20
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]  # 90


def vocabulary(rng: np.random.Generator) -> list[str]:
    """Made-up words: a rank spelt in base 90 over shuffled syllables (frequent words short)."""
    syl = [SYLLABLES[i] for i in rng.permutation(len(SYLLABLES))]
    b = len(syl)
    words = []
    for r in range(VOCABULARY):
        # the 20 most frequent words one syllable, the rest two or three
        n, parts = (r + 1 if r < SHORT_WORDS else r - SHORT_WORDS + b), []
        while n:
            n, d = divmod(n, b)
            parts.append(syl[d])
        words.append("".join(parts))
    return words


def make_corpus(n: int, n_queries: int, first_size: int, seed: int) -> dict[str, Any]:
    """Texts, needles and queries, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    words = np.array(vocabulary(rng), dtype=object)
    p = 1.0 / (np.arange(VOCABULARY) + ZIPF_Q) ** ZIPF_S
    p /= p.sum()
    lengths = rng.integers(WORDS_MIN, WORDS_MAX + 1, size=n)
    ends = np.cumsum(lengths)
    tokens = words[rng.choice(VOCABULARY, size=int(ends[-1]), p=p)]
    docs = [tokens[e - ln : e].tolist() for e, ln in zip(ends, lengths, strict=True)]
    needle_docs = np.sort(rng.choice(n, size=max(1, int(n * NEEDLE_SHARE)), replace=False))
    needles: dict[int, str] = {}
    for d in needle_docs.tolist():
        term = "zx" + "".join(chr(97 + c) for c in rng.integers(0, 26, size=8))
        needles[d] = term
        docs[d].insert(int(rng.integers(0, len(docs[d]) + 1)), term)
    texts = [" ".join(d) for d in docs]
    queries, query_needle = [], []
    early = [d for d in needles if d < first_size]
    for qi in range(n_queries):
        if qi % 2 == 0 and early:
            d = early[int(rng.integers(0, len(early)))]
            others = [w for w in docs[d] if w != needles[d]]
            picks = rng.choice(len(others), size=2, replace=False)
            queries.append(" ".join([needles[d], *(others[int(j)] for j in picks)]))
            query_needle.append(d)
        else:
            d = int(rng.integers(0, first_size))
            at = int(rng.integers(0, len(docs[d]) - 6))
            queries.append(" ".join(docs[d][at : at + 6]))
            query_needle.append(-1)
    return {"texts": texts, "queries": queries, "query_needle": query_needle}


def _embed_chunk(texts: list[str]) -> tuple[np.ndarray, float]:
    from tiffany.memory import HashingEmbedder

    t0 = time.process_time()
    vectors = np.asarray(HashingEmbedder().embed(texts), dtype=np.float32)
    return vectors, time.process_time() - t0


def embed_all(texts: list[str], workers: int, chunk: int = 2000) -> tuple[np.ndarray, float]:
    """The HashingEmbedder's vectors of every text (``workers`` processes), and its CPU s a text."""
    chunks = [texts[i : i + chunk] for i in range(0, len(texts), chunk)]
    workers = max(1, min(workers, len(chunks)))
    if workers == 1:
        parts = [_embed_chunk(c) for c in chunks]
    else:
        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_embed_chunk, chunks))
    vectors = np.ascontiguousarray(np.concatenate([v for v, _ in parts]), dtype=np.float32)
    return vectors, sum(cpu for _, cpu in parts) / len(texts)


def write_corpus(workdir: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Make the corpus, embed it once with Tiffany's HashingEmbedder, save it to ``workdir``."""
    from tiffany.memory import HashingEmbedder

    t0 = time.perf_counter()
    c = make_corpus(n, args.queries, min(args.sizes), args.seed)
    made_s = time.perf_counter() - t0
    embedder = HashingEmbedder()
    vectors, per_text_s = embed_all(c["texts"], args.embed_workers)
    qvectors, per_query_s = embed_all(c["queries"], 1)
    (workdir / "texts.txt").write_text("\n".join(c["texts"]))
    (workdir / "queries.txt").write_text("\n".join(c["queries"]))
    np.save(workdir / "vectors.npy", vectors)
    np.save(workdir / "qvectors.npy", qvectors)
    words = sum(t.count(" ") + 1 for t in c["texts"]) / n
    return {
        "made_s": made_s,
        "embed_per_text_us": per_text_s * 1e6,
        "embed_per_query_us": per_query_s * 1e6,
        "embedder": {"id": embedder.id, "dims": embedder.dims, "kind": embedder.kind},
        "words_per_text": words,
        "chars_per_text": sum(map(len, c["texts"])) / n,
        "needles": int(sum(1 for q in c["query_needle"] if q >= 0)),
        "query_needle": c["query_needle"],
        "vectors": vectors,
        "qvectors": qvectors,
    }


def exact_top(vectors: np.ndarray, qvectors: np.ndarray, n: int) -> list[list[int]]:
    """numpy's exact top-K of each query among the first ``n`` vectors (ties: lower index)."""
    scores = qvectors @ vectors[:n].T
    out = []
    for row in scores:
        part = np.argpartition(-row, K)[: K + 1]
        out.append(sorted(part.tolist(), key=lambda i: (-row[i], i))[:K])
    return out


# -- Tiffany's cell (a child process: --cell) ------------------------------------------


class LookupEmbedder:
    """The HashingEmbedder's identity, its vectors looked up from the bench's precomputed ones."""

    def __init__(self, real: Any, corpus: Corpus) -> None:
        self.id, self.dims, self.kind = real.id, real.dims, real.kind
        self.real = real
        self.vector = corpus.lookup()

    def embed(self, texts: list[str]) -> np.ndarray:
        try:
            return np.stack([self.vector(t) for t in texts])
        except KeyError:  # a text that is not the corpus's (none in this bench)
            return np.asarray(self.real.embed(texts), dtype=np.float32)


class TiffanyCell:
    modes = ("vector", "hybrid")

    def __init__(
        self, backend: str, url: str, corpus: Corpus, db_path: Path | None, max_items: int
    ) -> None:
        from tiffany.memory import HashingEmbedder, MemoryStore
        from tiffany.store.migrate import upgrade
        from tiffany.store.session import make_engine

        self.backend, self.url, self.corpus, self.db_path = backend, url, corpus, db_path
        engine = make_engine(url)
        upgrade(engine)  # what `tiffany db upgrade` does: the memory tables (and mem_vectors)
        self.store = MemoryStore(
            engine,
            embedder=LookupEmbedder(HashingEmbedder(), corpus),
            max_items=max_items,
            pgvector="auto" if backend == "pgvector" else "off",
        )
        if backend == "pgvector" and self.store.vector_index != "pgvector":
            raise RuntimeError(f"pgvector is not ready at {url}: see the log line above")
        self.label = (
            "Tiffany MemoryStore (postgresql, pgvector)"
            if backend == "pgvector"
            else f"Tiffany MemoryStore ({backend})"
        )
        # SQLite has one writer: more threads only queue on its lock. PostgreSQL
        # commits concurrent transactions in one WAL flush (group commit).
        self.bulk_threads = 1 if backend == "sqlite" else PG_BULK_THREADS
        self.bulk_how = "store.put, one call an item (a transaction each; no bulk API)" + (
            f", from {self.bulk_threads} threads at once" if self.bulk_threads > 1 else ""
        )

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        out: dict[str, Any] = {"numpy": np.__version__, "sqlalchemy": version("sqlalchemy")}
        engine = getattr(self.store, "engine", None)
        if engine is not None:
            from sqlalchemy import text

            with engine.connect() as conn:
                if self.backend == "sqlite":
                    out["sqlite"] = conn.execute(text("select sqlite_version()")).scalar()
                    out["journal_mode"] = conn.execute(text("PRAGMA journal_mode")).scalar()
                    sync = conn.execute(text("PRAGMA synchronous")).scalar()
                    out["synchronous"] = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[sync]
                else:
                    out["postgresql"] = conn.execute(text("show server_version")).scalar()
                    out["vector_index"] = self.store.vector_index
                    out["synchronous_commit"] = conn.execute(
                        text("show synchronous_commit")
                    ).scalar()
        return out

    def bulk(self, start: int, stop: int) -> None:
        if self.bulk_threads == 1:
            for i in range(start, stop):
                self.put(i)
            return
        with ThreadPoolExecutor(self.bulk_threads) as pool:
            for _ in pool.map(self.put, range(start, stop)):
                pass

    def put(self, i: int) -> None:
        self.store.put(NAMESPACE, key(i), {"text": self.corpus.texts[i]}, op=f"bench:{i}")

    def search(self, q: int, mode: str) -> list[int]:
        got = self.store.search(NAMESPACE, self.corpus.queries[q], k=K, mode=mode)
        return [index_of(it["key"]) for it in got["items"]]

    def db_bytes(self) -> int | None:
        if self.db_path is not None:
            with sqlite3.connect(self.db_path) as c:
                c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            base = str(self.db_path)
            return sum(os.path.getsize(p) for p in (base, base + "-wal") if os.path.exists(p))
        engine = getattr(self.store, "engine", None)
        if engine is None:
            return None
        from sqlalchemy import text

        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "select coalesce(sum(pg_total_relation_size(c.oid)), 0) from pg_class c "
                        "join pg_namespace n on n.oid = c.relnamespace "
                        "where n.nspname = current_schema() and c.relkind in ('r', 'm')"
                    )
                ).scalar()
            )

    def close(self) -> None:
        self.store.close()
        self.store.engine.dispose()


def tiffany_cell(args: argparse.Namespace) -> None:
    corpus = Corpus(args.workdir)
    db_path = args.workdir / "tiffany-memory.db" if args.cell == "sqlite" else None
    if db_path:
        for stale in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
            stale.unlink(missing_ok=True)  # a fresh store each run
    url = f"sqlite:///{db_path}" if db_path else args.cell_url
    report = run_cell(
        lambda: TiffanyCell(args.cell, url, corpus, db_path, max(args.sizes)),
        args.sizes,
        puts=args.puts,
        queries=args.queries,
        passes=args.passes,
        warmup=args.warmup,
        budget_s=args.budget_s,
        min_queries=args.min_queries,
    )
    emit(report)


# -- the parent: children, scoring, tables ------------------------------------------------


def pgvector_database(url: str) -> str | None:
    """Make ``url``'s database and its ``vector`` extension if missing; None, or why not."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if (
                conn.execute(
                    text("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
                ).scalar()
                is None
            ):
                return "the server has no pgvector (pg_available_extensions)"
            if not conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": target.database}
            ).scalar():
                conn.execute(text(f'CREATE DATABASE "{target.database}"'))
        db = create_engine(target)
        try:
            with db.begin() as conn:
                conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public"))
        finally:
            db.dispose()
    except Exception as exc:  # reported, and the pgvector cell skipped
        return f"{type(exc).__name__}: {exc}"
    finally:
        admin.dispose()
    return None


def cell_args(args: argparse.Namespace) -> list[str]:
    return [
        "--sizes",
        ",".join(map(str, args.sizes)),
        "--puts",
        str(args.puts),
        "--queries",
        str(args.queries),
        "--passes",
        str(args.passes),
        "--warmup",
        str(args.warmup),
        "--budget-s",
        str(args.budget_s),
        "--min-queries",
        str(args.min_queries),
    ]


def child(cmd: list[str], what: str) -> dict[str, Any] | None:
    print(f"  {what}...", end="", flush=True)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    load1 = os.getloadavg()[0]
    print(f" {time.perf_counter() - t0:.0f} s (load {load0:.1f} to {load1:.1f})", flush=True)
    if proc.returncode != 0:
        print(f"{what} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["load"] = (load0, load1)
    return report


def langgraph_python() -> Path:
    """The bench's LangGraph environment (plans.py's; created on first use), made fit for this.

    It needs numpy (the InMemoryStore's search) and sqlite-vec (the SqliteStore's
    vector index), and a ``sqlite3`` that loads extensions: where the
    interpreter's cannot, ``pysqlite3`` (memory_langgraph_driver.py uses it then).
    """
    env = ENVS / "langgraph"
    python = env / "bin" / "python"
    if not python.exists():
        print(f"creating {env} ({LANGGRAPH_SPEC}, first run only)...", flush=True)
        venv.create(env, with_pip=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *LANGGRAPH_SPEC.split()], check=True
        )
    need = []
    for module, package in (("numpy", "numpy"), ("sqlite_vec", "sqlite-vec")):
        if subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode:
            need.append(package)
    loads = "import sqlite3; sqlite3.Connection.enable_load_extension"
    no_ext = subprocess.run([str(python), "-c", loads], capture_output=True).returncode
    if no_ext and subprocess.run([str(python), "-c", "import pysqlite3"]).returncode:
        need.append("pysqlite3")
    if need:
        print(f"installing {' '.join(need)} into {env}...", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *need], check=True)
    return python


# -- a write's cost in the journal -----------------------------------------------------------


def wal_bytes(data_dir: Path) -> dict[str, int]:
    """The bytes of the WAL's records (frame and payload) by record type, not its files' size."""
    from tiffany.wal import iter_records
    from tiffany.wire.records import RecordType

    frame = 4 + 4 + 1  # crc, length, type: docs/wal-format.md
    out: dict[str, int] = {}
    for r in iter_records(data_dir / "wal"):
        name = (
            RecordType(r.rtype).name if r.rtype in RecordType._value2member_map_ else str(r.rtype)
        )
        out[name] = out.get(name, 0) + frame + len(r.payload)
    return out


#: The python tool the baseline plan calls (written to the work directory, --import'ed).
TOOLS_MODULE = """
from tiffany.agents.tools.python import python_tool


@python_tool("bench_noop")
def bench_noop() -> None:
    return None
"""


def plan_wal_bytes(workdir: Path, steps: list[dict[str, Any]], tag: str) -> dict[str, int] | None:
    data = workdir / f"journal-{tag}"
    plan = workdir / f"plan-{tag}.json"
    plan.write_text(json.dumps({"name": f"bench-{tag}", "steps": steps}))
    (workdir / "bench_memory_tools.py").write_text(TOOLS_MODULE)
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "tiffany"),
            "run",
            str(plan),
            "--json",
            "--no-live",
            "--import",
            "bench_memory_tools",
            "--data-dir",
            str(data),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        print(f"tiffany run ({tag}) failed: {proc.stderr[-1500:]}", file=sys.stderr)
        return None
    return wal_bytes(data)


def journal_cost(workdir: Path, texts: list[str]) -> dict[str, Any]:
    """A memory.put step's WAL bytes (and a trivial python step's), by the growth from 10 to 110."""

    def put_steps(n: int) -> list[dict[str, Any]]:
        return [
            {
                "id": f"p{i}",
                "tool": "memory.put",
                "args": {"namespace": NAMESPACE, "key": key(i), "value": {"text": texts[i]}},
            }
            for i in range(n)
        ]

    def python_steps(n: int) -> list[dict[str, Any]]:
        return [
            {"id": f"p{i}", "tool": "python", "args": {"function": "bench_noop", "kwargs": {}}}
            for i in range(n)
        ]

    out: dict[str, Any] = {}
    for label, make in (("memory.put", put_steps), ("python", python_steps)):
        small = plan_wal_bytes(workdir, make(10), f"{label}-10")
        large = plan_wal_bytes(workdir, make(110), f"{label}-110")
        if small is None or large is None:
            out[label] = None
            continue
        by_type = {t: (large[t] - small.get(t, 0)) / 100 for t in large}
        out[label] = {
            "bytes": sum(by_type.values()),
            "by_type": {
                t: b for t, b in sorted(by_type.items(), key=lambda tb: -tb[1]) if abs(b) >= 0.5
            },
        }
    out["text_chars"] = sum(map(len, texts[:110])) / 110
    return out


# -- printing ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "sqlite": sqlite3.sqlite_version,
    }


def score(report: dict[str, Any], truth: dict[int, list[list[int]]], needle: list[int]) -> None:
    """Add recall@10 against exact, and the needle hit rate, to each search of a report."""
    for n, cell in report["sizes"].items():
        exact = truth[int(n)]
        for s in cell["search"].values():
            hits = s.pop("hits")
            s["recall"] = float(
                np.mean([len(set(h) & set(exact[q])) / K for q, h in enumerate(hits)])
            )
            nq = [(q, needle[q]) for q in range(len(hits)) if needle[q] >= 0]
            s["needle"] = float(np.mean([d in hits[q] for q, d in nq])) if nq else float("nan")


def rows(reports: list[dict[str, Any]], n: int) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    for r in reports:
        cell = r["sizes"].get(str(n))
        if cell:
            for mode, s in cell["search"].items():
                out.append((f"{r['label']} {mode}", cell, s))
    return out


def fmt_x(x: float) -> str:
    """A ratio with the digits it needs (0.025x, 2.5x, 25x)."""
    if x >= 10:
        return f"{x:,.0f}x"
    if x >= 1:
        return f"{x:.1f}x"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.3f}x"


def fmt_ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def print_tables(reports: list[dict[str, Any]], sizes: list[int]) -> None:
    for n in sizes:
        print(f"\n{n:,} items: latency ms; bulk items/s; memory bytes an item")
        print(
            f"{'store, search mode':<52}{'bulk/s':>8}{'put p50':>9}{'put p99':>9}"
            f"{'search p50':>12}{'search p99':>12}{'queries':>9}{'recall@10':>11}"
            f"{'needle@10':>11}{'RSS/item':>10}{'DB/item':>9}"
        )
        for label, cell, s in rows(reports, n):
            bulk = cell["bulk_items"] / cell["bulk_s"] if cell["bulk_s"] else float("nan")
            db = cell["db_bytes"]
            print(
                f"{label:<52}{bulk:>8,.0f}{fmt_ms(cell['put']['p50_ms']):>9}"
                f"{fmt_ms(cell['put']['p99_ms']):>9}{fmt_ms(s['p50_ms']):>12}"
                f"{fmt_ms(s['p99_ms']):>12}{s['n']:>9}{s['recall']:>11.3f}{s['needle']:>11.2f}"
                f"{cell['rss_delta_bytes'] / n:>10,.0f}{'-' if db is None else f'{db / n:,.0f}':>9}"
            )


PEERS = (("LangGraph SqliteStore", "SqliteStore"), ("LangGraph InMemoryStore", "InMemoryStore"))


def ratio_lines(reports: list[dict[str, Any]], sizes: list[int]) -> None:
    by = {r["label"]: r for r in reports}
    peers = [(label, short) for label, short in PEERS if label in by]
    tiffany = [r for r in reports if r["label"].startswith("Tiffany")]
    cols = [
        (label, short, metric) for label, short in peers for metric in ("search p99", "put p50")
    ]
    print(
        "\nratios: the peer's figure / Tiffany's (above 1: Tiffany is faster); a peer's search "
        "is its vector search, beside each of Tiffany's modes"
    )
    print(
        f"{'Tiffany store, mode':<30}{'items':>9}"
        + "".join(f"{s + ' ' + m:>26}" for _, s, m in cols)
    )
    for t in tiffany:
        for n in sizes:
            cell = t["sizes"].get(str(n))
            if not cell:
                continue
            for mode, s in cell["search"].items():
                backend = t["label"][len("Tiffany MemoryStore ") :].strip("()")
                line = f"{backend + ' ' + mode:<30}{n:>9,}"
                for label, _, metric in cols:
                    pc = by[label]["sizes"].get(str(n))
                    if not pc:
                        line += f"{'-':>26}"
                    elif metric == "search p99":
                        line += f"{fmt_x(pc['search']['vector']['p99_ms'] / s['p99_ms']):>26}"
                    else:
                        line += f"{fmt_x(pc['put']['p50_ms'] / cell['put']['p50_ms']):>26}"
                print(line)
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        print(f"\nmemory an item added from {lo:,} to {hi:,} items (the fixed costs left out):")
        for r in reports:
            a, b = r["sizes"].get(str(lo)), r["sizes"].get(str(hi))
            if a and b:
                rss = (b["rss_delta_bytes"] - a["rss_delta_bytes"]) / (hi - lo)
                db = (
                    "-"
                    if b["db_bytes"] is None
                    else f"{(b['db_bytes'] - a['db_bytes']) / (hi - lo):,.0f}"
                )
                print(f"  {r['label']:<44}RSS {rss:>8,.0f} bytes, database {db:>7} bytes")
    big = max(sizes)
    print(f"\ntargets (issue 42), at {big:,} items:")
    sq = by.get("LangGraph SqliteStore", {}).get("sizes", {}).get(str(big))
    for t in tiffany:
        cell = t["sizes"].get(str(big))
        if not cell:
            continue
        for mode, s in cell["search"].items():
            p99 = s["p99_ms"]
            line = (
                f"  {t['label']} {mode}: search p99 {p99:.2f} ms "
                f"(< {TARGET_P99_MS:.0f} ms: {'met' if p99 < TARGET_P99_MS else 'MISSED'})"
            )
            if sq:
                x = sq["search"]["vector"]["p99_ms"] / p99
                line += (
                    f"; SqliteStore's p99 / Tiffany's {x:.1f}x (>= {TARGET_VS_SQLITESTORE:.0f}x: "
                    f"{'met' if x >= TARGET_VS_SQLITESTORE else 'MISSED'})"
                )
            print(line)


# -- main ----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="1,000 and 5,000 items, 50 queries")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--queries", type=int)
    ap.add_argument("--puts", type=int, default=200, help="single puts timed at each size")
    ap.add_argument("--passes", type=int, default=5, help="passes over the queries, within budget")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=15.0, help="search time cap a mode a size")
    ap.add_argument("--min-queries", type=int, default=10)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--embed-workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes embedding the corpus (once, before any store runs)",
    )
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--pg-url", default=PG_URL)
    ap.add_argument(
        "--pg-max",
        type=int,
        default=10_000,
        help="the largest size PostgreSQL runs at (its loads go through put, a commit each)",
    )
    ap.add_argument("--dir", type=Path, help="work directory parent (default: the system's temp)")
    ap.add_argument("--no-pgvector", action="store_true")
    ap.add_argument(
        "--no-exact-cells",
        action="store_true",
        help="run only the pgvector cell (not the SQLite and exact PostgreSQL ones)",
    )
    ap.add_argument("--pgvector-url", default=PGVECTOR_URL)
    ap.add_argument(
        "--pgvector-max",
        type=int,
        default=100_000,
        help="the largest size the pgvector cell runs at",
    )
    ap.add_argument("--cell", choices=("sqlite", "postgresql", "pgvector"), help=argparse.SUPPRESS)
    ap.add_argument("--cell-url", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sizes is None:
        args.sizes = [1000, 5000] if args.quick else [10_000, 100_000]
    if args.queries is None:
        args.queries = 50 if args.quick else 200
    args.sizes = sorted(args.sizes)
    return args


def main() -> None:
    args = parse_args()
    if args.cell:
        tiffany_cell(args)
        return
    load0 = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tiffany-bench-memory-", dir=args.dir) as d:
        workdir = Path(d)
        n = max(args.sizes)
        print(f"corpus: {n:,} texts, {args.queries} queries (seed {args.seed})...", flush=True)
        corpus = write_corpus(workdir, n, args)
        truth = {s: exact_top(corpus["vectors"], corpus["qvectors"], s) for s in args.sizes}
        me = [sys.executable, __file__, *cell_args(args), "--workdir", str(workdir)]
        reports: list[dict[str, Any] | None] = []
        print("stores, each in a fresh process:", flush=True)
        tiffany_sqlite = None
        if not args.no_exact_cells:
            tiffany_sqlite = child([*me, "--cell", "sqlite"], "Tiffany MemoryStore (sqlite)")
            reports.append(tiffany_sqlite)
        pg_note = "not run (--no-pg)" if args.no_pg else "not run (--no-exact-cells)"
        if not args.no_pg and not args.no_exact_cells:
            from _pg import drop_pg_schema, pg_schema

            made = pg_schema(args.pg_url, "bench_memory")
            if made is None:
                pg_note = f"not reachable at {args.pg_url}"
            else:
                url, handle = made
                pg_sizes = [s for s in args.sizes if s <= args.pg_max] or args.sizes[:1]
                pg_cmd = [*me, "--cell", "postgresql", "--cell-url", url]
                pg_cmd += ["--sizes", ",".join(map(str, pg_sizes))]  # the last --sizes counts
                try:
                    reports.append(
                        child(
                            pg_cmd,
                            "Tiffany MemoryStore (postgresql)",
                        )
                    )
                    pg_note = f"run at {', '.join(f'{s:,}' for s in pg_sizes)} items" + (
                        f" (--pg-max {args.pg_max:,})" if pg_sizes != args.sizes else ""
                    )
                finally:
                    drop_pg_schema(handle)
        pgv_note = "not run (--no-pgvector)" if not args.no_pg else "not run (--no-pg)"
        if not args.no_pg and not args.no_pgvector:
            from _pg import drop_pg_schema, pg_schema

            why = pgvector_database(args.pgvector_url)
            made = None if why else pg_schema(args.pgvector_url, "bench_memory_pgv")
            if made is None:
                pgv_note = f"not run: {why or 'not reachable'}"
            else:
                url, handle = made
                pgv_sizes = [s for s in args.sizes if s <= args.pgvector_max] or args.sizes[:1]
                pgv_cmd = [*me, "--cell", "pgvector", "--cell-url", url]
                pgv_cmd += ["--sizes", ",".join(map(str, pgv_sizes))]
                try:
                    reports.append(child(pgv_cmd, "Tiffany MemoryStore (postgresql, pgvector)"))
                    pgv_note = f"run at {', '.join(f'{s:,}' for s in pgv_sizes)} items"
                finally:
                    drop_pg_schema(handle)
        if not args.no_peers:
            lg = [
                str(langgraph_python()),
                str(ROOT / "bench" / "memory_langgraph_driver.py"),
                str(workdir),
            ]
            same = []
            if tiffany_sqlite:
                st = tiffany_sqlite["settings"]
                if "journal_mode" in st:
                    same = [
                        "--journal-mode",
                        st["journal_mode"],
                        "--synchronous",
                        st["synchronous"],
                    ]
            reports.append(child([*lg, "sqlite", *cell_args(args), *same], "LangGraph SqliteStore"))
            reports.append(child([*lg, "inmemory", *cell_args(args)], "LangGraph InMemoryStore"))
        print("journal: plans of memory.put and python steps with tiffany run...", flush=True)
        texts = (workdir / "texts.txt").read_text().split("\n", 110)[:110]
        journal = journal_cost(workdir, texts)
    done = [r for r in reports if r]
    for r in done:
        score(r, truth, corpus["query_needle"])
    load1 = os.getloadavg()
    m = machine()
    e = corpus["embedder"]
    print(
        f"\nmemory: {n:,} synthetic texts of {corpus['words_per_text']:.0f} words "
        f"({corpus['chars_per_text']:.0f} chars) on average, Zipf vocabulary of {VOCABULARY:,}, "
        f"5% with a needle term; {args.queries} queries ({corpus['needles']} needle); top {K}; "
        f"seed {args.seed}"
    )
    print(
        f"embeddings: computed once with {e['id']} ({e['dims']} dims, {e['kind']}): "
        f"{corpus['embed_per_text_us']:,.0f} us of CPU a text, "
        f"{corpus['embed_per_query_us']:,.0f} us a query; every store looks them up by text "
        "(none pays for embedding below)"
    )
    print(
        f"machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, numpy {m['numpy']}, "
        f"SQLite {m['sqlite']} (Tiffany's); load average "
        f"{' '.join(f'{x:.1f}' for x in load0)} at the start, "
        f"{' '.join(f'{x:.1f}' for x in load1)} at the end; "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    print("stores:")
    for r in done:
        st = ", ".join(f"{k} {v}" for k, v in r["settings"].items())
        print(
            f"  {r['label']}: {st}; bulk load: {r['bulk_how']}; load average "
            f"{r['load'][0]:.1f} at its start, {r['load'][1]:.1f} at its end"
        )
    print(f"  Tiffany MemoryStore (postgresql): {pg_note}")
    print(f"  Tiffany MemoryStore (postgresql, pgvector): {pgv_note}")
    print_tables(done, args.sizes)
    ratio_lines(done, args.sizes)
    print(
        "\njournal: bytes a step adds to the WAL (records' frames and payloads; growth from a "
        "plan of 10 steps to one of 110, over 100, each run with tiffany run on a fresh data dir)"
    )
    for label in ("memory.put", "python"):
        j = journal[label]
        if j is None:
            print(f"  {label:<12}failed")
            continue
        parts = ", ".join(f"{t} {b:,.0f}" for t, b in j["by_type"].items())
        print(f"  {label:<12}{j['bytes']:>8,.0f} bytes a step ({parts})")
    print(
        f'  (a put\'s value is {{"text": text}}, the texts {journal["text_chars"]:,.0f} chars on '
        "average; the put's result, journaled, carries its value, text and vector)"
    )


if __name__ == "__main__":
    main()
