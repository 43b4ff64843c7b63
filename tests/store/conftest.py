"""Fixtures for the store tests: a real journal, and a migrated store on SQLite or PostgreSQL.

``journal`` runs a few real runs through :class:`tiffany.durable.Runtime` once
per session (callable runs that spawn, sleep, join and crash; plan runs that
succeed, fail and get cancelled) and hands the tests the decoded records.
``store`` is parametrized: every test that takes it runs on a fresh SQLite
file and on PostgreSQL (in a schema of its own, dropped afterwards).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from sqlalchemy import Engine, text  # noqa: E402
from store_support import Journal, Record, dump  # noqa: E402, F401 (dump: for older imports)

from tiffany.store import make_engine  # noqa: E402
from tiffany.store.migrate import upgrade  # noqa: E402

PLAN_OK = {
    "name": "write-read",
    "inputs": {"text": "hi", "unused": 1},
    "steps": [
        {
            "id": "write",
            "tool": "file.write",
            "args": {"path": "a.txt", "content": "${inputs.text}"},
        },
        {"id": "read", "tool": "file.read", "args": {"path": "a.txt"}, "after": ["write"]},
        {"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}},
    ],
    "outputs": {"text": "${steps.read.output.content}"},
}

PLAN_FAIL = {
    "name": "read-missing",
    "steps": [
        {
            "id": "bad",
            "tool": "file.read",
            "args": {"path": "missing.txt"},
            "retries": 1,
            "backoff": 0.001,
        },
        {"id": "after", "tool": "sleep", "args": {"seconds": 0.01}, "after": ["bad"]},
    ],
}

PLAN_CANCEL = {
    "name": "long-nap",
    "steps": [
        {"id": "long", "tool": "sleep", "args": {"seconds": 30}},
        {"id": "later", "tool": "sleep", "args": {"seconds": 0.01}, "after": ["long"]},
    ],
}


def _read_records(wal_dir: Path) -> list[Record]:
    from tiffany.wal import iter_records
    from tiffany.wire.records import decode, run_of

    out = []
    for rec in iter_records(wal_dir):
        out.append((rec.seq, rec.rtype, run_of(rec.payload), decode(rec.rtype, rec.payload)))
    return out


@pytest.fixture(scope="session")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    """Real runs journaled into a WAL (built once per session)."""
    from tiffany.agents import AgentEnv, plan_entry
    from tiffany.agents.registry import ToolRegistry
    from tiffany.durable import Runtime
    from tiffany.workflows import workflow_resolver

    data_dir = tmp_path_factory.mktemp("store-journal")
    registry = ToolRegistry.default(enabled=["file.read", "file.write", "sleep"])
    env = AgentEnv(registry, data_dir / "workspaces")
    ids: dict[str, str] = {}
    with Runtime(data_dir, resolvers={"workflow": workflow_resolver(env)}) as rt:
        ids["family"] = rt.submit("store_workloads:family", 2)
        ids["failing"] = rt.submit("store_workloads:failing")
        ids["sleeper"] = rt.submit("store_workloads:sleeper", 30.0)
        ids["plan_ok"] = rt.submit_entry(plan_entry(PLAN_OK, {"unused": 2}), name="write-read")
        ids["plan_fail"] = rt.submit_entry(plan_entry(PLAN_FAIL), name="read-missing")
        ids["plan_cancel"] = rt.submit_entry(plan_entry(PLAN_CANCEL), name="long-nap")
        for label in ("sleeper", "plan_cancel"):
            assert rt.journal.request_cancel(ids[label], "test")
        rt.run()
    return Journal(data_dir, _read_records(data_dir / "wal"), ids)


def _sqlite_store(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        yield engine
    finally:
        engine.dispose()


def _postgres_store(url: str) -> Iterator[Engine]:
    schema = f"store_test_{uuid.uuid4().hex[:10]}"
    admin = make_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = make_engine(url, connect_args={"options": f"-csearch_path={schema}"})
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on an empty database: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield from _sqlite_store(tmp_path)
    else:
        yield from _postgres_store(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(empty_store: Engine) -> Engine:
    """An engine on a migrated, empty store (SQLite or PostgreSQL)."""
    upgrade(empty_store)
    return empty_store


@pytest.fixture
def make_store(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[], Engine]:
    """Make more migrated stores of the same backend as ``store`` (for comparisons)."""
    made: list[Iterator[Engine]] = []

    def make() -> Engine:
        backend = request.node.callspec.params["empty_store"]
        if backend == "sqlite":
            sub = tmp_path / f"extra-{len(made)}"
            sub.mkdir()
            gen = _sqlite_store(sub)
        else:
            gen = _postgres_store(request.getfixturevalue("postgres_url"))
        made.append(gen)
        engine = next(gen)
        upgrade(engine)
        return engine

    yield make
    for gen in made:
        gen.close()
