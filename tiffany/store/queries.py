"""Read-side queries of the store (what ``GET /api/runs...`` serves).

Functions take a :class:`~sqlalchemy.orm.Session` and return model objects
or plain dicts; :func:`run_summary` and :func:`run_detail` give the JSON
shapes of the HTTP API contract (docs/architecture.md, "HTTP API");
:func:`run_records` (from ``journal.py``) pages a run's decoded journal
records (``/events``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    String,
    Table,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
)
from sqlalchemy.orm import Session, selectinload

from tiffany.store.graph import plan_graph
from tiffany.store.journal import run_records
from tiffany.store.models import (
    PROJECTOR_STATE_ID,
    ProjectorState,
    Run,
    RunStatus,
    Step,
    Task,
)
from tiffany.store.session import driver_errors
from tiffany.wire.entries import entry_kind, reading
from tiffany.wire.shards import engine_of, seq_base
from tiffany.wire.status import TASK_STATUS

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "TASK_STATUS",
    "RunFilter",
    "TooLarge",
    "counts_by_status",
    "get_run",
    "list_runs",
    "rerun_source",
    "run_detail",
    "run_records",
    "run_summary",
    "start_seq_of",
    "step_dict",
    "summary_select",
    "task_dict",
    "watermark",
]

#: Runs in a page when the caller does not say.
DEFAULT_PAGE_SIZE: Final = 50
#: The most runs one page returns.
MAX_PAGE_SIZE: Final = 500


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What the runs list is narrowed to (``GET /api/runs``); None: any.

    Attributes:
        name: A substring of the run's name, case-insensitive.
        q: A substring of the run's inputs as JSON text (keys and values),
            case-insensitive: ``q=ticket-42`` finds ``{"ticket": "ticket-42"}``.
        since: Runs created at or after this time (epoch seconds).
        until: Runs created at or before this time (epoch seconds).

    Discussion: plain ``LIKE`` on ``lower(...)``, the same SQL on SQLite and
    PostgreSQL. The inputs column is JSON written by msgspec (UTF-8: non-ASCII
    text is not escaped); PostgreSQL's ``json`` type (not
    ``jsonb``) keeps that text as written, so ``CAST(inputs AS TEXT)`` reads
    the same characters on both. The text asked for is escaped as a JSON
    string would be (quotes, backslashes), so it matches inside a value.
    SQLite's ``lower()`` folds ASCII letters only. Rejected: a full-text
    index (SQLite FTS5 and PostgreSQL ``tsvector`` are two schemas, and a
    substring is what an operator types).
    """

    name: str | None = None
    q: str | None = None
    since: float | None = None
    until: float | None = None

    def clauses(self) -> list[ColumnElement[bool]]:
        """The WHERE clauses of this filter (none when nothing is asked)."""
        out: list[ColumnElement[bool]] = []
        if self.name:
            out.append(func.lower(Run.name).contains(self.name.lower(), autoescape=True))
        if self.q:
            as_json = msgspec.json.encode(self.q).decode()[1:-1].lower()
            text = func.lower(cast(Run.inputs, String))
            out.append(text.contains(as_json, autoescape=True))
        if self.since is not None:
            out.append(Run.created_at >= self.since)
        if self.until is not None:
            out.append(Run.created_at <= self.until)
        return out


def list_runs(
    session: Session,
    status: str | RunStatus | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    offset: int = 0,
    where: RunFilter | None = None,
) -> list[Run]:
    """Return runs newest first (by start time, then RUN_START seq), optionally of one status.

    Args:
        session: An open session.
        status: Only runs with this status (None: all).
        limit: Page size, clamped to 1..``MAX_PAGE_SIZE``.
        offset: Runs to skip (paging).
        where: Only runs this filter keeps (name, inputs text, time range).
    """
    stmt = select(Run).order_by(Run.created_at.desc(), Run.start_seq.desc())
    if status is not None:
        stmt = stmt.where(Run.status == str(status))
    if where is not None:
        stmt = stmt.where(*where.clauses())
    stmt = stmt.limit(max(1, min(limit, MAX_PAGE_SIZE))).offset(max(0, offset))
    return list(session.scalars(stmt))


def watermark(session: Session, engine: int = 0) -> int:
    """Return the store's watermark of an engine's journal: the last seq projected.

    An engine nothing was projected of yet is at the seq before its first
    (``tiffany/wire/shards.py``; 0 for engine 0).
    """
    value = session.scalar(
        select(ProjectorState.last_seq).where(ProjectorState.id == PROJECTOR_STATE_ID + engine)
    )
    return int(value or seq_base(engine))


