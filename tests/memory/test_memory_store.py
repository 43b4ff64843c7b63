"""The MemoryStore on SQLite: writes exactly once, reads, search, links, TTL, bounds, kill -9."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memory_cases import BAD_CALLS, CORPUS, NS, WRITER, NoModel, call, count
from sqlalchemy import Engine, select

from tiffany.kernel.clock import ManualClock
from tiffany.memory import (
    HashingEmbedder,
    MemoryFull,
    MemoryInvalid,
    MemoryNotFound,
    MemoryStore,
    decode_vector,
)
from tiffany.memory.store import derived_key
from tiffany.memory.tables import mem_applied, mem_item_versions, mem_items
from tiffany.store.migrate import upgrade
from tiffany.store.session import make_engine


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'tiffany.db'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(epoch=1_800_000_000.0, autojump=False)


@pytest.fixture
def store(engine: Engine, clock: ManualClock) -> Iterator[MemoryStore]:
    s = MemoryStore(engine, embedder=HashingEmbedder(), clock=clock)
    yield s
    s.close()


# -- Writes and reads -----------------------------------------------------------


def test_put_then_get_answers_the_item(store: MemoryStore) -> None:
    result = store.put(NS, "pref", {"drink": "tea"}, op="run-1/s1/0", run_id="run-1", step_id="s1")
    assert result["created"] is True
    assert result["version"] == 1
    assert result["key"] == "pref"
    assert result["embedder"] == {
        "id": "hashing-blake2b-v1-256",
        "dims": 256,
        "kind": "offline feature hashing",
    }
    assert result["store_seq"] >= 1
    vec = decode_vector(result["vector"])
    assert vec.shape == (256,)
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-5
    item = store.get(NS, "pref")
    assert item == {
        "namespace": NS,
        "key": "pref",
        "value": {"drink": "tea"},
        "text": "tea",
        "version": 1,
        "created_at": "2027-01-15T08:00:00.000000Z",
        "updated_at": "2027-01-15T08:00:00.000000Z",
        "run_id": "run-1",
        "step_id": "s1",
        "expires_at": None,
    }
    assert store.get(NS, "other") is None
    assert store.get("users.bob", "pref") is None


def test_an_update_is_the_next_version_and_history_keeps_each(
    store: MemoryStore, clock: ManualClock
) -> None:
    store.put(NS, "pref", "likes tea", op="a")
    clock.advance(5)
    second = store.put(NS, "pref", "likes coffee now", op="b")
    assert second["created"] is False
    assert second["version"] == 2
    item = store.get(NS, "pref")
    assert item is not None
    assert item["value"] == "likes coffee now"
    assert item["created_at"] == "2027-01-15T08:00:00.000000Z"
    assert item["updated_at"] == "2027-01-15T08:00:05.000000Z"
    history = store.history(NS, "pref")
    assert [(h["version"], h["value"], h["op"], h["deleted"]) for h in history] == [
        (1, "likes tea", "a", False),
        (2, "likes coffee now", "b", False),
    ]


def test_a_put_without_key_derives_it_from_its_op(store: MemoryStore) -> None:
    first = store.put(NS, None, "a fact", op="run-9/s2/0")
    assert first["key"] == derived_key("run-9/s2/0")
    again = store.put(NS, None, "a fact", op="run-9/s2/0")
    assert again == first
    other = store.put(NS, None, "a fact", op="run-9/s2/1")
    assert other["key"] != first["key"]


def test_a_reapplied_op_is_a_no_op_that_answers_the_first_result(
    store: MemoryStore, engine: Engine, clock: ManualClock
) -> None:
    first = store.put(NS, "k", {"n": 1}, op="run-1/s/0")
    clock.advance(60)
    again = store.put(NS, "k", {"n": 1}, op="run-1/s/0")
    assert again == first
    assert store.applied("run-1/s/0") == first
    assert count(engine, mem_item_versions) == 1
    deleted = store.delete(NS, "k", op="run-1/s/1")
    assert store.delete(NS, "k", op="run-1/s/1") == deleted
    assert deleted["deleted"] is True
    assert store.applied("nope") is None


def test_an_op_used_for_another_write_is_refused(store: MemoryStore, engine: Engine) -> None:
    store.put(NS, "k", {"n": 1}, op="run-1/s/0")
    with pytest.raises(MemoryInvalid) as refused:
        store.put(NS, "k", {"n": 2}, op="run-1/s/0")
    assert refused.value.field == "op"
    assert refused.value.code == "memory.invalid"
    with pytest.raises(MemoryInvalid) as refused:
        store.delete(NS, "k", op="run-1/s/0")
    assert refused.value.field == "op"
    item = store.get(NS, "k")
    assert item is not None
    assert item["value"] == {"n": 1}
    assert count(engine, mem_item_versions) == 1


def test_delete_removes_the_item_keeps_its_history_and_a_put_comes_back(
    store: MemoryStore,
) -> None:
    store.put(NS, "k", "one", op="p1")
    assert store.delete(NS, "k", op="d1")["deleted"] is True
    assert store.get(NS, "k") is None
    assert store.delete(NS, "k", op="d2")["deleted"] is False
    back = store.put(NS, "k", "two", op="p2")
    assert back["created"] is True
    assert back["version"] == 3
    assert [(h["version"], h["deleted"]) for h in store.history(NS, "k")] == [
        (1, False),
        (2, True),
        (3, False),
    ]
    assert store.search(NS, "one", mode="text")["items"] == []


def test_namespaces_and_items_pages(store: MemoryStore) -> None:
    for i in range(5):
        store.put(NS, f"k{i}", f"fact {i}", op=f"p{i}")
    store.put("users.bob", "x", "bob's fact", op="pb")
    spaces = store.namespaces()
    assert [(s["namespace"], s["items"]) for s in spaces] == [("users.alice", 5), ("users.bob", 1)]
    assert all(s["bytes"] > 0 for s in spaces)
    page = store.items(NS, limit=2)
    assert [i["key"] for i in page["items"]] == ["k0", "k1"]
    assert page["next"] == "k1"
    page = store.items(NS, after=page["next"], limit=2)
    assert [i["key"] for i in page["items"]] == ["k2", "k3"]
    page = store.items(NS, after=page["next"], limit=2)
    assert [i["key"] for i in page["items"]] == ["k4"]
    assert page["next"] is None


# -- Links ------------------------------------------------------------------------


def test_links_and_neighbors_two_deep(store: MemoryStore) -> None:
    for key in ("alice", "bob", "carol", "dave", "tea"):
        store.put("people", key, {"name": key}, op=f"p-{key}")
    made = store.link(
        ("people", "alice"), "knows", ("people", "bob"), op="l1", props={"since": 2020}
    )
    assert made["created"] is True
    assert (
        store.link(("people", "alice"), "knows", ("people", "bob"), op="l1", props={"since": 2020})
        == made
    )
    store.link(("people", "bob"), "knows", ("people", "carol"), op="l2")
    store.link(("people", "carol"), "knows", ("people", "dave"), op="l3")
    store.link(("people", "alice"), "likes", ("people", "tea"), op="l4")

    one = store.neighbors("people", "alice")["items"]
    assert [(i["key"], i["relation"], i["direction"], i["depth"]) for i in one] == [
        ("bob", "knows", "out", 1),
        ("tea", "likes", "out", 1),
    ]
    assert one[0]["value"] == {"name": "bob"}
    two = store.neighbors("people", "alice", depth=2)["items"]
    assert [(i["key"], i["depth"]) for i in two] == [("bob", 1), ("tea", 1), ("carol", 2)]
    back = store.neighbors("people", "carol", relation="knows")["items"]
    assert [(i["key"], i["direction"]) for i in back] == [("dave", "out"), ("bob", "in")]
    assert [i["key"] for i in store.neighbors("people", "alice", depth=3, limit=2)["items"]] == [
        "bob",
        "tea",
    ]
    links = store.links("people", "bob")
    assert [(lk["subject"]["key"], lk["relation"], lk["object"]["key"]) for lk in links] == [
        ("alice", "knows", "bob"),
        ("bob", "knows", "carol"),
    ]
    assert links[0]["props"] == {"since": 2020}
    assert links[0]["op"] == "l1"
    # A deleted item's links go with it.
    store.delete("people", "bob", op="d-bob")
    assert [i["key"] for i in store.neighbors("people", "alice", depth=3)["items"]] == ["tea"]
    assert store.neighbors("people", "nobody")["items"] == []


def test_a_link_to_a_missing_item_is_refused(store: MemoryStore) -> None:
    store.put("people", "alice", "a", op="p1")
    with pytest.raises(MemoryNotFound) as refused:
        store.link(("people", "alice"), "knows", ("people", "ghost"), op="l1")
    assert refused.value.field == "object"
    assert refused.value.code == "memory.not_found"
    assert store.applied("l1") is None


# -- Search -----------------------------------------------------------------------


@pytest.fixture
def corpus(store: MemoryStore) -> MemoryStore:
    for key, body in CORPUS.items():
        store.put("notes", key, {"body": body}, op=f"c-{key}")
    return store


def test_text_search_finds_a_needle_term(corpus: MemoryStore) -> None:
    found = corpus.search("notes", "zanzibar", k=3, mode="text")
    assert [i["key"] for i in found["items"]] == ["needle"]
    assert found["mode"] == "text"
    assert found["items"][0]["score"] > 0
    assert found["as_of"] == len(CORPUS)


def test_vector_search_ranks_by_similarity(corpus: MemoryStore) -> None:
    found = corpus.search("notes", "green tea in the morning", k=3, mode="vector")
    keys = [i["key"] for i in found["items"]]
    assert keys[0] == "tea"
    assert len(keys) == 3
    scores = [i["score"] for i in found["items"]]
    assert scores == sorted(scores, reverse=True)
    assert found["embedder"]["kind"] == "offline feature hashing"


def test_hybrid_search_fuses_both_and_is_deterministic(corpus: MemoryStore) -> None:
    found = corpus.search("notes", "who drinks coffee in the morning", k=4)
    keys = [i["key"] for i in found["items"]]
    assert keys[0] == "coffee"
    assert "tea" in keys[:3]
    # RRF scores are sums of 1/(60 + rank): the best possible is 2/61.
    assert found["items"][0]["score"] <= round(2 / 61, 6)
    assert corpus.search("notes", "who drinks coffee in the morning", k=4) == found
    needle = corpus.search("notes", "zanzibar", k=2)
    assert needle["items"][0]["key"] == "needle"


def test_hybrid_is_the_fusion_of_both_legs_run_at_once(corpus: MemoryStore) -> None:
    """A hybrid search runs its vector product on a helper thread beside its text ranking.

    Its answer is the RRF of the two single-mode rankings, also right after a
    write (the vectors are brought up to the write on the caller's connection
    before the helper runs) and from several threads at once.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tiffany.memory.search import candidates, rrf

    def fused(query: str, k: int) -> list[str]:
        wide = candidates(k)
        text = [i["key"] for i in corpus.search("notes", query, k=wide, mode="text")["items"]]
        vec = [i["key"] for i in corpus.search("notes", query, k=wide, mode="vector")["items"]]
        return [key for key, _ in rrf((text, vec), k)]

    queries = ["who drinks coffee in the morning", "zanzibar", "green tea", "river city"]
    for round_no in range(3):
        corpus.put("notes", f"late-{round_no}", f"coffee in zanzibar {round_no}", op=f"l{round_no}")
        for query in queries:
            got = [i["key"] for i in corpus.search("notes", query, k=4)["items"]]
            assert got == fused(query, 4), (round_no, query)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda q: corpus.search("notes", q, k=4), queries * 8))
    for query, answer in zip(queries * 8, answers, strict=True):
        assert [i["key"] for i in answer["items"]] == fused(query, 4), query


