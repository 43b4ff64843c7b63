"""The journal table: every WAL record of the journal, decoded, for people to read.

The projector (``projector.py``) turns records into runs, tasks and steps,
and also keeps the records themselves (``journal_records``, in the same
transaction and under the same mark), with their fields named as the
record's struct names them (:mod:`tiffany.wire.records`) by :func:`record_row`,
so the dashboard's journal table and ``GET /api/runs/{id}/events`` page
through a run's history without the WAL.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tiffany.store.models import JournalRecord, Run
from tiffany.store.records import jsonable
from tiffany.wire.records import Record, RecordType, Unknown
from tiffany.wire.shards import engine_of, seq_last

__all__ = ["record_row", "records_span", "run_records", "signal_record"]

#: Largest page :func:`run_records` returns.
MAX_PAGE: Final = 1_000


def record_row(seq: int, run_no: int, record: Record | Unknown) -> dict[str, Any]:
    """Return one record as a ``journal_records`` row (fields named, JSON-able)."""
    if isinstance(record, Unknown):
        data: Any = {"fields": jsonable(record.fields)}
        type_name, ltid = f"TYPE_{record.rtype}", None
    else:
        data = {name: jsonable(getattr(record, name)) for name in record.__struct_fields__}
        type_name, ltid = RecordType(record.rtype).name, getattr(record, "ltid", None)
    return {"seq": seq, "run_no": run_no, "rtype": type_name, "ltid": ltid, "data": data}


def records_span(session: Session, run_id: str) -> tuple[int, int, int] | None:
    """Where a run's records are: ``(run_no, first seq, seq past the last)``; None: no run."""
    run = session.execute(
        select(Run.run_no, Run.start_seq).where(Run.run_id == run_id)
    ).one_or_none()
    if run is None:
        return None
    run_no, start = run.run_no, run.start_seq or 0
    # An old WAL may reuse the number (docs/wal-format.md, compatibility), and
    # other engines have their own numbers (tiffany/wire/shards.py): the run's records
    # lie between its RUN_START and the next RUN_START with the same number,
    # within its engine's seqs.
    last = seq_last(engine_of(start))
    end = session.scalar(
        select(func.min(Run.start_seq)).where(
            Run.run_no == run_no, Run.start_seq > start, Run.start_seq <= last
        )
    )
    return run_no, start, last + 1 if end is None else end


def signal_record(session: Session, run_id: str, signal_id: str) -> tuple[int, str] | None:
    """The seq and name of the signal ``signal_id`` a run's journal holds, or None.

    A signal is journaled as a WAKE of task 0, cause ``signal``, whose value
    is ``[name, payload, signal_id]`` (``tiffany/durable/journal.py``).
    """
    span = records_span(session, run_id)
    if span is None:
        return None
    run_no, start, end = span
    rows = session.execute(
        select(JournalRecord.seq, JournalRecord.data).where(
            JournalRecord.run_no == run_no,
            JournalRecord.seq >= start,
            JournalRecord.seq < end,
            JournalRecord.rtype == RecordType.WAKE.name,
            JournalRecord.ltid == 0,
        )
    )
    for seq, data in rows:
        value = data.get("value") if isinstance(data, dict) else None
        if (
            data.get("cause") == "signal"
            and isinstance(value, list)
            and len(value) >= 3
            and value[2] == signal_id
            and isinstance(value[0], str)
        ):
            return int(seq), value[0]
    return None


def run_records(
    session: Session, run_id: str, after: int = 0, limit: int = 200
) -> dict[str, Any] | None:
    """Return a page of a run's journal records after sequence number ``after``.

    Returns None for an unknown run; otherwise ``{"run_id", "records":
    [{"seq", "type", "ltid", "data"}], "next_after"}`` where ``next_after``
    is the ``after`` of the next page, or None on the last page.
    """
    span = records_span(session, run_id)
    if span is None:
        return None
    run_no, start, end = span
    after = max(after, start - 1)
    limit = max(1, min(limit, MAX_PAGE))
    rows = session.execute(
        select(JournalRecord.seq, JournalRecord.rtype, JournalRecord.ltid, JournalRecord.data)
        .where(
            JournalRecord.run_no == run_no,
            JournalRecord.seq > after,
            JournalRecord.seq < end,
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