def start_seq_of(session: Session, run_id: str) -> int | None:
    """Return the seq of a run's RUN_START (which names its engine), or None."""
    value = session.scalar(select(Run.start_seq).where(Run.run_id == run_id))
    return None if value is None else int(value)


def get_run(session: Session, run_id: str) -> Run | None:
    """Return the run with its tasks (by ltid) and steps (plan order) loaded, or None."""
    stmt = (
        select(Run)
        .where(Run.run_id == run_id)
        .options(selectinload(Run.tasks), selectinload(Run.steps))
    )
    return session.scalars(stmt).one_or_none()


def counts_by_status(session: Session, where: RunFilter | None = None) -> dict[str, int]:
    """Return how many runs have each status (every status present, zeros included).

    With ``where``, only the runs that filter keeps are counted.
    """
    counts = {s.value: 0 for s in RunStatus}
    stmt = select(Run.status, func.count()).group_by(Run.status)
    if where is not None:
        stmt = stmt.where(*where.clauses())
    for status, n in session.execute(stmt):
        counts[status] = int(n)
    return counts


def summary_select() -> Select[Any]:
    """A SELECT of what :func:`run_summary` reads of a run, the entry's ``kind`` only.

    Discussion: a runs page read whole ``Run`` rows, decoding each run's
    entry (its plan: a 1,000-step plan is 100 kB of JSON) to show one field
    of it; a dashboard polling the list then spent most of its reads there.
    """
    return select(
        Run.run_id,
        Run.run_no,
        Run.start_seq,
        Run.name,
        Run.status,
        Run.entry["kind"].as_string().label("kind"),
        Run.created_at,
        Run.started_at,
        Run.ended_at,
        Run.updated_at,
        Run.dispatches,
        Run.last_seq,
        Run.waiting_for,
    )


def run_summary(run: Any) -> dict[str, Any]:
    """Return a run as the runs list shows it (JSON-able).

    ``run``: a ``Run``, or a row of :func:`summary_select` (its ``kind``).
    """
    kind = entry_kind(run.entry) if hasattr(run, "entry") else run.kind
    return {
        "run_id": run.run_id,
        "run_no": run.run_no,
        # Run numbers are per engine (serve --engines N): the pair names the run.
        "engine": engine_of(run.start_seq or 0),
        "name": run.name,
        "status": run.status,
        "kind": kind,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "updated_at": run.updated_at,
        "dispatches": run.dispatches,
        "last_seq": run.last_seq,
        # What its waiting tasks wait for: a signal, a tool, a function (waits.py).
        "waiting_for": getattr(run, "waiting_for", None) or [],
    }


def task_dict(task: Any) -> dict[str, Any]:
    """Return a task row as JSON-able data.

    A row read without its result (:data:`LEAN_COLUMNS`) answers ``result``
    null and ``result_size``.
    """
    lean = _lean(task, "result")
    return {
        "ltid": task.ltid,
        "parent_ltid": task.parent_ltid,
        "name": task.name,
        "kind": task.kind,
        "step_id": task.step_id,
        "state": task.state,
        "status": str(TASK_STATUS.get(task.state, task.state)),
        "blocked_on": task.blocked_on,
        "started_at": task.started_at,
        "ended_at": task.ended_at,
        "result": None if lean else task.result,
        "error": task.error,
        "last_seq": task.last_seq,
        **lean,
    }


def step_dict(step: Any) -> dict[str, Any]:
    """Return a step row as JSON-able data (read without its output: ``output_size``)."""
    lean = _lean(step, "output")
    return {
        "step_id": step.step_id,
        "position": step.position,
        "tool": step.tool,
        "status": step.status,
        "attempts": step.attempts or [],
        "output": None if lean else step.output,
        "error": step.error,
        "started_at": step.started_at,
        "ended_at": step.ended_at,
        # Why the step waits (its tool is disabled on the engine); the column
        # comes with revision 0003.
        "waiting": getattr(step, "waiting", None),
        "last_seq": step.last_seq,
        **lean,
    }


def run_detail(run: Run) -> dict[str, Any]:
    """Return a run with its entry, inputs, outputs, error, steps and tasks (JSON-able).

    The run must come from :func:`get_run` (tasks and steps loaded).
    """
    return _detail(run, run.steps, run.tasks)


class TooLarge(Exception):
    """A run has more dispatches than the read was allowed (:func:`run_detail_of`)."""


