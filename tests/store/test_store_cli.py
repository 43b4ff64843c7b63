"""``tiffany db upgrade`` and ``tiffany db rebuild`` (the group from tiffany/cli/db.py)."""

from __future__ import annotations

import json
import os

import pytest
import typer
from store_support import Journal, dump
from typer.testing import CliRunner

from tiffany.cli.db import register
from tiffany.projector import Projector
from tiffany.projector.tail import journal_id
from tiffany.store import make_engine
from tiffany.store.migrate import current_revision, head_revision, upgrade
from tiffany.wal import Wal


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, settings, journal: Journal, tmp_path):
    """Invoke ``db ...`` with the journal's data dir and a SQLite store in tmp_path."""
    del settings  # clears the caller's TIFFANY_* variables
    url = f"sqlite:///{tmp_path / 'cli' / 'store.db'}"
    monkeypatch.setenv("TIFFANY_DATA_DIR", str(journal.data_dir))
    monkeypatch.setenv("TIFFANY_DATABASE_URL", url)
    monkeypatch.setenv("TIFFANY_LOG_FORMAT", "json")
    app = typer.Typer()
    register(app)

    def invoke(*args: str):
        return CliRunner().invoke(app, list(args), catch_exceptions=False)

    invoke.url = url  # type: ignore[attr-defined]
    return invoke


def test_db_upgrade(cli):
    result = cli("db", "upgrade")
    assert result.exit_code == 0, result.output
    assert f"at revision {head_revision()}" in result.output
    engine = make_engine(cli.url)
    try:
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_db_rebuild_equals_incremental_projection(cli, journal: Journal, tmp_path):
    result = cli("db", "rebuild", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["records"] == len(journal.records)
    assert report["runs"] == len(journal.run_ids)
    assert report["status"]["cancelled"] == 2

    incremental = make_engine(f"sqlite:///{tmp_path / 'inc' / 'store.db'}")
    rebuilt = make_engine(cli.url)
    try:
        upgrade(incremental)
        projector = Projector(incremental, journal_id(journal.wal_dir))  # as the engine names it
        for start in range(0, len(journal.records), 11):
            projector.apply(journal.records[start : start + 11])
        expected = dump(incremental)
        assert dump(rebuilt) == expected
        # A second rebuild (over a full store) gives the same rows again.
        again = cli("db", "rebuild")
        assert again.exit_code == 0, again.output
        assert f"from {len(journal.records)} records" in again.output
        assert "2 succeeded, 2 failed, 2 cancelled" in again.output
        assert dump(rebuilt) == expected
    finally:
        incremental.dispose()
        rebuilt.dispose()


def test_db_rebuild_is_refused_while_an_engine_holds_the_wal(cli, journal: Journal):
    """Beside a running engine a rebuild would race its projector: the WAL's lock says no."""
    first = cli("db", "rebuild")
    assert first.exit_code == 0, first.output
    store = make_engine(cli.url)
    try:
        before = dump(store)
        with Wal.open(journal.wal_dir):  # as an engine holds it
            refused = cli("db", "rebuild")
        assert refused.exit_code == 1, refused.output
        assert f"the WAL in {journal.wal_dir} is in use by pid {os.getpid()}" in refused.output
        assert dump(store) == before  # nothing emptied
        again = cli("db", "rebuild")  # the engine stopped: the lock was given back
        assert again.exit_code == 0, again.output
        assert dump(store) == before
    finally:
        store.dispose()
