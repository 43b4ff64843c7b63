"""``/api/memory`` over real loopback: the app under uvicorn, the memory in a real SQLite file.

The memory is written as a run's steps write it, through a
:class:`~tiffany.memory.MemoryStore` of the test's own on the store's
database (migrated as the engine migrates it); the API reads the same file
through its own store. Hostile inputs are refused 422 naming the field
(path ``namespace`` and ``key``, query ``q``, ``k``, ``mode``, ``limit``),
an unknown item is a 404 naming it, a DELETE is exactly once under its
Idempotency-Key, and every route wants the token.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from api_support import LiveApi, make_settings, serve_in_thread, short_dir

from tiffany.memory import MemoryStore
from tiffany.store.migrate import upgrade_url

TOKEN = "memory-api-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

FACTS = {
    "paris": "Paris is the capital of France and sits on the Seine",
    "berlin": "Berlin is the capital of Germany on the Spree",
    "seine": "The Seine is a river that flows through Paris to the sea",
    "tea": "Alice prefers green tea in the morning",
    "a/b c": "a key with a slash and a space inside",
}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[httpx.Client, MemoryStore, LiveApi]]:
    data_dir = short_dir("tfm-")
    settings = make_settings(data_dir, api_token=TOKEN)
    upgrade_url(settings.database_url)  # as the engine does at its start
    store = MemoryStore.open(settings.database_url)
    for i, (key, text) in enumerate(FACTS.items()):
        store.put("facts", key, {"text": text, "n": i}, text, op=f"seed/{key}")
    store.put("users.alice", "prefs", {"drink": "tea"}, op="seed/prefs")
    store.link(("facts", "paris"), "on_river", ("facts", "seine"), op="seed/l1")
    store.link(("users.alice", "prefs"), "mentions", ("facts", "tea"), op="seed/l2")
    store.put(
        "facts", "paris", {"text": FACTS["paris"], "n": 0, "v": 2}, FACTS["paris"], op="seed/p2"
    )
    live = serve_in_thread(settings)
    client = httpx.Client(base_url=live.base, headers=AUTH, timeout=30)
    try:
        yield client, store, live
    finally:
        client.close()
        live.stop()
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def _item(ns: str, key: str) -> str:
    return f"/api/memory/{ns}/{quote(key, safe='')}"


def _field_of(r: httpx.Response) -> list[Any]:
    assert r.status_code == 422, (r.status_code, r.text)
    body = r.json()
    assert body["code"]
    assert body["message"]
    return list(body["detail"][0]["loc"])


def test_namespaces_and_a_namespace_paged_by_key(served) -> None:
    client, _, _ = served
    r = client.get("/api/memory")
    assert r.status_code == 200, r.text
    spaces = {n["namespace"]: n for n in r.json()["namespaces"]}
    assert spaces["facts"]["items"] == len(FACTS)
    assert spaces["users.alice"]["items"] == 1
    assert spaces["facts"]["bytes"] > 0

    keys: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if after:
            params["after"] = after
        page = client.get("/api/memory/facts", params=params).json()
        pages += 1
        assert len(page["items"]) <= 2
        keys += [i["key"] for i in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert keys == sorted(FACTS)
    assert pages == 3
    # A namespace that holds nothing is an empty page, not an error.
    assert client.get("/api/memory/nothing.here").json() == {"items": [], "next": None}


def test_search_answers_best_first_with_how_it_searched(served) -> None:
    client, store, _ = served
    r = client.get("/api/memory/facts/search", params={"q": "capital of France", "k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["items"][0]["key"] == "paris"
    scores = [i["score"] for i in body["items"]]
    assert scores == sorted(scores, reverse=True)
    assert len(body["items"]) <= 3
    assert body["mode"] == "hybrid"
    assert body["embedder"]["dims"] > 0
    assert body["embedder"]["kind"]
    assert isinstance(body["as_of"], int)
    assert body["items"][0]["value"]["v"] == 2  # the item as it is now
    for mode in ("text", "vector"):
        hits = client.get("/api/memory/facts/search", params={"q": "river Seine", "mode": mode})
        assert hits.status_code == 200, hits.text
        assert hits.json()["mode"] == mode
        assert hits.json()["items"], mode
    # What another process writes after the API opened its store is found.
    store.put("facts", "lyon", "Lyon stands where the Rhone meets the Saone", op="late/lyon")
    late = client.get("/api/memory/facts/search", params={"q": "Rhone Saone", "k": 1}).json()
    assert [i["key"] for i in late["items"]] == ["lyon"]
    assert late["as_of"] >= body["as_of"]
    store.delete("facts", "lyon", op="late/lyon-rm")


def test_an_item_with_its_links_versions_and_neighbours(served) -> None:
    client, _, _ = served
    r = client.get(_item("facts", "paris"))
    assert r.status_code == 200, r.text
    item = r.json()
    assert item["namespace"] == "facts"
    assert item["key"] == "paris"
    assert item["version"] == 2
    assert [v["version"] for v in item["history"]] == [1, 2]
    assert item["history"][0]["op"] == "seed/paris"
    assert [(lk["relation"], lk["object"]["key"]) for lk in item["links"]] == [
        ("on_river", "seine")
    ]
    near = {(n["namespace"], n["key"]): n for n in item["neighbors"]}
    assert near[("facts", "seine")]["direction"] == "out"
    assert near[("facts", "seine")]["relation"] == "on_river"
    # Links are followed against their direction too, and across namespaces.
    tea = client.get(_item("facts", "tea")).json()
    assert [(n["namespace"], n["key"], n["direction"]) for n in tea["neighbors"]] == [
        ("users.alice", "prefs", "in")
    ]
    # A key is the rest of the path: a slash and a space in it are the key's.
    odd = client.get(_item("facts", "a/b c"))
    assert odd.status_code == 200, odd.text
    assert odd.json()["key"] == "a/b c"


def test_an_unknown_item_is_a_404_naming_it(served) -> None:
    client, _, _ = served
    r = client.get(_item("facts", "atlantis"))
    assert r.status_code == 404, r.text
    body = r.json()
    assert body["code"] == "memory.not_found"
    assert "atlantis" in body["message"]
    assert "facts" in body["message"]
    assert body["detail"] == {"namespace": "facts", "key": "atlantis"}
    assert body["field"] == "key"


@pytest.mark.parametrize(
    ("path", "params", "loc"),
    [
        ("/api/memory/-dash", {}, ["path", "namespace"]),
        ("/api/memory/a%20b", {}, ["path", "namespace"]),
        ("/api/memory/" + "n" * 129, {}, ["path", "namespace"]),
        ("/api/memory/x%24y/search", {"q": "x"}, ["path", "namespace"]),
        ("/api/memory/facts/%01bell", {}, ["path", "key"]),
        ("/api/memory/facts/%20lead", {}, ["path", "key"]),
        ("/api/memory/facts/trail%20", {}, ["path", "key"]),
        ("/api/memory/facts/" + "k" * 257, {}, ["path", "key"]),
        ("/api/memory/facts/zero%E2%80%8Bwidth", {}, ["path", "key"]),  # U+200B: not printable
        ("/api/memory/facts/search", {}, ["query", "q"]),
        ("/api/memory/facts/search", {"q": ""}, ["query", "q"]),
        ("/api/memory/facts/search", {"q": "   "}, ["query", "q"]),
        ("/api/memory/facts/search", {"q": "\x1c\x1d"}, ["query", "q"]),
        ("/api/memory/facts/search", {"q": "x" * 1001}, ["query", "q"]),
        ("/api/memory/facts/search", {"q": "x", "k": 0}, ["query", "k"]),
        ("/api/memory/facts/search", {"q": "x", "k": 101}, ["query", "k"]),
        ("/api/memory/facts/search", {"q": "x", "k": "ten"}, ["query", "k"]),
        ("/api/memory/facts/search", {"q": "x", "mode": "psychic"}, ["query", "mode"]),
        ("/api/memory/facts", {"limit": 0}, ["query", "limit"]),
        ("/api/memory/facts", {"limit": 100_000}, ["query", "limit"]),
        ("/api/memory/facts/paris", {"depth": 4}, ["query", "depth"]),
    ],
)
def test_hostile_inputs_are_refused_naming_the_field(
    served, path: str, params: dict[str, Any], loc: list[str]
) -> None:
    client, _, _ = served
    assert _field_of(client.get(path, params=params)) == loc


def test_a_delete_is_done_once_under_its_idempotency_key(served) -> None:
    client, store, _ = served
    store.put("scratch", "gone", {"x": 1}, op="seed/gone")
    store.put("scratch", "other", {"x": 2}, op="seed/other")
    key = {"Idempotency-Key": "rm-gone-1"}
    first = client.delete(_item("scratch", "gone"), headers=key)
    assert first.status_code == 200, first.text
    assert first.json()["deleted"] is True
    assert first.json()["op"] == "api:rm-gone-1"
    # The same request again (a client's retry): the first answer, nothing more done.
    again = client.delete(_item("scratch", "gone"), headers=key)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert client.get(_item("scratch", "gone")).status_code == 404
    assert store.get("scratch", "gone") is None
    assert store.get("scratch", "other") is not None
    # The key reused for another item: refused, nothing deleted.
    reused = client.delete(_item("scratch", "other"), headers=key)
    assert reused.status_code == 409, reused.text
    assert reused.json()["code"] == "memory.idempotency_key_reused"
    assert store.get("scratch", "other") is not None
    # Without a key, deleting what is not there is a 404 naming it.
    missing = client.delete(_item("scratch", "gone"))
    assert missing.status_code == 404, missing.text
    assert "gone" in missing.json()["message"]
    # A bad key is refused before anything is written.
    assert _field_of(client.delete("/api/memory/scratch/%20x")) == ["path", "key"]


def test_every_memory_route_wants_the_token(served) -> None:
    _, _, live = served
    for method, path in [
        ("GET", "/api/memory"),
        ("GET", "/api/memory/facts"),
        ("GET", "/api/memory/facts/search?q=paris"),
        ("GET", "/api/memory/facts/paris"),
        ("DELETE", "/api/memory/facts/paris"),
    ]:
        r = httpx.request(method, f"{live.base}{path}", timeout=30)
        assert r.status_code == 401, (method, path, r.text)
    doc = httpx.get(f"{live.base}/openapi.json", headers=AUTH, timeout=30).json()
    search = {
        p["name"]: p for p in doc["paths"]["/api/memory/{namespace}/search"]["get"]["parameters"]
    }
    assert search["k"]["schema"]["maximum"] == 100
    assert search["k"]["schema"]["minimum"] == 1
    assert search["q"]["required"] is True
    assert doc["paths"]["/api/memory/{namespace}/{key}"]["delete"]["security"] == [
        {"bearerAuth": []}
    ]


def test_search_is_the_search_routes_not_a_key(served) -> None:
    client, _, _ = served
    refused = client.delete("/api/memory/facts/search")
    assert refused.status_code == 405, refused.text
    assert refused.headers["allow"] == "GET"
    # A key that ends in /search is a key like any other.
    assert client.get(_item("facts", "a/search")).status_code == 404


def test_the_routes_read_a_postgresql_store_alike(pg_migrated_url: str) -> None:
    """The same routes on a PostgreSQL store (tsvector search, vectors in the rows)."""
    data_dir = short_dir("tfmp-")
    settings = make_settings(data_dir, database_url=pg_migrated_url, api_token=TOKEN)
    store = MemoryStore.open(pg_migrated_url)
    live = serve_in_thread(settings)
    try:
        for key, text in FACTS.items():
            store.put("facts", key, {"text": text}, text, op=f"pg/{key}")
        store.link(("facts", "paris"), "on_river", ("facts", "seine"), op="pg/l1")
        with httpx.Client(base_url=live.base, headers=AUTH, timeout=30) as client:
            spaces = client.get("/api/memory").json()["namespaces"]
            assert [(n["namespace"], n["items"]) for n in spaces] == [("facts", len(FACTS))]
            page = client.get("/api/memory/facts", params={"limit": 2}).json()
            assert [i["key"] for i in page["items"]] == sorted(FACTS)[:2]
            hits = client.get("/api/memory/facts/search", params={"q": "capital of France"})
            assert hits.status_code == 200, hits.text
            assert hits.json()["items"][0]["key"] == "paris"
            paris = client.get(_item("facts", "paris")).json()
            assert [n["key"] for n in paris["neighbors"]] == ["seine"]
            assert client.get(_item("facts", "atlantis")).status_code == 404
            assert _field_of(client.get("/api/memory/facts/%20x")) == ["path", "key"]
            gone = client.delete(_item("facts", "a/b c"), headers={"Idempotency-Key": "pg-rm"})
            assert gone.status_code == 200, gone.text
            again = client.delete(_item("facts", "a/b c"), headers={"Idempotency-Key": "pg-rm"})
            assert again.json() == gone.json()
            assert store.get("facts", "a/b c") is None
    finally:
        live.stop()
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_an_items_page_holds_its_newest_versions_and_counts_them_all(served) -> None:
    client, store, _ = served
    for n in range(1, 106):
        store.put("busy", "counter", {"n": n}, op=f"busy/{n}")
    item = client.get(_item("busy", "counter")).json()
    assert item["version"] == 105
    assert item["versions"] == 105
    assert [v["version"] for v in item["history"]] == list(range(6, 106))
    assert item["link_count"] == 0