def test_hybrid_with_a_shared_product_answers_as_with_one_thread(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The product cut in pieces that the search's own thread helps with: the same answers."""
    from concurrent.futures import ThreadPoolExecutor

    from tiffany.memory import search

    words = ["tea", "coffee", "river", "city", "garden", "train", "cat", "code", "noon", "herbs"]
    for i in range(300):
        body = " ".join(words[(i * j) % len(words)] for j in range(1, 6)) + f" item{i}"
        store.put("many", f"k{i:03d}", body, op=f"many-{i}")
    queries = ["tea river", "coffee city item7", "garden train cat", "item42 code", "noon"]
    whole = [store.search("many", q, k=10) for q in queries]
    monkeypatch.setattr(search, "SPLIT_ROWS", 128)  # 300 rows: 5 pieces of 64
    monkeypatch.setattr(search, "PIECE_ROWS", 64)
    assert [store.search("many", q, k=10) for q in queries] == whole
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda q: store.search("many", q, k=10), queries * 6)) == whole * 6


def test_search_sees_updates_and_deletes(corpus: MemoryStore) -> None:
    assert corpus.search("notes", "zanzibar", k=1, mode="vector")["items"][0]["key"] == "needle"
    corpus.put("notes", "trains", "the zanzibar express leaves at noon", op="u1")
    corpus.delete("notes", "needle", op="d1")
    for mode in ("text", "vector", "hybrid"):
        keys = [i["key"] for i in corpus.search("notes", "zanzibar", k=2, mode=mode)["items"]]
        assert keys[0] == "trains", mode
        assert "needle" not in keys, mode
    corpus.put("notes", "new", "zanzibar zanzibar zanzibar", op="u2")
    keys = [i["key"] for i in corpus.search("notes", "zanzibar", k=6, mode="vector")["items"]]
    assert keys[0] == "new"
    assert len(keys) == len(CORPUS)  # 6 - deleted + new


