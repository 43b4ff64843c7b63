"""Memory's vector leg in PostgreSQL with pgvector, and its fallback without it.

Two databases of the local server, made here (the shared ``test`` database
is left as it is, so other tests never see the extension come and go):

* ``tiffany_test_pgvector``, with the ``vector`` extension created (in
  ``public``); each test migrates a fresh schema of it (migration 0015
  makes ``mem_vectors`` there). Its tests skip, saying so, where the server
  has no pgvector (``pg_available_extensions``): a user's server may lack it.
* ``tiffany_test_novector``, where the extension is never created, used by
  a role that is not a superuser (so it cannot create it): the fallback.

The pgvector path is held to the exact in-process path (``pgvector=off``)
on the same rows: the same top k, in the same order but for ties.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memory_cases import WRITER
from memory_runs import run_plan, tiffany
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from tiffany.kernel.clock import ManualClock
from tiffany.memory import HashingEmbedder, MemoryFull, MemoryStore, encode_vector
from tiffany.memory.pgvector import PgVectors, install, probe
from tiffany.store.migrate import upgrade
from tiffany.store.session import make_engine

PGV_DB = "tiffany_test_pgvector"
NOVEC_DB = "tiffany_test_novector"
NOSUPER = "tiffany_test_nosuper"
#: Scores closer than this are a tie (pgvector sums in another order than BLAS).
TIE = 2e-6


def _admin(postgres_url: str, database: str = "postgres") -> Engine:
    url = make_url(postgres_url).set(database=database)
    return create_engine(url, isolation_level="AUTOCOMMIT")


def _ensure_database(postgres_url: str, name: str) -> str:
    admin = _admin(postgres_url)
    try:
        with admin.connect() as conn:
            there = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": name}
            ).scalar()
            if not there:
                # Another test process may make it first.
                with contextlib.suppress(ProgrammingError):
                    conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return make_url(postgres_url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pgvector_url(postgres_url: str) -> str:
    """The database with the ``vector`` extension (skips where the server has no pgvector)."""
    admin = _admin(postgres_url)
    try:
        with admin.connect() as conn:
            available = conn.execute(
                text("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'")
            ).scalar()
    finally:
        admin.dispose()
    if available is None:
        pytest.skip(
            "the PostgreSQL server has no pgvector ('vector' is not in pg_available_extensions): "
            "the pgvector path cannot be tested here; the exact path's tests still run"
        )
    url = _ensure_database(postgres_url, PGV_DB)
    engine = _admin(url, PGV_DB)
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(20261129)"))
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public"))
    finally:
        engine.dispose()
    return url


@contextmanager
def _schema(database_url: str, *, owner: str | None = None, migrate: bool = True) -> Iterator[str]:
    """A fresh schema of ``database_url`` (dropped afterwards); a URL whose search_path is it."""
    schema = f"pgv_{uuid.uuid4().hex[:10]}"
    admin = _admin(database_url, make_url(database_url).database or "postgres")
    with admin.connect() as conn:
        auth = f' AUTHORIZATION "{owner}"' if owner else ""
        conn.execute(text(f'CREATE SCHEMA "{schema}"{auth}'))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    if owner:
        url = url.set(username=owner)
    rendered = url.render_as_string(hide_password=False)
    try:
        if migrate:
            engine = make_engine(rendered)
            upgrade(engine)
            engine.dispose()
        yield rendered
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def pgv_url(pgvector_url: str) -> Iterator[str]:
    with _schema(pgvector_url) as url:
        yield url


@pytest.fixture
def engine(pgv_url: str) -> Iterator[Engine]:
    engine = make_engine(pgv_url)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(epoch=1_800_000_000.0, autojump=False)


@pytest.fixture(scope="session")
def novector_url(postgres_url: str) -> str:
    """A database without the extension, and a role that cannot create it."""
    url = _ensure_database(postgres_url, NOVEC_DB)
    admin = _admin(url, NOVEC_DB)
    try:
        with admin.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(20261130)"))
            conn.execute(text("DROP EXTENSION IF EXISTS vector CASCADE"))
            role = conn.execute(
                text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": NOSUPER}
            ).scalar()
            if not role:
                conn.execute(text(f'CREATE ROLE "{NOSUPER}" LOGIN NOSUPERUSER'))
    finally:
        admin.dispose()
    return url


def _words(rng: np.random.Generator, vocab: list[str], n: int) -> str:
    ranks = np.minimum(rng.zipf(1.3, size=n), len(vocab)) - 1
    return " ".join(vocab[i] for i in ranks)


def _corpus(items: int, seed: int = 7) -> list[tuple[str, str]]:
    """``(key, text)``: Zipf-distributed words, a few duplicated texts (exact ties)."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i:04d}{chr(97 + i % 26)}" for i in range(3000)]
    out = [(f"k{i:05d}", _words(rng, vocab, 40)) for i in range(items)]
    for i in range(0, min(40, items - 1), 4):  # pairs of one text: their scores tie exactly
        out[i + 1] = (out[i + 1][0], out[i][1])
    return out