def run_detail_of(
    session: Session, run_id: str, max_dispatches: int | None = None, *, outputs: bool = True
) -> dict[str, Any] | None:
    """Return :func:`run_detail` of a run read with three plain SELECTs, or None.

    Discussion: what ``GET /api/runs/{id}`` serves. The rows are read as
    rows, not ORM objects (no identity map, no ``selectinload``): loading a
    run's objects was a large share of the API's time under read load.

    ``outputs=False`` (``?outputs=false``) reads the run without what its
    steps and tasks produced: the run's ``outputs``, each step's ``output``
    and each task's ``result`` are null, each with its size beside it
    (``outputs_size``, ``output_size``, ``result_size``: characters of its
    stored JSON; null when there is none). The values are not read from
    the database at all (:data:`LEAN_COLUMNS`). A run's result is there
    four times in a full read: the run's outputs and its planner's result,
    the step's output and its worker's result (each row carries its own),
    so a large result made an answer four times its size, at every poll of
    a waiting client.

    Raises:
        TooLarge: ``max_dispatches`` is given and the run has more (its
            steps and tasks are not read): a run's rows, and the time to
            read them, grow with its dispatches (SQLite only).
    """
    # Core, on the session's connection: the ORM's execute added a quarter to
    # each of these statements (its compile state and result setup).
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        return _detail_pipelined(conn, run_id, outputs)
    run_row, step_rows, task_rows = _ROWS[outputs]
    run = conn.execute(run_row, {"run_id": run_id}).one_or_none()
    if run is None:
        return None
    if max_dispatches is not None and (run.dispatches or 0) > max_dispatches:
        raise TooLarge(run_id)
    steps = conn.execute(step_rows, {"run_id": run_id}).all()
    tasks = conn.execute(task_rows, {"run_id": run_id}).all()
    return _detail(run, steps, tasks)


def _detail_pipelined(conn: Connection, run_id: str, outputs: bool = True) -> dict[str, Any] | None:
    """:func:`run_detail_of` on PostgreSQL: the three SELECTs in one round trip.

    psycopg's pipeline sends them together and reads their results after
    one sync. Each round trip of a read in the API's threadpool ends with
    its thread waiting for the GIL in a busy process: three of them were
    most of the slowest reads' time under load, against little work. The
    rows are the driver's, with the engine's JSON loader (SQLAlchemy sets it
    on the connection).
    """
    from psycopg.rows import namedtuple_row

    sqls = _pipelined_sql(conn.dialect, outputs)
    params = {"run_id": run_id}
    with driver_errors(conn, sqls[0], params) as raw:
        driver = raw.driver_connection
        cursors = [driver.cursor(row_factory=namedtuple_row) for _ in sqls]
        try:
            with driver.pipeline():
                for cursor, sql in zip(cursors, sqls, strict=True):
                    cursor.execute(sql, params)
            run = cursors[0].fetchone()
            if run is None:
                return None
            return _detail(run, cursors[1].fetchall(), cursors[2].fetchall())
        finally:
            for cursor in cursors:
                cursor.close()


async def run_detail_async(
    conn: Any, dialect: Any, run_id: str, *, outputs: bool = True
) -> dict[str, Any] | None:
    """:func:`run_detail_of` on an asyncio psycopg connection (the API's loop), or None.

    The same three SELECTs as :func:`_detail_pipelined`, in one pipeline:
    one round trip, awaited on the event loop instead of a thread
    (``tiffany.ports.reads.PgReads``). ``dialect``: the store engine's, which
    compiles them; the connection decodes JSON as the store's engine does
    (``msgspec``: ``ApiState``'s pool sets it).
    """
    from psycopg.rows import namedtuple_row

    sqls = _pipelined_sql(dialect, outputs)
    params = {"run_id": run_id}
    cursors = [conn.cursor(row_factory=namedtuple_row) for _ in sqls]
    try:
        async with conn.pipeline():
            for cursor, sql in zip(cursors, sqls, strict=True):
                await cursor.execute(sql, params)
        run = await cursors[0].fetchone()
        if run is None:
            return None
        return _detail(run, await cursors[1].fetchall(), await cursors[2].fetchall())
    finally:
        for cursor in cursors:
            await cursor.close()


@functools.cache
def _pipelined_sql(dialect: Any, outputs: bool = True) -> tuple[str, str, str]:
    """The run's, its steps' and its tasks' SELECTs as the driver's SQL (``%(run_id)s``)."""
    return tuple(str(q.compile(dialect=dialect)) for q in _ROWS[outputs])  # type: ignore[return-value]


#: What a read without outputs leaves out, by table: the column, and the
#: field of its size (``run_detail_of(outputs=False)``).
LEAN_COLUMNS: Final = {"runs": "outputs", "steps": "output", "tasks": "result"}


def _columns(table: Any, outputs: bool) -> list[Any]:
    """The table's columns; without ``outputs``, its output column's size instead of it."""
    assert isinstance(table, Table)
    if outputs:
        return list(table.c)
    name = LEAN_COLUMNS[table.name]
    col = table.c[name]
    text = cast(col, Text)
    # A JSON null (how the ORM stores None) is no value: no size. A literal, not
    # a bound parameter: the pipelined reads compile these SELECTs to SQL once.
    null = literal_column("'null'", Text)
    size = case((text == null, None), else_=func.length(text)).label(f"{name}_size")
    return [c for c in table.c if c.name != name] + [size]


