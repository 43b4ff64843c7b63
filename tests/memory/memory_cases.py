"""What the MemoryStore's SQLite and PostgreSQL tests share: data, bad calls, helpers."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
from sqlalchemy import Engine, func, select

from tiffany.memory import MemoryStore

NS = "users.alice"


def count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


CORPUS = {
    "tea": "Alice prefers green tea in the morning and black tea after lunch",
    "coffee": "Bob drinks strong coffee every morning before work",
    "cats": "The cat sleeps on the warm windowsill all afternoon",
    "garden": "Carol grows tomatoes and herbs in her garden",
    "needle": "The launch code word is zanzibar and nobody else knows it",
    "trains": "Dave takes the early train to the city on weekdays",
}


BAD_CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("namespace", "put", {"namespace": ""}),
    ("namespace", "put", {"namespace": ".hidden"}),
    ("namespace", "put", {"namespace": "a b"}),
    ("namespace", "put", {"namespace": "x" * 129}),
    ("namespace", "put", {"namespace": 3}),
    ("key", "put", {"key": ""}),
    ("key", "put", {"key": " padded"}),
    ("key", "put", {"key": "line\nbreak"}),
    ("key", "put", {"key": "k" * 257}),
    ("key", "put", {"key": "search"}),
    ("value", "put", {"value": {"a": object()}}),
    ("value", "put", {"value": float("nan")}),
    ("value", "put", {"value": (1, 2)}),
    ("value", "put", {"value": {1: "int key"}}),
    ("value", "put", {"value": "x" * (64 * 1024)}),
    ("text", "put", {"text": "t" * (32 * 1024 + 1)}),
    ("text", "put", {"text": 7}),
    ("op", "put", {"op": ""}),
    ("op", "put", {"op": "o" * 513}),
    ("ttl_s", "put", {"ttl_s": 0}),
    ("ttl_s", "put", {"ttl_s": -1}),
    ("ttl_s", "put", {"ttl_s": float("inf")}),
    ("ttl_s", "put", {"ttl_s": "10"}),
    ("run_id", "put", {"run_id": "r" * 201}),
    ("step_id", "put", {"step_id": ""}),
    ("embedding", "put", {"embedding": np.ones(3, dtype=np.float32)}),
    ("query", "search", {"query": ""}),
    ("query", "search", {"query": "   "}),
    ("query", "search", {"query": "q" * 4097}),
    ("k", "search", {"k": 0}),
    ("k", "search", {"k": 101}),
    ("k", "search", {"k": True}),
    ("mode", "search", {"mode": "fuzzy"}),
    ("depth", "neighbors", {"depth": 0}),
    ("depth", "neighbors", {"depth": 4}),
    ("limit", "neighbors", {"limit": 0}),
    ("relation", "neighbors", {"relation": "no spaces"}),
    ("relation", "link", {"relation": "r" * 65}),
    ("subject", "link", {"subject": "alice"}),
    ("object.key", "link", {"obj": ("people", "")}),
    ("props", "link", {"props": ["not", "an", "object"]}),
    ("props", "link", {"props": {"big": "p" * 5000}}),
    ("limit", "items", {"limit": 1001}),
    ("after", "items", {"after": 5}),
]


def call(store: MemoryStore, method: str, args: dict[str, Any]) -> Any:
    if method == "put":
        base: dict[str, Any] = {"namespace": NS, "key": "k", "value": "v", "op": "op-1"}
        base.update(args)
        return store.put(
            base.pop("namespace"),
            base.pop("key"),
            base.pop("value"),
            base.pop("text", None),
            **base,
        )
    if method == "search":
        base = {"namespace": NS, "query": "tea"}
        base.update(args)
        return store.search(base.pop("namespace"), base.pop("query"), **base)
    if method == "neighbors":
        return store.neighbors(NS, "k", **args)
    if method == "link":
        base = {"subject": ("people", "a"), "relation": "knows", "obj": ("people", "b"), "op": "l"}
        base.update(args)
        return store.link(base.pop("subject"), base.pop("relation"), base.pop("obj"), **base)
    return store.items(NS, **args)


class NoModel:
    """An embedder that must not be called (a rebuild takes the journaled vectors)."""

    id = "hashing-blake2b-v1-256"
    dims = 256
    kind = "offline feature hashing"

    def embed(self, texts: list[str]) -> np.ndarray:
        raise AssertionError(f"the model was called for {texts!r}")


WRITER = textwrap.dedent(
    """
    import sys
    from tiffany.memory import MemoryStore
    url, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = MemoryStore.open(url)
    for i in range(n):
        store.put("crash", None, f"fact number {i} from {prefix}", op=f"{prefix}/{i}")
        print(i, flush=True)
    store.close()
    """
)