def _assert_same_ranking(fast: dict[str, Any], exact: dict[str, Any]) -> None:
    a = [(h["key"], h["score"]) for h in fast["items"]]
    b = [(h["key"], h["score"]) for h in exact["items"]]
    assert {k for k, _ in a} == {k for k, _ in b}, (a, b)
    for (ka, sa), (kb, sb) in zip(a, b, strict=True):
        assert ka == kb or abs(sa - sb) <= TIE, (a, b)
        assert abs(sa - sb) <= TIE


def _vector_rows(engine: Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT namespace, key, store_seq FROM mem_vectors")).all()
    return {(r.namespace, r.key): r.store_seq for r in rows}


def _item_rows(engine: Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT namespace, key, store_seq FROM mem_items")).all()
    return {(r.namespace, r.key): r.store_seq for r in rows}


# -- with pgvector ------------------------------------------------------------------


def test_the_migration_makes_mem_vectors_where_the_extension_is(engine: Engine) -> None:
    with engine.connect() as conn:
        found = probe(conn)
        kind = conn.execute(
            text(
                "SELECT udt_name FROM information_schema.columns WHERE table_schema ="
                " current_schema() AND table_name = 'mem_vectors' AND column_name = 'embedding'"
            )
        ).scalar()
    assert (found.ready, found.schema, kind) == (True, "public", "vector")
    store = MemoryStore(engine)
    try:
        assert store.vector_index == "pgvector"
    finally:
        store.close()


def test_pgvector_answers_the_exact_paths_top_k(engine: Engine, clock: ManualClock) -> None:
    corpus = _corpus(2000)
    fast = MemoryStore(engine, clock=clock)
    exact = MemoryStore(engine, clock=clock, pgvector="off")
    try:
        assert (fast.vector_index, exact.vector_index) == ("pgvector", "exact")
        for i, (key, body) in enumerate(corpus):
            ns = "big" if i % 10 else "other"  # another namespace: filtered out
            ttl = 60.0 if i % 97 == 5 else None  # some expire before the searches
            fast.put(ns, key, {"i": i}, body, op=f"op-{key}", ttl_s=ttl)
        # Items of another model (a rebuilt put labelled with it), with the
        # very vectors of the first 20 items: a search of this store's
        # embedder must not see them, on either path.
        embedder = HashingEmbedder()
        for key, body in corpus[:20]:
            fast.apply(
                {
                    "write": "put",
                    "namespace": "big",
                    "key": f"x-{key}",
                    "value": body,
                    "text": body,
                    "op": f"other-{key}",
                    "vector": encode_vector(embedder.embed([body])[0]),
                    "embedder": {"id": "another-model", "dims": 256, "kind": "test"},
                }
            )
        for key, _ in corpus[100:130]:  # deleted: gone from both
            fast.delete("big", key, op=f"del-{key}")
        clock.advance(120)
        assert _vector_rows(engine) == _item_rows(engine)

        queries = [body for _, body in corpus[0:200:5]] + [" ".join(corpus[7][1].split()[:5])]
        queries += [corpus[105][1], corpus[5][1]]  # a deleted item's text, an expired one's
        for q in queries:
            for k in (1, 10, 50):
                got = fast.search("big", q, k, mode="vector")
                want = exact.search("big", q, k, mode="vector")
                assert (got["vector_index"], want["vector_index"]) == ("pgvector", "exact")
                assert len(got["items"]) == k
                assert not any(h["key"].startswith("x-") for h in got["items"])
                _assert_same_ranking(got, want)
        for q in (corpus[12][1], " ".join(corpus[33][1].split()[:6])):
            hybrid = fast.search("big", q, 10)
            assert hybrid["vector_index"] == "pgvector"
            assert hybrid["items"] == exact.search("big", q, 10)["items"]
        assert fast.search("big", "w0001b", 5, mode="text")["vector_index"] is None
    finally:
        fast.close()
        exact.close()


def test_writes_are_applied_once_with_their_vector_row(
    engine: Engine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore(engine, clock=clock, max_items=3)
    try:
        first = store.put("ns", "a", "alpha", op="o-1")
        assert store.put("ns", "a", "alpha", op="o-1") == first  # re-applied: nothing written
        store.put("ns", "b", "beta", op="o-2")
        store.put("ns", "c", "gamma", op="o-3")
        with pytest.raises(MemoryFull):
            store.put("ns", "d", "delta", op="o-4")
        assert _vector_rows(engine) == _item_rows(engine)
        assert len(_vector_rows(engine)) == 3

        # A failure after the vector row's write rolls it back with the rest.
        real = PgVectors.write

        def write_then_fail(self: PgVectors, conn: Any, **fields: Any) -> None:
            real(self, conn, **fields)
            raise ConnectionError("lost mid-write")

        monkeypatch.setattr(PgVectors, "write", write_then_fail)
        with pytest.raises(ConnectionError):
            store.put("ns", "a", "alpha changed", op="o-5")
        monkeypatch.undo()
        assert _vector_rows(engine) == _item_rows(engine)
        assert store.applied("o-5") is None
        again = store.put("ns", "a", "alpha changed", op="o-5")
        assert again["version"] == 2
        assert store.put("ns", "a", "alpha changed", op="o-5") == again
        assert _vector_rows(engine) == _item_rows(engine)
        top = store.search("ns", "alpha changed", 1, mode="vector")["items"][0]
        assert (top["key"], top["score"]) == ("a", 1.0)
        store.delete("ns", "a", op="o-6")
        assert ("ns", "a") not in _vector_rows(engine)
    finally:
        store.close()


def test_kill_9_mid_puts_then_rerun_applies_each_op_once_with_its_vector(
    pgv_url: str, engine: Engine
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, pgv_url, "run-1/step", "120"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if int(line) >= 30:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    assert 31 <= len(_vector_rows(engine)) < 120
    assert _vector_rows(engine) == _item_rows(engine)
    rerun = subprocess.run(
        [sys.executable, "-c", WRITER, pgv_url, "run-1/step", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert rerun.stdout.split() == [str(i) for i in range(120)]
    assert len(_vector_rows(engine)) == 120
    assert _vector_rows(engine) == _item_rows(engine)  # each item once, its seq its item's


def test_turned_on_later_fills_and_resyncs_the_table(
    pgv_url: str, engine: Engine, tmp_path: Path
) -> None:
    with engine.begin() as conn:  # a store migrated before the extension was there
        conn.execute(text("DROP TABLE mem_vectors"))
    before = MemoryStore(engine)
    try:
        assert before.vector_index == "exact"
        for key, body in _corpus(300):
            before.put("ns", key, body, op=f"op-{key}")
        want = before.search("ns", _corpus(300)[3][1], 10, mode="vector")
    finally:
        before.close()

    done = tiffany(tmp_path, "db", "pgvector", "--json", TIFFANY_DATABASE_URL=pgv_url)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["ready"], report["created_table"], report["synced"], report["rows"]) == (
        True,
        True,
        300,
        300,
    )
    # A row gone stale (written while the table lagged): the next run rewrites it.
    with engine.begin() as conn:
        conn.execute(text("UPDATE mem_vectors SET store_seq = 0 WHERE key = 'k00003'"))
        assert install(conn, create_extension=False).synced == 1
        # A row a process that did not know the table never wrote: the next
        # store writes it at its start, before it ranks by the table.
        conn.execute(text("DELETE FROM mem_vectors WHERE key = 'k00003'"))
    after = MemoryStore(engine)
    try:
        assert after.vector_index == "pgvector"
        assert len(_vector_rows(engine)) == 300
        _assert_same_ranking(after.search("ns", _corpus(300)[3][1], 10, mode="vector"), want)
    finally:
        after.close()
    again = tiffany(tmp_path, "db", "pgvector", TIFFANY_DATABASE_URL=pgv_url)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "mem_vectors holds 300 vectors (0 written now)" in again.stdout


def test_off_keeps_the_rows_and_searches_in_the_process(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tiffany.memory.pgvector")
    store = MemoryStore(engine, pgvector="off")
    try:
        store.put("ns", "a", "alpha", op="o-1")
        answer = store.search("ns", "alpha", 1, mode="vector")
    finally:
        store.close()
    assert answer["vector_index"] == "exact"
    assert _vector_rows(engine) == _item_rows(engine)  # ready for auto again
    assert caplog.messages == ["memory vectors: path=exact (TIFFANY_MEMORY_PGVECTOR=off)"]
    with pytest.raises(ValueError, match="auto, off"):
        MemoryStore(engine, pgvector="on")


def test_a_rebuild_restores_the_vectors(pgvector_url: str, tmp_path: Path) -> None:
    plan = {
        "name": "remember",
        "steps": [
            {"id": f"p{i}", "tool": "memory.put", "args": {"namespace": "kb", "value": body}}
            for i, (_, body) in enumerate(_corpus(12))
        ],
    }
    with _schema(pgvector_url) as first:
        _, state = run_plan(tmp_path, plan, database_url=first)
        assert state.status == "succeeded", state.error
        written = MemoryStore.open(first)
        try:
            want = written.search("kb", _corpus(12)[4][1], 5, mode="vector")
        finally:
            written.close()
    assert want["vector_index"] == "pgvector"
    with _schema(pgvector_url) as lost:  # the store is lost: a fresh schema
        done = tiffany(tmp_path, "db", "rebuild", "--json", TIFFANY_DATABASE_URL=lost)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["memory_restored"] == 12
        engine = make_engine(lost)
        store = MemoryStore(engine)
        try:
            assert len(_vector_rows(engine)) == 12
            assert _vector_rows(engine) == _item_rows(engine)
            got = store.search("kb", _corpus(12)[4][1], 5, mode="vector")
            assert got["vector_index"] == "pgvector"
            assert [(h["key"], h["score"]) for h in got["items"]] == [
                (h["key"], h["score"]) for h in want["items"]
            ]
        finally:
            store.close()
            engine.dispose()


# -- without pgvector ------------------------------------------------------------------


def test_without_the_extension_the_store_says_why_and_searches_exactly(
    novector_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tiffany.memory.pgvector")
    with _schema(novector_url, owner=NOSUPER) as url:
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                found = probe(conn)
                assert not found.ready
                assert found.schema is None
                assert not found.table  # migration 0015 changed nothing
            store = MemoryStore(engine)
            try:
                store.put("ns", "a", "alpha beta", op="o-1")
                store.put("ns", "b", "gamma delta", op="o-2")
                answer = store.search("ns", "alpha", 2, mode="vector")
            finally:
                store.close()
            assert answer["vector_index"] == "exact"
            assert [h["key"] for h in answer["items"]] == ["a", "b"]
            [line] = caplog.records
            assert line.levelno == logging.WARNING
            assert line.getMessage().startswith("memory vectors: path=exact (")
            assert "tiffany db pgvector" in line.getMessage() or "no 'vector'" in line.getMessage()

            done = tiffany(tmp_path, "db", "pgvector", TIFFANY_DATABASE_URL=url)
            assert done.returncode == 1
            if found.available is not None:  # the server has it; this role cannot create it
                assert "could not create the vector extension" in done.stderr
                assert "permission denied" in done.stderr
            else:
                assert "no 'vector' extension" in done.stderr
            assert "exactly in the process" in done.stderr or "in the process" in done.stderr
            with engine.connect() as conn:
                assert not probe(conn).table
        finally:
            engine.dispose()


def test_db_pgvector_on_sqlite_says_it_is_postgresqls(tmp_path: Path) -> None:
    done = tiffany(tmp_path, "db", "pgvector")
    assert done.returncode == 1
    assert "is not PostgreSQL" in done.stderr
