"""The journal table: every WAL record of the journal, decoded, for people to read.

The projector (``projector.py``) turns records into runs, tasks and steps,
and also keeps the records themselves (``journal_records``, in the same
transaction and under the same mark), with their fields named by
:func:`record_row`, so the dashboard's journal table and ``GET
/api/runs/{id}/events`` page through a run's history without the WAL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tiffany.store.models import JournalRecord, Run
from tiffany.store.records import RecordType, jsonable

__all__ = ["FIELD_NAMES", "record_row", "run_records"]

#: The names of each record type's fields (``tiffany/durable/records.py``).
FIELD_NAMES: Final[Mapping[int, tuple[str, ...]]] = {
    RecordType.RUN_START: ("run_id", "name", "entry", "ts"),
    RecordType.SPAWN: ("n", "ltid", "parent_ltid", "name"),
    RecordType.DISPATCH: ("n", "ltid", "kind", "arg"),
    RecordType.OUTCOME: ("n", "ltid", "kind", "value"),
    RecordType.STEP_START: ("n", "ltid", "ordinal", "name", "attempt"),
    RecordType.WAKE: ("at", "ltid", "cause", "ok", "value"),
    RecordType.TASK_EXIT: ("n", "ltid", "state", "value"),
    RecordType.RUN_END: ("status", "value", "ts"),
    RecordType.CANCEL: ("reason", "ts"),
    RecordType.HOLD: ("n", "ltid", "ordinal", "name", "reason"),
}

#: Largest page :func:`run_records` returns.
MAX_PAGE: Final = 1_000


def record_row(seq: int, rtype: int, run_no: int, fields: Sequence[Any]) -> dict[str, Any]:
    """Return one record as a ``journal_records`` row (fields named, JSON-able)."""
    names = FIELD_NAMES.get(rtype)
    try:
        type_name = RecordType(rtype).name
    except ValueError:
        type_name = f"TYPE_{rtype}"
    if names is not None and len(fields) == len(names):
        data: Any = {name: jsonable(value) for name, value in zip(names, fields, strict=True)}
        ltid = fields[1] if "ltid" in names and isinstance(fields[1], int) else None
    else:
        data = {"fields": jsonable(list(fields))}
        ltid = None
    return {"seq": seq, "run_no": run_no, "rtype": type_name, "ltid": ltid, "data": data}


def run_records(
    session: Session, run_id: str, after: int = 0, limit: int = 200
) -> dict[str, Any] | None:
    """Return a page of a run's journal records after sequence number ``after``.

    Returns None for an unknown run; otherwise ``{"run_id", "records":
    [{"seq", "type", "ltid", "data"}], "next_after"}`` where ``next_after``
    is the ``after`` of the next page, or None on the last page.
    """
    run = session.execute(
        select(Run.run_no, Run.start_seq).where(Run.run_id == run_id)
    ).one_or_none()
    if run is None:
        return None
    run_no, start = run.run_no, run.start_seq or 0
    # A legacy WAL may reuse the number: the run's records lie between its
    # RUN_START and the next RUN_START with the same number.
    end = session.scalar(
        select(func.min(Run.start_seq)).where(Run.run_no == run_no, Run.start_seq > start)
    )
    after = max(after, start - 1)
    limit = max(1, min(limit, MAX_PAGE))
    rows = session.execute(
        select(JournalRecord.seq, JournalRecord.rtype, JournalRecord.ltid, JournalRecord.data)
        .where(
            JournalRecord.run_no == run_no,
            JournalRecord.seq > after,
            JournalRecord.seq < (end if end is not None else 2**63 - 1),
        )
        .order_by(JournalRecord.seq)
        .limit(limit + 1)
    ).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "run_id": run_id,
        "records": [
            {"seq": seq, "type": rtype, "ltid": ltid, "data": data}
            for seq, rtype, ltid, data in rows
        ],
        "next_after": rows[-1][0] if more else None,
    }