def test_search_of_an_empty_namespace_answers_nothing(store: MemoryStore) -> None:
    found = store.search("empty", "anything")
    assert found["items"] == []
    assert found["as_of"] == 0


# -- TTL and limits -----------------------------------------------------------------


def test_expired_items_are_invisible_and_swept(
    store: MemoryStore, clock: ManualClock, engine: Engine
) -> None:
    store.put(NS, "short", "a short lived zanzibar fact", op="p1", ttl_s=10)
    store.put(NS, "long", "a lasting zanzibar fact", op="p2")
    item = store.get(NS, "short")
    assert item is not None
    assert item["expires_at"] == "2027-01-15T08:00:10.000000Z"
    clock.advance(11)
    assert store.get(NS, "short") is None
    for mode in ("text", "vector", "hybrid"):
        keys = [i["key"] for i in store.search(NS, "zanzibar", mode=mode)["items"]]
        assert keys == ["long"], mode
    assert [i["key"] for i in store.items(NS)["items"]] == ["long"]
    assert store.namespaces()[0]["items"] == 1
    assert count(engine, mem_items) == 2  # invisible, not yet swept
    store.put(NS, "other", "x", op="p3")  # a write of the namespace sweeps it
    assert count(engine, mem_items) == 2
    assert store.get(NS, "short") is None
    # its key can be written again, as a new item
    assert store.put(NS, "short", "again", op="p4")["created"] is True


