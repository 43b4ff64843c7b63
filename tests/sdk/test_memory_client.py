"""The SDK's memory methods against a real ``tiffany serve`` (loopback, a token).

The memory is seeded as runs write it, through a
:class:`~tiffany.memory.MemoryStore` on the served data dir's database;
``Client`` and ``AsyncClient`` read it back as the wire's models, page it,
search it, open an item with its links, versions and neighbours, and delete
an item exactly once under an Idempotency-Key. Keys that hold ``/``, ``.``
or ``..`` reach their item (each is one path segment); refusals are the
SDK's typed errors naming the field.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sdk_support import Served, serve, short_dir

from tiffany import AsyncClient, Client
from tiffany.memory import MemoryStore
from tiffany.sdk.errors import InvalidRequest, NotFound
from tiffany.sdk.models import MemoryItemDetail, MemoryNamespaces, MemorySearch

TOKEN = "sdk-memory-token"
ODD_KEYS = ["a/b", ".", "..", "100% sure?", "#hash"]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    server = serve(short_dir("tfmk-"), token=TOKEN)
    store = MemoryStore.open(f"sqlite:///{server.data_dir / 'tiffany.db'}")
    try:
        store.put("notes", "paris", "Paris is the capital of France", op="s/paris")
        store.put("notes", "berlin", "Berlin is the capital of Germany", op="s/berlin")
        store.put("notes", "rome", "Rome is the capital of Italy", op="s/rome")
        for i, key in enumerate(ODD_KEYS):
            store.put("odd", key, {"i": i}, f"odd key number {i}", op=f"s/odd{i}")
        store.link(("notes", "paris"), "rival_of", ("notes", "berlin"), op="s/l1")
    finally:
        store.close()
    yield server
    server.stop()


def test_namespaces_items_search_and_an_item_as_models(served: Served) -> None:
    with Client(served.url, TOKEN) as client:
        spaces = client.memory_namespaces()
        assert isinstance(spaces, MemoryNamespaces)
        counts = {n.namespace: n.items for n in spaces.namespaces}
        assert counts == {"notes": 3, "odd": len(ODD_KEYS)}

        first = client.memory_items("notes", limit=2)
        assert [i.key for i in first.items] == ["berlin", "paris"]
        assert first.next == "paris"
        rest = client.memory_items("notes", after=first.next, limit=2)
        assert [i.key for i in rest.items] == ["rome"]
        assert rest.next is None

        found = client.memory_search("notes", "capital of France", k=2)
        assert isinstance(found, MemorySearch)
        assert found.items[0].key == "paris"
        assert len(found.items) <= 2
        assert found.items[0].score >= found.items[-1].score
        assert found.embedder is not None
        assert found.embedder.kind

        paris = client.memory_get("notes", "paris")
        assert isinstance(paris, MemoryItemDetail)
        assert paris.value == "Paris is the capital of France"
        assert [h.version for h in paris.history] == [1]
        assert [(n.key, n.relation, n.direction) for n in paris.neighbors] == [
            ("berlin", "rival_of", "out")
        ]
        assert paris.links[0].object.key == "berlin"


def test_odd_keys_are_one_path_segment_each(served: Served) -> None:
    with Client(served.url, TOKEN) as client:
        for i, key in enumerate(ODD_KEYS):
            item = client.memory_get("odd", key)
            assert (item.key, item.value) == (key, {"i": i})


def test_refusals_are_typed_and_name_the_field(served: Served) -> None:
    with Client(served.url, TOKEN) as client:
        with pytest.raises(NotFound) as missing:
            client.memory_get("notes", "atlantis")
        assert "atlantis" in missing.value.message
        with pytest.raises(InvalidRequest) as bad_k:
            client.memory_search("notes", "x", k=0)
        assert [e.path for e in bad_k.value.errors] == ["query.k"]
        with pytest.raises(InvalidRequest) as bad_ns:
            client.memory_items("no spaces")
        assert [e.path for e in bad_ns.value.errors] == ["path.namespace"]
        with pytest.raises(InvalidRequest) as empty:
            client.memory_search("notes", "   ")
        assert [e.path for e in empty.value.errors] == ["query.q"]


def test_a_delete_is_exactly_once_under_its_key(served: Served) -> None:
    with Client(served.url, TOKEN) as client:
        first = client.memory_delete("notes", "rome", idempotency_key="rm-rome")
        assert first.deleted is True
        assert first.op == "api:rm-rome"
        again = client.memory_delete("notes", "rome", idempotency_key="rm-rome")
        assert again == first
        with pytest.raises(NotFound):
            client.memory_get("notes", "rome")
        with pytest.raises(NotFound):
            client.memory_delete("notes", "rome")  # a new key: nothing left to delete


def test_the_async_client_has_the_same_methods(served: Served) -> None:
    async def main() -> tuple[list[str], str, bool]:
        async with AsyncClient(served.url, TOKEN) as client:
            spaces = await client.memory_namespaces()
            page = await client.memory_items("odd", limit=100)
            hits = await client.memory_search("notes", "capital of Germany", k=1)
            item = await client.memory_get("odd", "a/b", depth=2)
            gone = await client.memory_delete("odd", "#hash")
            assert item.key == "a/b"
            assert len(page.items) == len(ODD_KEYS)
            return [n.namespace for n in spaces.namespaces], hits.items[0].key, gone.deleted

    names, best, deleted = asyncio.run(main())
    assert "odd" in names
    assert best == "berlin"
    assert deleted is True
