"""One store's cell of ``bench/memory.py``: load, time puts and searches, measure memory.

Imported by both sides: ``memory.py`` (Tiffany's MemoryStore, in the
repository's ``.venv``) and ``memory_langgraph_driver.py`` (LangGraph's
stores, in ``bench/.envs/langgraph``), so it uses the standard library and
numpy only. Each cell runs in a fresh process of its own, so the RSS a store
adds is its own.

The corpus is read from the work directory ``memory.py`` wrote (``texts.txt``,
one text a line; ``vectors.npy``, float32 [N, dims], L2-normalised, row i the
embedding of line i; ``queries.txt`` and ``qvectors.npy`` likewise). Item i
has key ``m{i:06d}`` and value ``{"text": text_i}`` in every store.

For each size N (ascending; the store grows from one size to the next):

1. **bulk**: items ``[previous N, N - puts)`` loaded the fastest way the store
   allows (the adapter's ``bulk_how`` says how), timed as a whole;
2. **puts**: the last ``puts`` items, one call each, each timed;
3. **searches**: for each mode, ``warmup`` untimed queries, then the queries
   in order, each timed, ``passes`` times over, until all are done or
   ``budget_s`` has passed (at least ``min_queries``; a fast store's p99 so
   rests on more samples than one pass gives); the keys each answer of the
   first pass ranked are returned, for ``memory.py`` to score against numpy's
   exact top-k;
4. **memory**: RSS (``/proc/self/status`` VmRSS, after a ``gc.collect()``)
   less the RSS before the store was opened, and the database's bytes.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

K = 10


class Adapter(Protocol):
    """What a store's cell provides."""

    label: str
    bulk_how: str
    modes: tuple[str, ...]

    def settings(self) -> dict[str, Any]: ...

    def bulk(self, start: int, stop: int) -> None: ...

    def put(self, i: int) -> None: ...

    def search(self, q: int, mode: str) -> list[int]: ...

    def db_bytes(self) -> int | None: ...

    def close(self) -> None: ...


class Corpus:
    """The texts, their vectors, the queries and theirs, as ``memory.py`` saved them."""

    def __init__(self, workdir: Path) -> None:
        self.texts = (workdir / "texts.txt").read_text().split("\n")
        self.vectors = np.load(workdir / "vectors.npy")
        self.queries = (workdir / "queries.txt").read_text().split("\n")
        self.qvectors = np.load(workdir / "qvectors.npy")
        assert len(self.texts) == len(self.vectors), "texts and vectors differ in number"
        assert len(self.queries) == len(self.qvectors), "queries and vectors differ in number"
        self.dims = int(self.vectors.shape[1])
        # built here, before a cell's baseline RSS: the table is the bench's, not a store's
        self._row: dict[str, tuple[np.ndarray, int]] = {}
        for i, t in enumerate(self.texts):
            self._row[t] = (self.vectors, i)
        for i, t in enumerate(self.queries):
            self._row[t] = (self.qvectors, i)

    def lookup(self) -> Callable[[str], np.ndarray]:
        """A function from a text (an item's or a query's) to its precomputed vector."""
        table = self._row

        def vector(text: str) -> np.ndarray:
            m, i = table[text]
            return m[i]

        return vector


def key(i: int) -> str:
    return f"m{i:06d}"


def index_of(k: str) -> int:
    return int(k[1:])


def rss_bytes() -> int:
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def quantiles_ms(samples_s: list[float]) -> dict[str, float]:
    a = np.asarray(samples_s) * 1000.0
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "n": len(samples_s),
    }


def run_cell(
    open_store: Callable[[], Adapter],
    sizes: list[int],
    *,
    puts: int,
    queries: int,
    passes: int,
    warmup: int,
    budget_s: float,
    min_queries: int,
) -> dict[str, Any]:
    """Measure one store at each size; return a JSON-able report."""
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    store = open_store()
    open_s = time.perf_counter() - t0
    out: dict[str, Any] = {"label": store.label, "bulk_how": store.bulk_how, "sizes": {}}
    db0 = store.db_bytes()
    loaded = 0
    try:
        for n in sorted(sizes):
            cell: dict[str, Any] = {}
            bulk_to = max(loaded, n - puts)
            t0 = time.perf_counter()
            store.bulk(loaded, bulk_to)
            cell["bulk_items"] = bulk_to - loaded
            cell["bulk_s"] = time.perf_counter() - t0
            lat = []
            for i in range(bulk_to, n):
                t0 = time.perf_counter()
                store.put(i)
                lat.append(time.perf_counter() - t0)
            loaded = n
            cell["put"] = quantiles_ms(lat)
            cell["search"] = {}
            for mode in store.modes:
                for q in range(warmup):
                    store.search(q % queries, mode)
                lat, hits = [], []
                start = time.perf_counter()
                for j in range(queries * passes):
                    if j >= min_queries and time.perf_counter() - start > budget_s:
                        break
                    t0 = time.perf_counter()
                    got = store.search(j % queries, mode)
                    lat.append(time.perf_counter() - t0)
                    if j < queries:
                        hits.append(got)
                cell["search"][mode] = {**quantiles_ms(lat), "hits": hits}
            cell["rss_delta_bytes"] = rss_bytes() - rss0
            db = store.db_bytes()
            cell["db_bytes"] = None if db is None else db - (db0 or 0)
            out["sizes"][str(n)] = cell
        out["settings"] = store.settings()
    finally:
        store.close()
    out["open_s"] = open_s
    return out


def emit(report: dict[str, Any]) -> None:
    """The report, one JSON line on stdout (the parent reads the last line)."""
    print(json.dumps(report), flush=True)
