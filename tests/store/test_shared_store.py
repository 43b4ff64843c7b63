"""A store that outlives its data dir: a new WAL, an older copy, an old unnamed WAL.

Every WAL numbers its records from 1, so a store that one data dir fed, and
a second data dir then points at (``TIFFANY_DATABASE_URL`` kept while the
data dir's volume was lost or deleted "to start fresh"), took the new WAL's
records for ones it held and skipped them: on the old code the second data
dir's runs ran, ``tiffany run`` said nothing, and the store never showed
them. Each WAL now has a name (``wal/JOURNAL``) that the store keeps, and a
store whose mark the journal does not reach is refused: the CLI says so and
exits 1, and ``tiffany db rebuild`` makes the store this journal's.

Real subprocesses (``python -m tiffany``) on a SQLite store outside the data
dirs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sqlalchemy import text
from store_support import tiffany_cli

from tiffany.store import make_engine

PLAN = """\
name: chores
steps:
  - id: nap
    tool: sleep
    args: {seconds: 0}
"""


def _run(data: Path, plan: Path, url: str) -> tuple[int, str, str | None]:
    """``tiffany run``: exit code, stderr, and the run id (None if nothing was printed)."""
    proc = tiffany_cli(data, "run", str(plan), "--json", TIFFANY_DATABASE_URL=url)
    run_id = json.loads(proc.stdout)["run_id"] if proc.stdout.strip() else None
    return proc.returncode, proc.stderr, run_id


def _stored(url: str) -> tuple[set[str], str | None]:
    """The run ids in the store, and the journal it says it projects."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            runs = {row[0] for row in conn.execute(text("SELECT run_id FROM runs"))}
            journal = conn.execute(text("SELECT journal FROM projector_state")).scalar()
        return runs, journal
    finally:
        engine.dispose()


def test_a_second_data_dir_on_one_store_is_refused_until_rebuilt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    plan = tmp_path / "chores.yaml"
    plan.write_text(PLAN)
    first, second = tmp_path / "first", tmp_path / "second"
    ran = {_run(first, plan, url)[2] for _ in range(3)}
    assert _stored(url) == (ran, (first / "wal" / "JOURNAL").read_text().strip())

    code, err, lost = _run(second, plan, url)
    assert code == 1  # the run itself succeeded; the store could not take it
    assert "the store was not updated" in err
    assert "tiffany db rebuild" in err
    assert (second / "wal" / "JOURNAL").read_text() != (first / "wal" / "JOURNAL").read_text()
    assert _stored(url)[0] == ran  # nothing of the second WAL mixed in

    rebuilt = tiffany_cli(second, "db", "rebuild", TIFFANY_DATABASE_URL=url)
    assert rebuilt.returncode == 0, rebuilt.stderr
    code, err, later = _run(second, plan, url)
    assert code == 0, err
    assert _stored(url) == ({lost, later}, (second / "wal" / "JOURNAL").read_text().strip())


def test_a_data_dir_restored_from_an_older_copy_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    plan = tmp_path / "chores.yaml"
    plan.write_text(PLAN)
    data, backup = tmp_path / "data", tmp_path / "backup"
    _run(data, plan, url)
    shutil.copytree(data, backup)  # the same journal, one run long
    ran = {_run(data, plan, url)[2] for _ in range(2)}
    shutil.rmtree(data)
    backup.rename(data)

    code, err, _ = _run(data, plan, url)
    assert code == 1
    assert "ends before seq" in err
    assert ran <= _stored(url)[0]


def test_a_wal_from_before_names_is_named_and_its_store_kept(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    plan = tmp_path / "chores.yaml"
    plan.write_text(PLAN)
    data = tmp_path / "data"
    ran = {_run(data, plan, url)[2] for _ in range(2)}
    # As the previous version left them: no JOURNAL file, and no name in the store.
    (data / "wal" / "JOURNAL").unlink()
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE projector_state SET journal = NULL"))
    engine.dispose()

    code, err, later = _run(data, plan, url)
    assert code == 0, err
    named = (data / "wal" / "JOURNAL").read_text().strip()
    assert named.startswith("file:")
    assert _stored(url) == ({*ran, later}, named)