def test_a_full_namespace_refuses_a_new_key(engine: Engine, clock: ManualClock) -> None:
    store = MemoryStore(engine, clock=clock, max_items=3)
    for i in range(3):
        store.put(NS, f"k{i}", i, op=f"p{i}")
    with pytest.raises(MemoryFull) as full:
        store.put(NS, "k3", 3, op="p3")
    assert full.value.code == "memory.full"
    assert full.value.detail == {
        "namespace": NS,
        "limit": 3,
        "setting": "TIFFANY_MEMORY_MAX_ITEMS",
    }
    assert store.applied("p3") is None  # not applied: a retry may pass later
    store.put(NS, "k0", "an update is no new item", op="p4")
    store.put("elsewhere", "k3", 3, op="p5")
    store.delete(NS, "k1", op="d1")
    assert store.put(NS, "k3", 3, op="p3")["created"] is True


@pytest.mark.parametrize(("field", "method", "args"), BAD_CALLS)
def test_every_bound_is_refused_naming_its_field(
    store: MemoryStore, engine: Engine, field: str, method: str, args: dict[str, Any]
) -> None:
    with pytest.raises(MemoryInvalid) as refused:
        call(store, method, args)
    assert refused.value.field == field
    assert refused.value.to_dict()["field"] == field
    assert count(engine, mem_applied) == 0
    assert count(engine, mem_items) == 0


