"""LangGraph side of bench/memory.py; runs inside the bench's LangGraph environment.

    python memory_langgraph_driver.py WORKDIR sqlite|inmemory --sizes 10000,100000 [...]

One store, in this process, measured by ``_memory_cell.run_cell`` on the
corpus ``memory.py`` wrote to WORKDIR; prints one JSON line.

* ``sqlite``: ``langgraph.store.sqlite.SqliteStore`` on a file in WORKDIR,
  with its vector index: vectors in its ``store_vectors`` table (float32
  blobs), a search scoring every row of the namespace with sqlite-vec's
  ``vec_distance_cosine`` (exact; there is no approximate index). The
  connection is opened as ``SqliteStore.from_conn_string`` opens it
  (autocommit; the store wraps each ``batch`` in ``BEGIN``/``COMMIT``);
  ``--journal-mode`` and ``--synchronous`` set those pragmas (the parent
  passes Tiffany's, so both sync alike), and the report says what the
  connection reads back. This needs a ``sqlite3`` module that loads
  extensions: where the Python's own was built without (this machine's
  pyenv build), ``pysqlite3`` from PyPI stands in, with the SQLite it
  bundles (``memory.py`` installs it; the report names the version).
* ``inmemory``: ``langgraph.store.memory.InMemoryStore`` with the same index
  (a search computes cosine with numpy over every vector of the namespace).

The index's ``embed`` function looks each text up among the vectors
``memory.py`` computed once with Tiffany's HashingEmbedder, so LangGraph pays
no embedding cost (nor does Tiffany: its cell does the same), and returns
``list[float]`` as LangChain's embedding clients do. Note: SqliteStore
reads the fields to embed from ``text_fields`` (InMemoryStore from
``fields``); given only ``fields``, it embeds the whole value (``$``). The
config names both.

Bulk load: ``store.batch`` of ``PutOp``s, ``--batch`` (1,000) at a time: the
SqliteStore writes each batch as one multi-row INSERT in one transaction
(one ``embed`` call for the batch); the InMemoryStore embeds each batch in
one call. A single put is ``store.put(namespace, key, value)``. A search
is ``store.search(namespace, query=text, limit=10)``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

if not hasattr(sqlite3.Connection, "enable_load_extension"):
    # This Python's sqlite3 was built without loadable extensions, which the
    # SqliteStore's vector index needs (sqlite-vec): use pysqlite3's, as the
    # usual workaround does. The report names the SQLite version it brings.
    import pysqlite3.dbapi2 as sqlite3  # type: ignore[no-redef]

    sys.modules["sqlite3"] = sqlite3

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _memory_cell import Corpus, K, emit, index_of, key, run_cell
from langgraph.store.base import PutOp

NAMESPACE = ("bench",)
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class LangGraphCell:
    modes = ("vector",)

    def __init__(self, kind: str, workdir: Path, corpus: Corpus, args: argparse.Namespace) -> None:
        self.kind, self.corpus, self.batch_size = kind, corpus, args.batch
        vector = corpus.lookup()

        def embed(texts: list[str]) -> list[list[float]]:
            return [vector(t).tolist() for t in texts]

        index: Any = {
            "dims": corpus.dims,
            "embed": embed,
            "fields": ["text"],
            "text_fields": ["text"],
        }
        self.path = workdir / "langgraph-store.sqlite"
        for stale in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
            stale.unlink(missing_ok=True)  # a fresh store each run
        if kind == "sqlite":
            from langgraph.store.sqlite import SqliteStore

            self.conn = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None
            )
            if args.journal_mode:
                self.conn.execute(f"PRAGMA journal_mode={args.journal_mode}")
            if args.synchronous:
                self.conn.execute(f"PRAGMA synchronous={args.synchronous}")
            self.store: Any = SqliteStore(self.conn, index=index)
            self.store.setup()
            self.label = "LangGraph SqliteStore"
            self.bulk_how = (
                f"store.batch of {self.batch_size} PutOps: one multi-row INSERT (rows and "
                "vectors) in one transaction a batch"
            )
        else:
            from langgraph.store.memory import InMemoryStore

            self.conn = None
            self.store = InMemoryStore(index=index)
            self.label = "LangGraph InMemoryStore"
            self.bulk_how = f"store.batch of {self.batch_size} PutOps (one embed call a batch)"

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "langgraph": version("langgraph"),
            "python": sys.version.split()[0],
            "numpy": version("numpy"),
        }
        if self.conn is not None:
            out["langgraph-checkpoint-sqlite"] = version("langgraph-checkpoint-sqlite")
            out["sqlite-vec"] = version("sqlite-vec")
            out["sqlite"] = sqlite3.sqlite_version
            out["sqlite3 module"] = sqlite3.__name__
            out["journal_mode"] = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
            out["synchronous"] = SYNCHRONOUS[self.conn.execute("PRAGMA synchronous").fetchone()[0]]
        return out

    def bulk(self, start: int, stop: int) -> None:
        texts = self.corpus.texts
        for lo in range(start, stop, self.batch_size):
            hi = min(stop, lo + self.batch_size)
            self.store.batch([PutOp(NAMESPACE, key(i), {"text": texts[i]}) for i in range(lo, hi)])

    def put(self, i: int) -> None:
        self.store.put(NAMESPACE, key(i), {"text": self.corpus.texts[i]})

    def search(self, q: int, mode: str) -> list[int]:
        hits = self.store.search(NAMESPACE, query=self.corpus.queries[q], limit=K)
        return [index_of(h.key) for h in hits]

    def db_bytes(self) -> int | None:
        if self.conn is None:
            return None
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        base = str(self.path)
        return sum(os.path.getsize(p) for p in (base, base + "-wal") if os.path.exists(p))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir", type=Path)
    ap.add_argument("kind", choices=("sqlite", "inmemory"))
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--puts", type=int, default=200)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=20.0)
    ap.add_argument("--min-queries", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--journal-mode")
    ap.add_argument("--synchronous")
    ap.add_argument("--db-dir", type=Path, help="where the SQLite file goes (default WORKDIR)")
    args = ap.parse_args()
    corpus = Corpus(args.workdir)
    report = run_cell(
        lambda: LangGraphCell(args.kind, args.db_dir or args.workdir, corpus, args),
        [int(s) for s in args.sizes.split(",")],
        puts=args.puts,
        queries=args.queries,
        passes=args.passes,
        warmup=args.warmup,
        budget_s=args.budget_s,
        min_queries=args.min_queries,
    )
    emit(report)


if __name__ == "__main__":
    main()
