"""The runs list's filters (``RunFilter``): the same SQL on SQLite and PostgreSQL.

Runs rows are written as the projector writes them (inputs as msgspec JSON)
and read back through :func:`tiffany.store.queries.list_runs` and
:func:`~tiffany.store.queries.counts_by_status`, on both databases (the
``store`` fixture is parametrized).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from tiffany.store import Run, session_factory
from tiffany.store.queries import RunFilter, counts_by_status, list_runs

T0 = 1_714_557_600.0  # 2024-05-01T10:00:00Z


def _run(run_id: str, name: str, status: str, inputs: Any, created_at: float) -> Run:
    return Run(
        run_id=run_id,
        run_no=int(run_id[1:]),
        start_seq=int(run_id[1:]),
        name=name,
        status=status,
        entry={"kind": "plan"},
        inputs=inputs,
        created_at=created_at,
        started_at=created_at,
        dispatches=0,
        last_seq=int(run_id[1:]),
    )


def _ids(store: Engine, where: RunFilter, status: str | None = None) -> list[str]:
    with session_factory(store)() as s:
        return [r.run_id for r in list_runs(s, status, limit=100, where=where)]


def test_filters_by_name_inputs_text_and_time(store: Engine) -> None:
    with session_factory(store).begin() as s:
        s.add_all(
            [
                _run("r1", "Nightly-Report", "succeeded", {"ticket": "TICKET-42"}, T0),
                _run("r2", "nightly-backup", "failed", {"path": "/srv/50%_done"}, T0 + 60),
                _run("r3", "adhoc", "running", {"who": 'Zoë "the" admin'}, T0 + 120),
                _run("r4", "naïve", "succeeded", None, T0 + 180),
            ]
        )
    assert _ids(store, RunFilter()) == ["r4", "r3", "r2", "r1"]
    assert _ids(store, RunFilter(name="NIGHTLY")) == ["r2", "r1"]
    assert _ids(store, RunFilter(name="nightly"), status="failed") == ["r2"]
    assert _ids(store, RunFilter(name="ï")) == ["r4"]
    # Wildcards of LIKE are plain text here.
    assert _ids(store, RunFilter(name="%")) == []
    assert _ids(store, RunFilter(name="_")) == []
    assert _ids(store, RunFilter(q="ticket-42")) == ["r1"]
    assert _ids(store, RunFilter(q="ticket")) == ["r1"]  # a key matches too
    assert _ids(store, RunFilter(q="50%_")) == ["r2"]
    assert _ids(store, RunFilter(q="50%x")) == []
    assert _ids(store, RunFilter(q='"the" admin')) == ["r3"]
    assert _ids(store, RunFilter(q="Zoë")) == ["r3"]
    assert _ids(store, RunFilter(since=T0 + 60)) == ["r4", "r3", "r2"]
    assert _ids(store, RunFilter(until=T0 + 60)) == ["r2", "r1"]
    assert _ids(store, RunFilter(name="nightly", since=T0 + 1, until=T0 + 120)) == ["r2"]
    with session_factory(store)() as s:
        counts = counts_by_status(s, RunFilter(name="nightly"))
    assert counts == {
        "pending": 0,
        "running": 0,
        "waiting": 0,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 0,
    }