def test_values_at_their_bounds_are_taken(store: MemoryStore) -> None:
    big = "x" * (64 * 1024 - 2)  # its JSON is the two quotes more: exactly 64 KiB
    store.put("a" * 128, "k" * 256, big, "t" * (32 * 1024), op="o" * 512, ttl_s=1)
    item = store.get("a" * 128, "k" * 256)
    assert item is not None
    assert item["value"] == big
    store.put(NS, "derived", {"body": "y" * (40 * 1024)}, op="derived")
    derived = store.get(NS, "derived")
    assert derived is not None
    assert len(derived["text"].encode()) == 32 * 1024  # derived text is cut, not refused


# -- Rebuild from results ---------------------------------------------------------------


def test_apply_rebuilds_from_results_without_the_model(
    store: MemoryStore, tmp_path: Path, clock: ManualClock
) -> None:
    results = [
        store.put("people", "alice", {"likes": "tea"}, op="r/1", ttl_s=3600, run_id="r"),
        store.put("people", "bob", "bob likes coffee", op="r/2"),
        store.link(("people", "alice"), "knows", ("people", "bob"), op="r/3", props={"w": 1}),
        store.put("people", None, "temporary", op="r/4"),
        store.delete("people", derived_key("r/4"), op="r/5"),
    ]
    other_url = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    other_engine = make_engine(other_url)
    upgrade(other_engine)
    rebuilt = MemoryStore(other_engine, embedder=NoModel(), clock=clock)
    try:
        for result in results:
            rebuilt.apply(result)
        for result in results:  # idempotent on each op
            assert rebuilt.apply(result) == rebuilt.applied(result["op"])
        assert rebuilt.get("people", "alice") == store.get("people", "alice")
        assert rebuilt.get("people", "bob") == store.get("people", "bob")
        assert rebuilt.links("people", "alice") == store.links("people", "alice")
        assert rebuilt.history("people", derived_key("r/4")) == store.history(
            "people", derived_key("r/4")
        )
        alice = store.applied("r/1")
        assert alice is not None
        assert rebuilt.applied("r/1")["vector"] == alice["vector"]  # type: ignore[index]
    finally:
        rebuilt.close()
        other_engine.dispose()


# -- Concurrency, crashes ----------------------------------------------------------------


def test_a_write_waits_for_another_writer_of_the_file(store: MemoryStore, db_url: str) -> None:
    """A writer holding the file's lock (as the projector may) delays a put; it never fails it."""
    path = db_url.removeprefix("sqlite:///")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE busy_marker (x)")
    done = threading.Event()
    outcome: list[Any] = []

    def put() -> None:
        try:
            outcome.append(store.put(NS, "k", "written while locked", op="busy-1"))
        except Exception as exc:  # asserted below
            outcome.append(exc)
        done.set()

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    assert not done.wait(0.3)  # held by the lock (a bounded wait: no claim on timing)
    other.execute("COMMIT")
    other.close()
    assert done.wait(30)
    assert isinstance(outcome[0], dict), outcome
    assert outcome[0]["created"] is True


def test_two_processes_write_one_file(store: MemoryStore, db_url: str, engine: Engine) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, db_url, "child", "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    for i in range(60):
        store.put("crash", None, f"fact number {i} from parent", op=f"parent/{i}")
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    assert out.split() == [str(i) for i in range(60)]
    assert count(engine, mem_items) == 120
    assert count(engine, mem_applied) == 120
    with engine.connect() as conn:
        seqs = conn.execute(select(mem_item_versions.c.store_seq)).scalars().all()
    assert sorted(seqs) == list(range(1, 121))  # one counter, no gaps, no repeats


