"""journal_records: every record projected, named, paged per run; idempotent."""

from __future__ import annotations

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from tiffany.projector import Projector
from tiffany.store import JournalRecord
from tiffany.store.journal import record_row
from tiffany.store.queries import run_records
from tiffany.wire.records import Dispatch, Unknown


def test_each_record_is_kept_once_and_pages_per_run(store: Engine, journal) -> None:
    projector = Projector(store)
    projector.apply(journal.records[:40])
    projector.apply(journal.records)  # overlaps the first batch: nothing doubles
    with Session(store) as session:
        assert session.scalar(select(func.count()).select_from(JournalRecord)) == len(
            journal.records
        )
        run_id = journal.run_ids["plan_ok"]
        run_no = next(r[2] for r in journal.records if r[1] == 1 and r[3].run_id == run_id)
        expected = [r for r in journal.records if r[2] == run_no]
        got: list[dict] = []
        after = 0
        pages = 0
        while True:
            page = run_records(session, run_id, after=after, limit=7)
            assert page is not None
            got.extend(page["records"])
            pages += 1
            if page["next_after"] is None:
                break
            after = page["next_after"]
        assert pages == -(-len(expected) // 7)
        assert [g["seq"] for g in got] == [r[0] for r in expected]
        first = got[0]
        assert first["type"] == "RUN_START"
        assert first["data"]["run_id"] == run_id
        dispatch = next(g for g in got if g["type"] == "DISPATCH")
        assert set(dispatch["data"]) == set(Dispatch.__struct_fields__)
        assert dispatch["ltid"] == dispatch["data"]["ltid"]
        assert run_records(session, "no-such-run") is None


def test_record_row_names_fields_and_keeps_those_of_unknown_types() -> None:
    row = record_row(5, 2, Dispatch(4, 3, "sleep", 0.5))
    assert row == {
        "seq": 5,
        "run_no": 2,
        "rtype": "DISPATCH",
        "ltid": 3,
        "data": {"n": 4, "ltid": 3, "kind": "sleep", "arg": 0.5},
    }
    odd = record_row(6, 2, Unknown(200, ["x"]))
    assert odd == {
        "seq": 6,
        "run_no": 2,
        "rtype": "TYPE_200",
        "ltid": None,
        "data": {"fields": ["x"]},
    }
