"""The ``Journals`` port: the engines' journals, files in the data dir or PostgreSQL streams.

Chosen once from the settings (:func:`tiffany.ports.journals.journals_for`);
what each backend answers, and the refusals the CLI prints word for word
when a command works on the other backend only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tiffany.cli import app
from tiffany.config import Settings
from tiffany.errors import JournalUnsupported, WalLockedError
from tiffany.ports.journals import FileJournals, Journals, PgJournals, journals_for
from tiffany.wal.lock import lock_dir, unlock

#: What ``wal verify``/``wal repair`` print on the PostgreSQL journal (a contract of the CLI).
NOT_FILES = (
    "tiffany: the journal is in PostgreSQL (TIFFANY_JOURNAL=postgres); this command "
    "works on the file WAL (the database keeps its own integrity)"
)
#: What ``wal streams`` prints on the file WAL.
NO_STREAMS = (
    "tiffany: the journal is the file WAL (one engine, one data dir): "
    "`tiffany status` shows it; streams exist with TIFFANY_JOURNAL=postgres"
)

runner = CliRunner()


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for ``data_dir`` and ``overrides``, blind to the caller's ``TIFFANY_*``."""
    with pytest.MonkeyPatch.context() as mp:
        for name in os.environ:
            if name.startswith("TIFFANY_"):
                mp.delenv(name)
        return Settings(data_dir=data_dir, **overrides)


def _cli(*args: str, **env: str) -> Any:
    blind = {name: None for name in os.environ if name.startswith("TIFFANY_")}
    return runner.invoke(app, list(args), env={**blind, **env})


def test_the_file_journals_are_the_engines_wal_directories(tmp_path: Path) -> None:
    journals = journals_for(make_settings(tmp_path))
    assert type(journals) is FileJournals
    assert isinstance(journals, Journals)
    assert (journals.repairable, journals.leased, journals.in_database) == (True, False, False)
    assert journals.count() == 1  # engine 0's, even before it wrote anything
    (tmp_path / "engines" / "2" / "wal").mkdir(parents=True)  # an earlier serve --engines 3
    assert journals.count() == 3
    assert journals.source(0) == journals.wal_dir(0) == tmp_path / "wal"
    assert journals.source(2) == tmp_path / "engines" / "2" / "wal"
    with pytest.raises(JournalUnsupported) as refused:
        journals.streams()
    assert f"tiffany: {refused.value}" == NO_STREAMS


def test_a_file_journal_is_stopped_only_while_nobody_holds_its_lock(tmp_path: Path) -> None:
    journals = journals_for(make_settings(tmp_path))
    wal_dir = journals.wal_dir(0)
    wal_dir.mkdir()
    assert journals.stopped(0)
    fd = lock_dir(wal_dir)  # as an engine holds it
    try:
        assert not journals.stopped(0)
    finally:
        unlock(fd)
    assert journals.stopped(0)


def test_a_rebuild_holds_every_file_journal_still_and_is_refused_beside_an_engine(
    tmp_path: Path,
) -> None:
    journals = journals_for(make_settings(tmp_path))
    for engine in (0, 1):
        journals.wal_dir(engine).mkdir(parents=True)
    with journals.engines_stopped():
        assert [journals.stopped(0), journals.stopped(1)] == [False, False]  # no engine starts
    assert [journals.stopped(0), journals.stopped(1)] == [True, True]  # and given back
    fd = lock_dir(journals.wal_dir(1))  # engine 1 runs
    try:
        with pytest.raises(WalLockedError), journals.engines_stopped():
            pytest.fail("the body ran beside a running engine")
    finally:
        unlock(fd)
    assert journals.stopped(0)  # what it took before the refusal, it gave back


def test_the_postgresql_journals_refuse_the_file_commands_without_a_connection(
    tmp_path: Path,
) -> None:
    settings = make_settings(
        tmp_path, journal="postgres", database_url="postgresql://nobody@127.0.0.1:1/none"
    )
    journals = journals_for(settings)
    assert type(journals) is PgJournals
    assert isinstance(journals, Journals)
    assert (journals.repairable, journals.leased, journals.in_database) == (False, True, True)
    assert not journals.stopped(0)  # an engine elsewhere may hold the stream: never known here
    with pytest.raises(JournalUnsupported) as refused:
        journals.wal_dir(0)
    assert f"tiffany: {refused.value}" == NOT_FILES


def test_the_cli_prints_each_backends_refusal_word_for_word(tmp_path: Path) -> None:
    pg = {"TIFFANY_JOURNAL": "postgres", "TIFFANY_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
    for args in (("wal", "repair", "--yes"), ("wal", "repair", "--salvage")):
        result = _cli("--data-dir", str(tmp_path), *args, **pg)
        assert result.exit_code == 2, result.output
        assert NOT_FILES in result.output
    result = _cli("--data-dir", str(tmp_path), "wal", "streams")
    assert result.exit_code == 1, result.output
    assert NO_STREAMS in result.output


def test_the_postgresql_journals_count_the_engines_streams(
    tmp_path: Path, pg_migrated_url: str
) -> None:
    from tiffany.engine import journal_log

    settings = make_settings(tmp_path, journal="postgres", database_url=pg_migrated_url)
    journals = journals_for(settings)
    assert journals.count() == 1  # engine 0's, even before it wrote anything
    for engine in (0, 1):
        log = journal_log(settings.for_engine(engine))
        assert log is not None
        if engine == 1:  # engine 1 runs: a rebuild is refused, naming its stream
            with pytest.raises(WalLockedError, match="'main-1'"), journals.engines_stopped():
                pytest.fail("the body ran beside a running engine")
        log.close()
    with journals.engines_stopped():  # every lease given back
        pass
    assert journals.count() == 2
    assert [s["stream"] for s in journals.streams()] == ["main", "main-1"]
    source = journals.source(1)
    assert getattr(source, "stream", None) == "main-1"