def test_kill_9_mid_puts_then_rerun_applies_each_op_once(
    db_url: str, engine: Engine, store: MemoryStore
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, db_url, "run-1/step", "200"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if int(line) >= 60:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    assert child.returncode == -signal.SIGKILL
    landed = count(engine, mem_applied)
    assert 61 <= landed < 200
    # The re-run: every put again, in a process of its own.
    rerun = subprocess.run(
        [sys.executable, "-c", WRITER, db_url, "run-1/step", "200"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert rerun.stdout.split() == [str(i) for i in range(200)]
    assert count(engine, mem_applied) == 200
    assert count(engine, mem_items) == 200
    assert count(engine, mem_item_versions) == 200  # each op applied once: version 1 each
    with engine.connect() as conn:
        versions = conn.execute(select(mem_items.c.version).distinct()).scalars().all()
    assert versions == [1]
    found = store.search("crash", "fact number 199", k=1, mode="text")
    assert found["items"][0]["value"] == "fact number 199 from run-1/step"


def test_threads_writing_one_store(store: MemoryStore, engine: Engine) -> None:
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(25):
                store.put("threads", f"t{t}-{i}", f"thread {t} item {i}", op=f"t{t}/{i}")
                store.search("threads", f"thread {t}", k=5)
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert errors == []
    assert store.namespaces()[0]["items"] == 100
    assert len(store.search("threads", "thread item", k=100, mode="vector")["items"]) == 100


def test_a_rebuild_under_another_embedder_keeps_the_journaled_vectors_apart(
    engine: Engine, clock: ManualClock, tmp_path: Path
) -> None:
    """Vectors of different embedders are never compared: a rebuilt item is found by text."""
    small = MemoryStore(engine, embedder=HashingEmbedder(dims=64), clock=clock)
    result = small.put("notes", "k", "the zanzibar express", op="r/1")
    assert result["embedder"]["dims"] == 64
    other = make_engine(f"sqlite:///{tmp_path / 'other.db'}")
    upgrade(other)
    rebuilt = MemoryStore(other, clock=clock)  # 256 dimensions
    try:
        again = rebuilt.apply(result)
        assert again["embedder"] == result["embedder"]
        assert again["vector"] == result["vector"]
        assert [i["key"] for i in rebuilt.search("notes", "zanzibar", mode="text")["items"]] == [
            "k"
        ]
        assert rebuilt.search("notes", "zanzibar", mode="vector")["items"] == []
        assert [i["key"] for i in rebuilt.search("notes", "zanzibar")["items"]] == ["k"]
    finally:
        rebuilt.close()
        other.dispose()


def test_a_store_from_settings(tmp_path: Path) -> None:
    from tiffany.config import Settings

    settings = Settings(
        data_dir=tmp_path / "data", memory_max_items=1, embeddings_dims=32, _env_file=None
    )
    engine = make_engine(settings.database_url)
    upgrade(engine)
    engine.dispose()
    store = MemoryStore.from_settings(settings)
    try:
        assert store.embedder.dims == 32
        store.put(NS, "a", "one", op="s1")
        with pytest.raises(MemoryFull):
            store.put(NS, "b", "two", op="s2")
    finally:
        store.close()


def test_common_words_act_as_stop_words_and_bound_the_scoring(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiffany.memory import fulltext

    monkeypatch.setattr(fulltext, "COMMON_MATCHES", 2)
    monkeypatch.setattr(fulltext, "SCORED_MATCHES", 3)
    for i in range(6):
        store.put("notes", f"k{i}", f"tea note number {i}", op=f"p{i}")
    store.put("notes", "rare", "tea from zanzibar", op="p-rare")
    # "tea" is in 7 items (common), "zanzibar" in 1: the rare word decides.
    found = store.search("notes", "tea zanzibar", k=5, mode="text")["items"]
    assert [i["key"] for i in found] == ["rare"]
    # Common words only: the newest items holding one, newest first, unscored.
    found = store.search("notes", "tea note", k=5, mode="text")["items"]
    assert [(i["key"], i["score"]) for i in found] == [
        ("rare", 0.0),
        ("k5", 0.0),
        ("k4", 0.0),
        ("k3", 0.0),
        ("k2", 0.0),
    ]
    # A word in no item is no word: the others decide.
    found = store.search("notes", "zanzibar nowhere", k=5, mode="text")["items"]
    assert [i["key"] for i in found] == ["rare"]