def _rows(outputs: bool) -> tuple[Select[Any], Select[Any], Select[Any]]:
    """The SELECTs of a run's detail: its row, its steps', its tasks'."""
    run_id: Any = bindparam("run_id")
    return (
        select(*_columns(Run.__table__, outputs)).where(Run.run_id == run_id),
        select(*_columns(Step.__table__, outputs))
        .where(Step.run_id == run_id)
        .order_by(Step.position),
        select(*_columns(Task.__table__, outputs)).where(Task.run_id == run_id).order_by(Task.ltid),
    )


#: The detail's SELECTs, with outputs (True) and without (False).
_ROWS: Final = {True: _rows(True), False: _rows(False)}


def _lean(row: Any, name: str) -> dict[str, Any]:
    """``{"<name>_size": N}`` for a row read without ``name`` (:data:`LEAN_COLUMNS`), else {}."""
    field = f"{name}_size"
    return {field: getattr(row, field)} if hasattr(row, field) else {}


def rerun_source(session: Session, run_id: str) -> dict[str, Any] | None:
    """What a re-run of ``run_id`` starts from, or None for an unknown run.

    ``{"status", "entry", "start_seq", "steps": {step_id: {"status", "output", "run_id",
    "seq"}}, "after": {step_id: [...]}}``: the run's entry (plan and inputs), the
    WAL seq of its RUN_START (where a workflow's re-run reads its journal),
    and each step's state, with where its output was recorded: this run and
    the WAL seq of its worker's exit (the record that settled it), or, for a
    step this run itself reused, the run and seq it was reused from; and the
    DAG the run built (:func:`~tiffany.store.graph.plan_graph`).
    """
    # Core, on the session's connection: rows of columns need no ORM loading,
    # which cost a 1,000-step run's re-run a quarter of this read.
    conn = session.connection()
    run = conn.execute(
        select(Run.status, Run.entry, Run.start_seq).where(Run.run_id == run_id)
    ).one_or_none()
    if run is None:
        return None
    exits = dict(
        conn.execute(
            select(Task.step_id, func.max(Task.last_seq))
            .where(Task.run_id == run_id, Task.kind == "worker", Task.step_id.is_not(None))
            .group_by(Task.step_id)
        ).all()
    )
    steps: dict[str, Any] = {}
    for step_id, status, output, attempts in conn.execute(
        select(Step.step_id, Step.status, Step.output, Step.attempts).where(Step.run_id == run_id)
    ):
        first = attempts[0] if isinstance(attempts, list) and attempts else None
        origin = first.get("reused") if isinstance(first, dict) else None
        if not isinstance(origin, dict):
            origin = {"run_id": run_id, "seq": exits.get(step_id)}
        steps[step_id] = {"status": status, "output": output, **origin}
    typed = reading(run.entry)
    outputs = {sid: s["output"] for sid, s in steps.items()}
    graph = plan_graph(typed.plan_doc if typed is not None else None, outputs)
    after = {sid: node.after for sid, node in graph.items()}
    return {
        "status": run.status,
        "entry": run.entry,
        "start_seq": run.start_seq,
        "steps": steps,
        "after": after,
    }


def _detail(run: Any, steps: Iterable[Any], tasks: Iterable[Any]) -> dict[str, Any]:
    lean = _lean(run, "outputs")
    return {
        **run_summary(run),
        "entry": run.entry,
        "inputs": run.inputs,
        "outputs": None if lean else run.outputs,
        "error": run.error,
        "usage": getattr(run, "usage", None),
        "steps": _with_graph(run.entry, [step_dict(s) for s in steps]),
        "tasks": [task_dict(t) for t in tasks],
        **lean,
    }


def _with_graph(entry: Any, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``steps`` with each one's place in the run's graph: ``after``, ``added_by``, ``dynamic``.

    A plan run's graph (:func:`~tiffany.store.graph.plan_graph`): the steps
    it runs after, the dynamic step that added it (None: the plan's), and
    whether its output adds steps. A step of no plan (a workflow's) has none.
    """
    typed = reading(entry)
    plan = typed.plan_doc if typed is not None else None
    graph = plan_graph(plan, {s["step_id"]: s["output"] for s in steps})
    for s in steps:
        node = graph.get(s["step_id"])
        s["after"] = node.after if node is not None else []
        s["added_by"] = node.added_by if node is not None else None
        s["dynamic"] = node.dynamic if node is not None else False
    return steps
