"""The MemoryStore on PostgreSQL (tsvector + exact vectors, no pgvector): the core behaviours.

Each test has a fresh schema of the shared test database (``pg_migrated_url``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from memory_cases import BAD_CALLS, CORPUS, NS, WRITER, NoModel, call, count
from sqlalchemy import Engine, select, text

from tiffany.kernel.clock import ManualClock
from tiffany.memory import MemoryFull, MemoryInvalid, MemoryNotFound, MemoryStore
from tiffany.memory.store import derived_key
from tiffany.memory.tables import mem_applied, mem_item_versions, mem_items
from tiffany.store.session import make_engine


@pytest.fixture
def engine(pg_migrated_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_migrated_url)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(epoch=1_800_000_000.0, autojump=False)


@pytest.fixture
def store(engine: Engine, clock: ManualClock) -> Iterator[MemoryStore]:
    # The in-process ranking on PostgreSQL, whether or not the server has
    # pgvector (tests/memory/test_memory_pgvector.py tests that path).
    s = MemoryStore(engine, clock=clock, pgvector="off")
    yield s
    s.close()


def test_the_full_text_index_is_a_tsvector_with_gin(engine: Engine) -> None:
    with engine.connect() as conn:
        kind = conn.execute(
            text(
                "SELECT data_type FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = 'mem_fts'"
                " AND column_name = 'tsv'"
            )
        ).scalar()
        index = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_mem_fts_tsv'")
        ).scalar()
    assert kind == "tsvector"
    assert "gin" in str(index)


def test_put_get_versions_history(store: MemoryStore, clock: ManualClock) -> None:
    first = store.put(NS, "pref", {"drink": "tea"}, op="r/s/0", run_id="r", step_id="s")
    assert (first["created"], first["version"]) == (True, 1)
    clock.advance(5)
    second = store.put(NS, "pref", {"drink": "coffee"}, op="r/s/1")
    assert (second["created"], second["version"]) == (False, 2)
    assert second["store_seq"] == first["store_seq"] + 1
    item = store.get(NS, "pref")
    assert item is not None
    assert item["value"] == {"drink": "coffee"}
    assert item["created_at"] == "2027-01-15T08:00:00.000000Z"
    assert item["updated_at"] == "2027-01-15T08:00:05.000000Z"
    assert [(h["version"], h["value"]) for h in store.history(NS, "pref")] == [
        (1, {"drink": "tea"}),
        (2, {"drink": "coffee"}),
    ]


def test_ops_are_applied_once_and_not_reused(store: MemoryStore, engine: Engine) -> None:
    first = store.put(NS, None, "a fact", op="run-9/s2/0")
    assert first["key"] == derived_key("run-9/s2/0")
    assert store.put(NS, None, "a fact", op="run-9/s2/0") == first
    assert store.applied("run-9/s2/0") == first
    with pytest.raises(MemoryInvalid) as refused:
        store.put(NS, None, "another fact", op="run-9/s2/0")
    assert refused.value.field == "op"
    assert count(engine, mem_item_versions) == 1


def test_one_op_from_many_threads_is_applied_once(store: MemoryStore, engine: Engine) -> None:
    """Concurrent claims of one op: one applies; the others wait on its row, answer its result."""
    barrier = threading.Barrier(6)
    results: list[Any] = []

    def put() -> None:
        barrier.wait()
        try:
            results.append(store.put(NS, "k", "the same write", op="same-op"))
        except Exception as exc:  # asserted below
            results.append(exc)

    threads = [threading.Thread(target=put) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(results) == 6
    assert all(r == results[0] for r in results), results
    assert count(engine, mem_item_versions) == 1
    assert count(engine, mem_applied) == 1


def test_delete_links_neighbors(store: MemoryStore) -> None:
    for key in ("alice", "bob", "carol", "tea"):
        store.put("people", key, {"name": key}, op=f"p-{key}")
    store.link(("people", "alice"), "knows", ("people", "bob"), op="l1", props={"since": 2020})
    store.link(("people", "bob"), "knows", ("people", "carol"), op="l2")
    store.link(("people", "alice"), "likes", ("people", "tea"), op="l3")
    two = store.neighbors("people", "alice", depth=2)["items"]
    assert [(i["key"], i["relation"], i["direction"], i["depth"]) for i in two] == [
        ("bob", "knows", "out", 1),
        ("tea", "likes", "out", 1),
        ("carol", "knows", "out", 2),
    ]
    assert [(i["key"], i["direction"]) for i in store.neighbors("people", "bob")["items"]] == [
        ("carol", "out"),
        ("alice", "in"),
    ]
    with pytest.raises(MemoryNotFound) as refused:
        store.link(("people", "ghost"), "knows", ("people", "bob"), op="l4")
    assert refused.value.field == "subject"
    assert store.delete("people", "bob", op="d1")["deleted"] is True
    assert store.get("people", "bob") is None
    assert [i["key"] for i in store.neighbors("people", "alice", depth=3)["items"]] == ["tea"]
    assert [h["deleted"] for h in store.history("people", "bob")] == [False, True]


@pytest.fixture
def corpus(store: MemoryStore) -> MemoryStore:
    for key, body in CORPUS.items():
        store.put("notes", key, {"body": body}, op=f"c-{key}")
    return store


def test_search_text_vector_hybrid(corpus: MemoryStore) -> None:
    assert [i["key"] for i in corpus.search("notes", "zanzibar", k=3, mode="text")["items"]] == [
        "needle"
    ]
    vector = corpus.search("notes", "green tea in the morning", k=3, mode="vector")
    assert vector["items"][0]["key"] == "tea"
    hybrid = corpus.search("notes", "who drinks coffee in the morning", k=4)
    keys = [i["key"] for i in hybrid["items"]]
    assert keys[0] == "coffee"
    assert "tea" in keys[:3]
    assert hybrid["as_of"] == len(CORPUS)
    assert corpus.search("notes", "who drinks coffee in the morning", k=4) == hybrid
    corpus.delete("notes", "needle", op="d1")
    corpus.put("notes", "trains", "the zanzibar express", op="u1")
    for mode in ("text", "vector", "hybrid"):
        found = [i["key"] for i in corpus.search("notes", "zanzibar", k=2, mode=mode)["items"]]
        assert found[0] == "trains", mode
        assert "needle" not in found, mode


def test_search_answers_the_same_on_both_dialects(corpus: MemoryStore, tmp_path: Any) -> None:
    """Vector ranks are the same numbers on SQLite and PostgreSQL (one index, client-side)."""
    from tiffany.store.migrate import upgrade

    lite = make_engine(f"sqlite:///{tmp_path / 'lite.db'}")
    upgrade(lite)
    other = MemoryStore(lite, clock=ManualClock(epoch=1_800_000_000.0, autojump=False))
    try:
        for key, body in CORPUS.items():
            other.put("notes", key, {"body": body}, op=f"c-{key}")
        query = "who takes the train or drinks tea"
        assert other.search("notes", query, k=5, mode="vector") == corpus.search(
            "notes", query, k=5, mode="vector"
        )
    finally:
        other.close()
        lite.dispose()


def test_ttl_and_the_size_limit(engine: Engine, clock: ManualClock) -> None:
    store = MemoryStore(engine, clock=clock, max_items=2)
    store.put(NS, "short", "a short lived zanzibar fact", op="p1", ttl_s=10)
    store.put(NS, "long", "a lasting zanzibar fact", op="p2")
    with pytest.raises(MemoryFull) as full:
        store.put(NS, "third", "no room", op="p3")
    assert full.value.detail["limit"] == 2
    clock.advance(11)
    assert store.get(NS, "short") is None
    for mode in ("text", "vector", "hybrid"):
        assert [i["key"] for i in store.search(NS, "zanzibar", mode=mode)["items"]] == ["long"]
    # The expired item is swept by this write, which makes room for it.
    assert store.put(NS, "third", "room now", op="p3")["created"] is True
    assert count(engine, mem_items) == 2


@pytest.mark.parametrize(("field", "method", "args"), BAD_CALLS[::3])
def test_bounds_are_refused_naming_their_field(
    store: MemoryStore, engine: Engine, field: str, method: str, args: dict[str, Any]
) -> None:
    with pytest.raises(MemoryInvalid) as refused:
        call(store, method, args)
    assert refused.value.field == field
    assert count(engine, mem_applied) == 0


def test_apply_rebuilds_without_the_model(store: MemoryStore, pg_schema_url: str) -> None:
    from tiffany.store.migrate import upgrade

    results = [
        store.put("people", "alice", {"likes": "tea"}, op="r/1", ttl_s=3600),
        store.put("people", "bob", "bob", op="r/2"),
        store.link(("people", "alice"), "knows", ("people", "bob"), op="r/3"),
        store.delete("people", "bob", op="r/4"),
    ]
    other_engine = make_engine(pg_schema_url)
    upgrade(other_engine)
    rebuilt = MemoryStore(other_engine, embedder=NoModel())
    try:
        for result in results + results:
            rebuilt.apply(result)
        assert rebuilt.get("people", "alice") == store.get("people", "alice")
        assert rebuilt.history("people", "bob") == store.history("people", "bob")
        assert count(other_engine, mem_applied) == 4
    finally:
        rebuilt.close()
        other_engine.dispose()


def test_kill_9_mid_puts_then_rerun_applies_each_op_once(
    pg_migrated_url: str, engine: Engine
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, pg_migrated_url, "run-1/step", "200"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if int(line) >= 40:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    assert 41 <= count(engine, mem_applied) < 200
    rerun = subprocess.run(
        [sys.executable, "-c", WRITER, pg_migrated_url, "run-1/step", "200"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert rerun.stdout.split() == [str(i) for i in range(200)]
    assert count(engine, mem_applied) == 200
    assert count(engine, mem_items) == 200
    assert count(engine, mem_item_versions) == 200
    with engine.connect() as conn:
        seqs = conn.execute(select(mem_item_versions.c.store_seq)).scalars().all()
    assert len(set(seqs)) == 200


def test_two_processes_write_at_once(
    pg_migrated_url: str, engine: Engine, store: MemoryStore
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, pg_migrated_url, "child", "50"],
        stdout=subprocess.PIPE,
        text=True,
    )
    for i in range(50):
        store.put("crash", None, f"fact {i} from parent", op=f"parent/{i}")
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    assert len(out.split()) == 50
    with engine.connect() as conn:
        seqs = conn.execute(select(mem_item_versions.c.store_seq)).scalars().all()
    assert sorted(seqs) == list(range(1, 101))
    assert [(n["namespace"], n["items"]) for n in store.namespaces()] == [("crash", 100)]


def test_writes_are_transactions_on_an_autocommit_engine(pg_migrated_url: str) -> None:
    """The API's reader engine commits each statement; a write through it is all or nothing."""
    from tiffany.store.session import make_reader_engine

    engine = make_reader_engine(pg_migrated_url, 2)
    store = MemoryStore(engine, max_items=1)
    try:
        store.put(NS, "one", "1", op="w1")
        with pytest.raises(MemoryFull):
            store.put(NS, "two", "2", op="w2")  # refused after its claim and its seq bump
        assert count(engine, mem_applied) == 1
        assert store.put(NS, "one", "1 again", op="w3")["store_seq"] == 2
    finally:
        store.close()
        engine.dispose()


def test_common_words_act_as_stop_words_and_bound_the_scoring(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiffany.memory import fulltext

    monkeypatch.setattr(fulltext, "COMMON_MATCHES", 2)
    monkeypatch.setattr(fulltext, "SCORED_MATCHES", 3)
    for i in range(6):
        store.put("notes", f"k{i}", f"tea note number {i}", op=f"p{i}")
    store.put("notes", "rare", "tea from zanzibar", op="p-rare")
    found = store.search("notes", "tea zanzibar", k=5, mode="text")["items"]
    assert [i["key"] for i in found] == ["rare"]
    found = store.search("notes", "tea note", k=5, mode="text")["items"]
    assert [i["key"] for i in found] == ["rare", "k5", "k4", "k3", "k2"]
