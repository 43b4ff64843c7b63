"""The projector: journal records in, rows of runs, tasks and steps out.

The engine hands :meth:`Projector.apply` batches of journal records it has
already decoded, ``(seq, rtype, run_no, record)`` (the typed structs of
:mod:`tiffany.records`); the store never reads the WAL itself (it sits
below the durable layer). ``tiffany db rebuild`` feeds the same method
from the start of the WAL, so a rebuilt store and one projected
incrementally are row for row the same.

Invariants:

* Idempotent by sequence number: a batch is applied in one transaction
  that also moves ``projector_state.last_seq``; records at or below the
  mark are skipped. A crash between the WAL and the database therefore
  never counts a record twice: the projector process reads on from the
  mark, and drops what it already has.
* Deterministic: every value comes from the records (times are the run's
  journal clock, not the database's), so a rebuild reproduces the rows.
* Batch-friendly: a batch's changes are merged per row in dicts, then
  flushed with one INSERT per table and one UPDATE per (table, set of
  columns), each an executemany.

What the journal says, and what the projection makes of it:

* ``RUN_START``: a ``running`` run; for a plan run, a ``pending`` step per
  declared step.
* ``SPAWN``: a ``ready`` task whose kind, step and tool are the record's
  ``role``, ``step_id`` and ``tool`` (the plan run's root is the
  ``planner``); a worker's spawn marks its step ``running``.
* ``DISPATCH``: the run's dispatch count; a call that blocks (``sleep``,
  ``wait_task``, ``step``...) makes the task ``blocked_*`` with what it
  waits on, anything else ``running``. A ``SPAWN``, ``OUTCOME``,
  ``STEP_START`` or ``TASK_EXIT`` whose ``n`` is above the run's dispatch
  count stands for the DISPATCH the journal did not write (``NewTask``,
  ``Now()``/``Random()``, ``Step``, a task's final ``return``;
  ``tiffany.records.carried``) and is applied as that dispatch too, so
  the rows are the same either way.
* ``WAKE``: the task is ``ready`` again. ``OUTCOME`` of ``Now()``: the run's
  clock moves (task and step start and end times are read from it); so does
  a worker's exit, to its last attempt's end (a python step's attempt reads
  no ``Now()``: its times come with the step's result).
* ``TASK_EXIT``: ``done``, ``crashed`` or ``cancelled`` with the result or
  error. A worker's result (its ``StepOutcome``, a dict in the journal)
  settles its step; a tool task's result is the step's latest output.
* ``HOLD``: the engine held the task's step back (its tool is disabled
  there): the task is blocked on ``waiting: REASON`` and its step's
  ``waiting`` column holds the reason, until the task's STEP_START (a later
  engine started the step), the step's end or the run's.
* ``RUN_END``: the run's status, outputs or error; for a plan run, the
  root's step summary (in its result, or in the ``PlanFailed`` error's
  fields) is final: status, error and attempts of every step. Steps a
  cancelled run never finished are ``skipped``.

Nothing journaled stops the projection (docs/store.md): a batch that fails
with a deterministic error (a constraint, a value SQL refuses, a bug:
anything but a transient database error, :func:`is_transient`) is split in
halves, each applied on its own, down to the one record that fails; that
record is quarantined in ``dead_letters`` (its seq, run, type, the error
and a bounded excerpt), the mark moves past it, and the rest is applied.
Transient errors propagate: the caller retries the batch, and the mark
makes the retry skip what was kept. A rebuild quarantines the same records
as the incremental projection, so the two stay row for row the same.

Run identity: records name their run by ``run_no``; a WAL written before
run numbers were reserved per data dir may hold several runs with one
number. A record belongs to the latest RUN_START with its number (as
``tiffany/durable/history.py`` reads it); ``runs.start_seq`` keeps the
runs apart and orders them.

Discussion: a task's state between records is a guess the journal cannot
settle: a wake-up from inside the run (a joined task ending, a queue put)
is not journaled, so a ``blocked_join`` task shows as blocked until its
next dispatch. That next dispatch usually follows in the same group
commit, so the store is at most one batch behind the truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Engine,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy import update as sql_update

from tiffany.errors import TiffanyError
from tiffany.records import (
    MAX_ARG_CHARS,
    SLOT_SIGNAL,
    Dispatch,
    Hold,
    Outcome,
    Record,
    RecordType,
    RunEnd,
    RunStart,
    Spawn,
    StepStart,
    TaskExit,
    Undecodable,
    Unknown,
    Wake,
    as_list,
    carried,
    root_role,
)
from tiffany.shards import seq_base, seq_last
from tiffany.store import pgflush
from tiffany.store.journal import record_row
from tiffany.store.models import (
    PROJECTED_CHANNEL,
    PROJECTOR_STATE_ID,
    DeadLetter,
    JournalRecord,
    ProjectorState,
    Run,
    RunStatus,
    Step,
    StepStatus,
    Task,
    TaskKind,
    TaskState,
)
from tiffany.store.records import (
    BLOCKING_KINDS,
    attempt_times,
    error_dict,
    excerpt,
    jsonable,
    text,
)
from tiffany.store.rows import Batch, driver, mark_sql

__all__ = [
    "PROJECTED_CHANNEL",
    "ApplyReport",
    "Decoded",
    "Projector",
    "StoreJournalMismatch",
    "is_transient",
]


#: Finished runs whose context is kept in memory (more are reloaded on demand).
MAX_CACHED_FINISHED_RUNS: Final = 256
#: The longest error message a dead letter keeps, in characters.
MAX_ERROR_CHARS: Final = 1_000

_EXIT_STATES: Final = {s.value: s for s in (TaskState.DONE, TaskState.CRASHED, TaskState.CANCELLED)}
_RUN_END_STATUSES: Final = {
    s.value: s for s in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
}
_UNSETTLED_STEPS: Final = (StepStatus.PENDING.value, StepStatus.RUNNING.value)
_PENDING: Final = StepStatus.PENDING.value
_SUCCEEDED: Final = StepStatus.SUCCEEDED.value
_RUNNING: Final = StepStatus.RUNNING.value
_STEP_STATUSES: Final = frozenset(s.value for s in StepStatus)
_ROLES: Final = frozenset(k.value for k in TaskKind)

#: ``steps.waiting`` (why a step waits) exists in this schema (revision 0003 on).
_HAS_WAITING: Final = "waiting" in Step.__table__.c
_HAS_USAGE: Final = "usage" in Run.__table__.c

#: A decoded journal record: ``(seq, rtype, run_no, record)``.
Decoded = tuple[int, int, int, Record | Unknown | Undecodable]

#: Database errors that say nothing about the batch: the connection, a lock,
#: a server restarting, a full disk; also the schema or the grants being
#: wrong (ProgrammingError: an undefined column, permission denied) and the
#: server's internal errors, which would otherwise dead-letter every record.
#: The batch is retried as it is, and the engine reports the store stalled.
_TRANSIENT: Final = (
    sa_exc.OperationalError,
    sa_exc.ProgrammingError,
    sa_exc.InternalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    ConnectionError,
    OSError,
    pgflush.MarkMoved,  # another projector wrote first: read the mark again
)


def _describe(error: BaseException) -> str:
    """``TypeName: message`` of an error, bounded and sanitized."""
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 - a hostile __str__
        message = excerpt(error)
    return excerpt(f"{type(error).__name__}: {message[:MAX_ERROR_CHARS]}")


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` is a database error worth retrying (not the records' fault).

    Everything else (IntegrityError, DataError, RecursionError, TypeError,
    ValueError, a bug) fails the same way again: the projector quarantines
    the record instead of retrying it.
    """
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, _TRANSIENT)


def _add_usage(ctx: _RunCtx, output: Any) -> bool:
    """Add a step's model usage (an ``llm`` or ``agent`` output) to its run's; True if any.

    The same sums as the planner's budget (``tiffany/agents/planner.py``:
    ``usage.total_tokens`` and ``cost_usd``), for every run: a run with a
    budget also reports its total in its RUN_END, which then stands.
    """
    if not isinstance(output, Mapping):
        return False
    used = output.get("usage")
    tokens = used.get("total_tokens") if isinstance(used, Mapping) else None
    cost = output.get("cost_usd")
    if isinstance(tokens, bool) or not isinstance(tokens, int | float):
        tokens = None
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        cost = None
    if tokens is None and cost is None:
        return False
    usage = ctx.usage if ctx.usage is not None else {"tokens": 0, "usd": 0.0}
    if tokens is not None:
        usage["tokens"] += tokens
    if cost is not None:
        usage["usd"] = round(usage["usd"] + cost, 8)
    ctx.usage = usage
    return True


@dataclass(slots=True)
class _StepInfo:
    status: str
    tool: str | None


@dataclass(slots=True)
class _RunCtx:
    """What the projector keeps of a run between records (reloadable from the rows)."""

    run_id: str
    plan: bool
    root: str  # the root task's role (records.root_role): for SPAWNs that lack one
    clock: float | None
    dispatches: int
    finished: bool
    tasks: dict[int, tuple[str, str | None]] = field(default_factory=dict)  # ltid -> kind, step
    held: set[int] = field(default_factory=set)  # ltids whose step a HOLD record held back
    receiving: set[int] = field(default_factory=set)  # ltids whose step waits for a signal
    steps: dict[str, _StepInfo] = field(default_factory=dict)
    #: The model usage of its steps so far (``{"tokens", "usd"}``), or None
    #: before a step reported any: the run's row shows it (``runs.usage``).
    usage: dict[str, float] | None = None


@dataclass(slots=True)
class ApplyReport:
    """What one :meth:`Projector.apply` did."""

    applied: int = 0
    skipped: int = 0  # at or below the mark: already applied
    orphans: int = 0  # records of a run whose start the store never saw
    quarantined: list[int] = field(default_factory=list)  # seqs sent to dead_letters
    last_seq: int = 0
    statements: int = 0

    def add(self, other: ApplyReport) -> None:
        """Count ``other`` (a later transaction of the same batch) in."""
        self.applied += other.applied
        self.skipped += other.skipped
        self.orphans += other.orphans
        self.quarantined += other.quarantined
        self.last_seq = max(self.last_seq, other.last_seq)
        self.statements += other.statements


def _fields(rec: Record | Unknown | Undecodable) -> Any:
    """What a dead letter's excerpt shows of a record: its fields, or why it did not decode."""
    return rec.error if isinstance(rec, Undecodable) else as_list(rec)


class Projector:
    """Apply decoded journal records to the store.

    Args:
        engine: The store's engine; the schema must exist (``tiffany db upgrade``).
        journal: The journal this projector applies (``file:<hex>``, a WAL's
            name; ``postgres:<stream>``; None, a WAL written before WALs were
            named): an empty store is claimed for it, and a
            store holding another journal's rows is refused
            (:class:`StoreJournalMismatch`), unless ``claim`` is false (a
            rebuild, which empties the store first).
        shard: The engine whose journal this is (``tiffany/shards.py``): its
            seqs, and its row of ``projector_state`` (the mark), are its own,
            so the projectors of several engines share one store.
        reaches: ``reaches(seq)``: whether the journal holds a record at or
            after ``seq``; a store whose mark the journal does not reach is
            refused (see :func:`_claim`). None: not checked.

    One projector writes an engine's rows at a time (that engine's projector
    process, or ``tiffany db rebuild``); the mark is read with ``FOR UPDATE``
    in each transaction, so a second one would wait rather than double-apply.
    """

    def __init__(
        self,
        engine: Engine,
        journal: str | None = None,
        *,
        claim: bool = True,
        shard: int = 0,
        reaches: Callable[[int], bool] | None = None,
    ) -> None:
        self.engine = engine
        self.shard = shard
        self._notify = engine.dialect.name == "postgresql"
        self._state_id = PROJECTOR_STATE_ID + shard
        self._base, self._last = seq_base(shard), seq_last(shard)
        #: The mark, read and locked at the start of each batch's transaction.
        self._lock_stmt = (
            select(ProjectorState.last_seq)
            .where(ProjectorState.id == self._state_id)
            .with_for_update()
        )
        #: The mark's statements as the driver's SQL (one string each, no
        #: statement built or compiled a transaction), or None on a driver the
        #: fast path does not know.
        self._mark_sql = mark_sql(engine.dialect, self._notify)
        #: The mark as this projector last wrote it (None: unknown). PostgreSQL:
        #: a batch is one statement in autocommit (:meth:`_statement`) that
        #: moves the mark from it (None: read it first); SQLite: a mark read
        #: at a batch's start that is not it means another projector wrote,
        #: and what memory holds of the rows is dropped.
        self._one_statement = self._notify and self._mark_sql is not None
        self._mark: int | None = None
        self._run_ids: dict[int, str] = {}
        self._run_ids_stale = False
        self._ctx: dict[int, _RunCtx] = {}
        #: Runs that finished in memory since the last eviction (:meth:`_evict`).
        self._finished = 0
        #: Records in ``dead_letters`` (kept up to date by :meth:`apply`).
        self.dead_letters = 0
        with engine.begin() as conn:
            self._ensure_state(conn)
            if claim:
                _claim(conn, journal, self._state_id, reaches)
            self._load_run_ids(conn)
            self.dead_letters = int(conn.scalar(select(func.count()).select_from(DeadLetter)) or 0)

    # -- public ----------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The sequence number of the last record applied (0 for an empty store)."""
        with self.engine.connect() as conn:
            value = conn.scalar(
                select(ProjectorState.last_seq).where(ProjectorState.id == self._state_id)
            )
        return int(value or self._base)

    def apply(self, batch: Iterable[Decoded]) -> ApplyReport:
        """Apply ``(seq, rtype, run_no, record)`` records; quarantine those that fail.

        Records at or below the last applied sequence number are skipped.
        The batch is one transaction; if it fails deterministically it is
        bisected and the record that fails is quarantined (see the module
        docstring). A transient database error propagates with nothing of
        the failed transaction kept; retrying the same batch is safe.
        """
        report = ApplyReport()
        self._isolate(list(batch), report)
        self.dead_letters += len(report.quarantined)
        self._evict()
        return report

    def _isolate(self, records: list[Decoded], report: ApplyReport) -> None:
        try:
            report.add(self._transaction(records))
        except Exception as exc:
            if is_transient(exc):
                raise
            if len(records) == 1:
                report.add(self._quarantine(records[0], exc))
                return
            mid = len(records) // 2
            self._isolate(records[:mid], report)
            self._isolate(records[mid:], report)

    def _transaction(self, batch: list[Decoded]) -> ApplyReport:
        if self._one_statement:
            return self._statement(batch)
        report = ApplyReport()
        try:
            with self.engine.begin() as conn:
                mark = self._lock_mark(conn)
                if self._mark is not None and mark != self._mark:
                    self._forget()  # another projector wrote since: its rows, not our memory
                if self._run_ids_stale:
                    self._load_run_ids(conn)
                changes = self._collect(conn, batch, mark, report)
                report.statements = changes.flush(conn)
                self._move_mark(conn, mark, report)
            self._mark = report.last_seq
        except BaseException:
            self._forget()
            raise
        return report

    def _statement(self, batch: list[Decoded]) -> ApplyReport:
        """:meth:`_transaction` on PostgreSQL: the batch is one statement (``pgflush``)."""
        report = ApplyReport()
        try:
            with self.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT")
                if self._mark is None:  # its lock ends with the statement (autocommit)
                    self._mark = self._lock_mark(conn)
                mark = self._mark
                if self._run_ids_stale:
                    self._load_run_ids(conn)
                changes = self._collect(conn, batch, mark, report)
                if report.last_seq > mark:
                    moved = (report.last_seq, self._state_id, mark)
                    notify = (PROJECTED_CHANNEL, f"{self.shard} {report.last_seq}")
                    report.statements = changes.flush(conn, moved, notify)
                    self._mark = report.last_seq
        except BaseException:
            self._forget()
            raise
        return report

    def _collect(
        self, conn: Connection, batch: list[Decoded], mark: int, report: ApplyReport
    ) -> Batch:
        """Apply the records after ``mark`` to a new :class:`Batch` of row changes."""
        report.last_seq = mark
        changes = Batch()
        for seq, _rtype, run_no, rec in batch:
            if seq <= report.last_seq:
                report.skipped += 1
                continue
            report.last_seq = seq
            if isinstance(rec, Undecodable):
                raise rec.error
            changes.records.append(record_row(seq, run_no, rec))
            changes.at(seq)
            if self._apply_one(conn, changes, seq, run_no, rec):
                report.applied += 1
            else:
                report.orphans += 1
        return changes

    def _quarantine(self, record: Decoded, error: BaseException) -> ApplyReport:
        """Put one record that fails on its own into ``dead_letters``; move the mark past it."""
        seq, rtype, run_no, rec = record
        report = ApplyReport()
        try:
            with self.engine.begin() as conn:
                mark = self._lock_mark(conn)
                report.last_seq = mark
                if seq <= mark:
                    report.skipped += 1
                    return report
                if self._run_ids_stale:
                    self._load_run_ids(conn)
                if rtype == RecordType.RUN_START:
                    run_id: str | None = text(rec.run_id) if isinstance(rec, RunStart) else None
                    self._run_ids.pop(run_no, None)  # its records are orphans now
                else:
                    run_id = self._run_ids.get(run_no)
                at = None
                if run_id is not None:
                    at = conn.scalar(select(Run.updated_at).where(Run.run_id == run_id))
                try:
                    type_name = RecordType(rtype).name
                except ValueError:
                    type_name = f"TYPE_{rtype}"
                conn.execute(
                    insert(DeadLetter).values(
                        seq=seq,
                        run_id=run_id[:128] if run_id else None,
                        run_no=run_no,
                        rtype=type_name,
                        error=_describe(error),
                        excerpt=excerpt(_fields(rec)),
                        at=float(at) if at is not None else 0.0,
                    )
                )
                report.last_seq = seq
                report.quarantined.append(seq)
                self._move_mark(conn, mark, report)
                self._mark = None  # moved here: read again by the next batch
        except BaseException:
            self._forget()
            raise
        return report

    def _move_mark(self, conn: Connection, mark: int, report: ApplyReport) -> None:
        if report.last_seq > mark and self._mark_sql is not None:
            # One statement: on PostgreSQL the notification rides in it.
            last = report.last_seq
            params: tuple[Any, ...] = (last, self._state_id)
            if self._notify:
                params += (PROJECTED_CHANNEL, f"{self.shard} {last}")
            driver(conn, self._mark_sql[1], params)
            report.statements += 1
        elif report.last_seq > mark:
            conn.execute(
                sql_update(ProjectorState)
                .where(ProjectorState.id == self._state_id)
                .values(last_seq=report.last_seq)
            )
            report.statements += 1
            if self._notify:
                # On PostgreSQL, API replicas on any host learn the mark at the
                # commit (``min_seq`` reads: tiffany/api/db_requests.py).
                payload = f"{self.shard} {report.last_seq}"
                conn.execute(select(func.pg_notify(PROJECTED_CHANNEL, payload)))
                report.statements += 1

    def reset(self, journal: str | None = None) -> None:
        """Delete this engine's projected rows and set its mark back (before a rebuild).

        Its row then projects ``journal`` (None: whichever projector claims it first).
        """
        lo, hi = self._base, self._last
        try:
            with self.engine.begin() as conn:
                self._lock_mark(conn)
                runs = select(Run.run_id).where(self._own_runs())
                for model in (Step, Task):
                    conn.execute(delete(model).where(model.run_id.in_(runs)))
                conn.execute(delete(Run).where(Run.run_id.in_(runs)))
                for seqs in (DeadLetter, JournalRecord):
                    conn.execute(delete(seqs).where(seqs.seq > lo, seqs.seq <= hi))
                conn.execute(
                    sql_update(ProjectorState)
                    .where(ProjectorState.id == self._state_id)
                    .values(last_seq=lo, journal=journal)
                )
        finally:
            self._forget()
        self.dead_letters = 0

    # -- records ---------------------------------------------------------------

    def _apply_one(
        self,
        conn: Connection,
        b: Batch,
        seq: int,
        run_no: int,
        rec: Record | Unknown,
    ) -> bool:
        cls = rec.__class__
        # Its journal row (just made) holds its fields made JSON-able already:
        # a value is walked once, not once for the row and again for each
        # column that shows it (a step's output was walked three times).
        row = b.records[-1] if b.records and b.records[-1]["seq"] == seq else None
        if cls is RunStart:
            self._run_start(b, seq, run_no, rec, row)  # type: ignore[arg-type]
            return True
        ctx = self._context(conn, run_no)
        if ctx is None:
            return False
        b.runs.update((ctx.run_id,), last_seq=seq)
        if cls is Unknown:
            return True  # a record type this code does not know shows in the journal only
        implied = carried(rec, ctx.dispatches)  # type: ignore[arg-type]
        if implied is not None:
            self._dispatch(b, ctx, implied)
        if cls is Dispatch:
            self._dispatch(b, ctx, rec)  # type: ignore[arg-type]
        elif cls is Spawn:
            self._spawn(b, ctx, rec)  # type: ignore[arg-type]
        elif cls is Wake:
            if rec.ltid in ctx.tasks:  # type: ignore[union-attr]
                key = (ctx.run_id, rec.ltid)  # type: ignore[union-attr]
                b.tasks.update(key, state=TaskState.READY.value, blocked_on=None)
            elif _is_slot(rec) and not ctx.finished:  # a queued run got its slot
                b.runs.update((ctx.run_id,), status=RunStatus.RUNNING.value)
        elif cls is Outcome:
            self._outcome(b, ctx, rec)  # type: ignore[arg-type]
        elif cls is TaskExit:
            self._task_exit(b, ctx, rec, _made(row, "value", rec))  # type: ignore[arg-type]
        elif cls is RunEnd:
            self._run_end(b, ctx, rec, _made(row, "value", rec))  # type: ignore[arg-type]
        elif cls is StepStart:
            if ctx.held:
                self._step_held(b, ctx, rec.ltid, None, rec.name)  # type: ignore[union-attr]
        elif cls is Hold:
            self._step_held(b, ctx, rec.ltid, text(rec.reason), rec.name)  # type: ignore[union-attr]
        return True

    def _outcome(self, b: Batch, ctx: _RunCtx, rec: Outcome) -> None:
        value = rec.value
        if rec.kind == "now" and isinstance(value, int | float) and not isinstance(value, bool):
            self._tick(b, ctx, float(value))

    def _run_start(
        self, b: Batch, seq: int, run_no: int, rec: RunStart, row: dict[str, Any] | None
    ) -> None:
        run_id, name, entry, ts = rec.run_id, rec.name, rec.entry, rec.ts
        entry = entry if isinstance(entry, Mapping) else {}
        data = row["data"] if row is not None else None
        entry_json = (
            data["entry"] if isinstance(data, dict) and "entry" in data else jsonable(entry)
        )
        plan_doc = entry.get("plan") if entry.get("kind") == "plan" else None
        plan = isinstance(plan_doc, Mapping)
        clock = float(ts) if isinstance(ts, int | float) else None
        if plan:
            assert isinstance(plan_doc, Mapping)
            defaults = plan_doc.get("inputs")
            given = entry.get("inputs")
            inputs: Any = {
                **(defaults if isinstance(defaults, Mapping) else {}),
                **(given if isinstance(given, Mapping) else {}),
            }
        else:
            inputs = {"args": entry.get("args", []), "kwargs": entry.get("kwargs", {})}
        ctx = _RunCtx(text(run_id), plan, root_role(entry), clock, 0, False)
        self._run_ids[run_no] = ctx.run_id
        self._ctx[run_no] = ctx
        b.runs.insert(
            (ctx.run_id,),
            {
                "run_no": run_no,
                "name": text(name),
                # Queued behind a concurrency limit until its slot's signal.
                "status": (
                    RunStatus.PENDING.value if entry.get("concurrency") else RunStatus.RUNNING.value
                ),
                "entry": entry_json,
                "inputs": jsonable(inputs),
                "created_at": clock if clock is not None else 0.0,
                "started_at": clock,
                "updated_at": clock,
                "dispatches": 0,
                "last_seq": seq,
                "start_seq": seq,
            },
        )
        if plan:
            assert isinstance(plan_doc, Mapping)
            # A re-run's steps settled from an earlier run (tiffany/agents/rerun.py),
            # made JSON-able already: each row is made settled, not made and changed.
            reuse = entry_json.get("reuse") if isinstance(entry_json, Mapping) else None
            reused = _reused(reuse, ctx.clock) if isinstance(reuse, Mapping) else {}
            steps = plan_doc.get("steps")
            for spec in steps if isinstance(steps, list) else ():
                if isinstance(spec, Mapping) and isinstance(spec.get("id"), str):
                    tool = spec.get("tool")
                    tool = text(tool) if isinstance(tool, str) else None
                    step_id = text(spec["id"])
                    self._new_step(b, ctx, step_id, tool, reused.get(step_id))
            for step_id, settled in reused.items():  # a dynamic step's children
                if step_id not in ctx.steps:
                    self._new_step(b, ctx, step_id, None, settled)

    def _spawn(self, b: Batch, ctx: _RunCtx, rec: Spawn) -> None:
        ltid, parent, name = rec.ltid, rec.parent_ltid, text(rec.name)
        role = rec.role if rec.role is not None else ctx.root
        kind = TaskKind(role) if role in _ROLES else TaskKind.TASK
        step_id = text(rec.step_id) if ctx.plan and rec.step_id is not None else None
        ctx.tasks[ltid] = (kind.value, step_id)
        b.tasks.insert(
            (ctx.run_id, ltid),
            {
                "parent_ltid": parent or None,
                "name": name,
                "kind": kind.value,
                "step_id": step_id,
                "state": TaskState.READY.value,
                "started_at": ctx.clock,
            },
        )
        if step_id is None:
            return
        step = ctx.steps.get(step_id)
        if step is None:
            step = self._new_step(b, ctx, step_id, None)
        if kind is TaskKind.WORKER and step.status == _PENDING:
            step.status = _RUNNING
            b.steps.update((ctx.run_id, step_id), status=step.status, started_at=ctx.clock)
        elif kind is TaskKind.TOOL and step.tool is None and rec.tool is not None:
            step.tool = text(rec.tool)
            b.steps.update((ctx.run_id, step_id), tool=step.tool)

    def _dispatch(self, b: Batch, ctx: _RunCtx, rec: Dispatch) -> None:
        n, ltid, kind, arg = rec.n, rec.ltid, rec.kind, rec.arg
        if n > ctx.dispatches:
            ctx.dispatches = n
            b.runs.update((ctx.run_id,), dispatches=n)
        if ltid not in ctx.tasks:
            return
        blocked = BLOCKING_KINDS.get(kind)
        if blocked is None:
            b.tasks.update((ctx.run_id, ltid), state=TaskState.RUNNING.value, blocked_on=None)
        else:
            on = text(kind if arg is None else f"{kind} {arg}")
            b.tasks.update((ctx.run_id, ltid), state=blocked.value, blocked_on=on)
        if kind == "receive":
            self._step_waits(b, ctx, ltid, text(f"signal {arg}"))
        elif ctx.receiving and ltid in ctx.receiving:
            self._step_waits(b, ctx, ltid, None)

    def _step_waits(self, b: Batch, ctx: _RunCtx, ltid: int, waiting: str | None) -> None:
        """A worker's step waits for a signal (``signal NAME``), or no longer (None)."""
        if waiting is None:
            ctx.receiving.discard(ltid)
        else:
            ctx.receiving.add(ltid)
        step_id = ctx.tasks[ltid][1]
        if _HAS_WAITING and step_id is not None and step_id in ctx.steps:
            b.steps.update((ctx.run_id, step_id), waiting=waiting)

    def _step_held(self, b: Batch, ctx: _RunCtx, ltid: Any, reason: str | None, name: Any) -> None:
        """A HOLD (``reason``): the task waits, and so does its step; a STEP_START ends it."""
        known = ctx.tasks.get(ltid)
        if known is None or (reason is None and ltid not in ctx.held):
            return
        if reason is None:
            ctx.held.discard(ltid)
            on = text(f"step {str(name)[:MAX_ARG_CHARS]}")
        else:
            ctx.held.add(ltid)
            on = f"waiting: {reason}"
        b.tasks.update((ctx.run_id, ltid), blocked_on=on)
        step_id = known[1]
        if _HAS_WAITING and step_id is not None and step_id in ctx.steps:
            b.steps.update((ctx.run_id, step_id), waiting=reason)

    def _task_exit(self, b: Batch, ctx: _RunCtx, rec: TaskExit, made: Any) -> None:
        """A task's exit; ``made`` is ``jsonable(rec.value)`` (its journal row's)."""
        ltid, state, value = rec.ltid, rec.state, rec.value
        known = ctx.tasks.get(ltid)
        final = _EXIT_STATES.get(state)
        if known is None or final is None:
            return
        if known[0] == TaskKind.WORKER.value and isinstance(value, Mapping):
            # A python step's attempt reads no Now(): its end time, journaled in
            # the worker's outcome, moves the run's clock instead.
            attempts = value.get("attempts")
            last = attempts[-1] if isinstance(attempts, list) and attempts else None
            ended = last.get("ended_at") if isinstance(last, Mapping) else None
            if isinstance(ended, int | float) and not isinstance(ended, bool):
                self._tick(b, ctx, float(ended))
        key = (ctx.run_id, ltid)
        if final is TaskState.DONE:
            b.tasks.update(key, state=final.value, blocked_on=None, ended_at=ctx.clock, result=made)
        else:
            b.tasks.update(
                key, state=final.value, blocked_on=None, ended_at=ctx.clock, error=error_dict(value)
            )
        kind, step_id = known
        if step_id is None or step_id not in ctx.steps or final is not TaskState.DONE:
            return
        if kind == TaskKind.WORKER.value and isinstance(value, Mapping):
            self._settle_step(b, ctx, step_id, value, made)
        elif kind == TaskKind.TOOL.value:
            b.steps.update((ctx.run_id, step_id), output=made)

    def _settle_step(
        self, b: Batch, ctx: _RunCtx, step_id: str, outcome: Mapping[str, Any], made: Any
    ) -> None:
        """A worker's StepOutcome: ``{"step_id", "ok", "output", "error", "attempts"}``.

        ``made``: the outcome made JSON-able (its parts are taken from it).
        """
        step = ctx.steps[step_id]
        step.status = (StepStatus.SUCCEEDED if outcome.get("ok") else StepStatus.FAILED).value
        output = outcome.get("output")
        values: dict[str, Any] = {
            "status": step.status,
            "output": _part(made, "output", outcome),
            "error": _part(made, "error", outcome),
        }
        if _HAS_WAITING:
            values["waiting"] = None
        values.update(attempt_times(outcome.get("attempts"), _part(made, "attempts", outcome)))
        b.steps.update((ctx.run_id, step_id), **values)
        if _HAS_USAGE and outcome.get("ok") and _add_usage(ctx, output):
            b.runs.update((ctx.run_id,), usage=dict(ctx.usage or {}))

    def _run_end(self, b: Batch, ctx: _RunCtx, rec: RunEnd, made: Any) -> None:
        """The run's end; ``made`` is ``jsonable(rec.value)`` (its journal row's)."""
        status, value, ts = rec.status, rec.value, rec.ts
        final = _RUN_END_STATUSES.get(status)
        if final is None:
            return
        if isinstance(ts, int | float):
            self._tick(b, ctx, float(ts))
        ctx.finished = True
        self._finished += 1
        if 1 in ctx.tasks:  # the root's exit came just before, on the previous clock
            b.tasks.update((ctx.run_id, 1), ended_at=ctx.clock)
        summary: Any = None
        usage: Any = None  # a plan with a budget reports its model usage
        if final is RunStatus.SUCCEEDED:
            outputs = made
            if ctx.plan and isinstance(value, Mapping):
                outputs, summary = _part(made, "outputs", value), value.get("steps")
                usage = value.get("usage")
            b.runs.update((ctx.run_id,), status=final.value, ended_at=ctx.clock, outputs=outputs)
        else:
            if ctx.plan and isinstance(value, list | tuple) and len(value) > 3:
                fields = value[3]
                summary = fields.get("steps") if isinstance(fields, Mapping) else None
                usage = fields.get("usage") if isinstance(fields, Mapping) else None
            b.runs.update(
                (ctx.run_id,), status=final.value, ended_at=ctx.clock, error=error_dict(value)
            )
        if _HAS_USAGE and isinstance(usage, Mapping):
            b.runs.update((ctx.run_id,), usage=jsonable(usage))
        if not ctx.plan:
            return
        for step_id, info in summary.items() if isinstance(summary, Mapping) else ():
            # ``dict`` first: a thousand ABC checks were a third of this loop.
            if not (info.__class__ is dict or isinstance(info, Mapping)):
                continue
            if info.get("status") not in _STEP_STATUSES:
                continue
            step_id = text(step_id)
            step = ctx.steps.get(step_id)
            if step is not None and step.status == info["status"] != _RUNNING:
                # Settled already, from the same outcome: its worker's exit (or a
                # re-run's RUN_START). Rewriting every row cost a 1,000-step plan
                # 1,000 UPDATEs at its end.
                continue
            step = step or self._new_step(b, ctx, step_id, None)
            step.status = str(info["status"])
            values: dict[str, Any] = {
                "status": step.status,
                "error": jsonable(info.get("error")),
                "attempts": jsonable(info.get("attempts") or []),
            }
            if _HAS_WAITING:
                values["waiting"] = None
            values.update(attempt_times(info.get("attempts")))
            b.steps.update((ctx.run_id, step_id), **values)
        for step_id, step in ctx.steps.items():
            if step.status in _UNSETTLED_STEPS:
                step.status = StepStatus.SKIPPED.value
                b.steps.update(
                    (ctx.run_id, step_id),
                    status=step.status,
                    error={"message": f"skipped: the run {final.value}"},
                    ended_at=ctx.clock,
                    **({"waiting": None} if _HAS_WAITING else {}),
                )

    # -- helpers ---------------------------------------------------------------

    def _new_step(
        self,
        b: Batch,
        ctx: _RunCtx,
        step_id: str,
        tool: str | None,
        settled: dict[str, Any] | None = None,
    ) -> _StepInfo:
        """A step's row: pending, or ``settled`` (a re-run's reused step: :func:`_reused`)."""
        row: dict[str, Any] = {"position": len(ctx.steps), "tool": tool}
        if settled is None:
            info = _StepInfo(_PENDING, tool)
            row["status"], row["attempts"] = _PENDING, []
        else:
            info = _StepInfo(_SUCCEEDED, tool)
            row.update(settled)
        b.steps.insert((ctx.run_id, step_id), row)
        ctx.steps[step_id] = info
        return info

    def _tick(self, b: Batch, ctx: _RunCtx, ts: float) -> None:
        if math.isfinite(ts) and (ctx.clock is None or ts > ctx.clock):
            ctx.clock = ts
            b.runs.update((ctx.run_id,), updated_at=ts)

    def _context(self, conn: Connection, run_no: int) -> _RunCtx | None:
        ctx = self._ctx.get(run_no)
        if ctx is not None:
            return ctx
        run_id = self._run_ids.get(run_no)
        if run_id is None:
            return None  # its RUN_START was never projected
        columns = [Run.run_id, Run.entry, Run.updated_at, Run.dispatches, Run.status]
        if _HAS_USAGE:
            columns.append(Run.usage)
        run = conn.execute(select(*columns).where(Run.run_id == run_id)).one_or_none()
        if run is None:
            return None
        entry = run.entry if isinstance(run.entry, Mapping) else {}
        plan = entry.get("kind") == "plan" and isinstance(entry.get("plan"), Mapping)
        finished = run.status in _RUN_END_STATUSES
        ctx = _RunCtx(run.run_id, plan, root_role(entry), run.updated_at, run.dispatches, finished)
        used = run.usage if _HAS_USAGE else None
        if isinstance(used, Mapping):
            ctx.usage = {"tokens": used.get("tokens", 0), "usd": used.get("usd", 0.0)}
        for ltid, kind, step_id, on in conn.execute(
            select(Task.ltid, Task.kind, Task.step_id, Task.blocked_on).where(
                Task.run_id == run.run_id
            )
        ):
            ctx.tasks[ltid] = (kind, step_id)
            if on is not None:  # what _dispatch and _step_held wrote
                if on.startswith("receive "):
                    ctx.receiving.add(ltid)
                elif on.startswith("waiting: "):
                    ctx.held.add(ltid)
        for step_id, status, tool in conn.execute(
            select(Step.step_id, Step.status, Step.tool)
            .where(Step.run_id == run.run_id)
            .order_by(Step.position)
        ):
            ctx.steps[step_id] = _StepInfo(status, tool)
        self._ctx[run_no] = ctx
        self._finished += finished
        return ctx

    def _ensure_state(self, conn: Connection) -> None:
        exists = conn.scalar(
            select(func.count())
            .select_from(ProjectorState)
            .where(ProjectorState.id == self._state_id)
        )
        if not exists:
            # An engine's mark starts below its first seq (tiffany/shards.py).
            conn.execute(insert(ProjectorState).values(id=self._state_id, last_seq=self._base))

    def _lock_mark(self, conn: Connection) -> int:
        if self._mark_sql is not None:
            row = driver(conn, self._mark_sql[0], (self._state_id,))
            value = None if row is None else row[0]
        else:
            value = conn.scalar(self._lock_stmt)
        if value is None:
            self._ensure_state(conn)
            return self._base
        return int(value)

    def _load_run_ids(self, conn: Connection) -> None:
        """Map each run number to its latest start (a quarantined start maps to nothing)."""
        starts: list[tuple[int, int, str | None]] = [
            (int(seq or 0), int(no), str(rid))
            for no, rid, seq in conn.execute(
                select(Run.run_no, Run.run_id, Run.start_seq).where(self._own_runs())
            )
        ]
        starts += [
            (int(seq), int(no), None)
            for seq, no in conn.execute(
                select(DeadLetter.seq, DeadLetter.run_no).where(
                    DeadLetter.rtype == RecordType.RUN_START.name,
                    DeadLetter.seq > self._base,
                    DeadLetter.seq <= self._last,
                )
            )
        ]
        run_ids: dict[int, str] = {}
        for _seq, no, rid in sorted(starts, key=lambda s: s[0]):
            if rid is None:
                run_ids.pop(no, None)
            else:
                run_ids[no] = rid
        self._run_ids = run_ids
        self._run_ids_stale = False

    def _own_runs(self) -> Any:
        """The SQL condition of this engine's runs (their RUN_START is in its seqs).

        Run numbers are per journal: another engine's run may have the same.
        """
        mine = (Run.start_seq > self._base) & (Run.start_seq <= self._last)
        return mine | Run.start_seq.is_(None) if self.shard == 0 else mine

    def _forget(self) -> None:
        """Drop what memory holds of the rows (reloaded in the next transaction)."""
        self._ctx.clear()
        self._finished = 0
        self._mark = None
        self._run_ids.clear()
        self._run_ids_stale = True

    def _evict(self) -> None:
        """Drop the contexts of the oldest finished runs beyond :data:`MAX_CACHED_FINISHED_RUNS`.

        A pass walks every context, so it runs once a quarter of that many
        runs have finished, not after each batch (a walk of hundreds of
        contexts was a tenth of a small batch's time).
        """
        if self._finished < MAX_CACHED_FINISHED_RUNS // 4:
            return
        self._finished = 0
        finished = [no for no, ctx in self._ctx.items() if ctx.finished]
        for no in finished[: max(0, len(finished) - MAX_CACHED_FINISHED_RUNS)]:
            del self._ctx[no]


class StoreJournalMismatch(TiffanyError):
    """The store holds the projection of another journal than the projector's."""

    code = "store.journal_mismatch"


#: How a file WAL's name starts (``tiffany/wal/identity.py``; the store does not import the WAL).
FILE_JOURNAL_PREFIX: Final = "file:"


def _claim(
    conn: Connection,
    journal: str | None,
    state_id: int = PROJECTOR_STATE_ID,
    reaches: Callable[[int], bool] | None = None,
) -> None:
    """Mark an empty store as ``journal``'s; refuse one that holds another journal's rows.

    ``journal``: ``file:<hex>`` (a named WAL), ``postgres:<stream>``, or
    None (a WAL written before WALs were named). A store fed before names
    existed (its journal None) is taken over by the first named file WAL
    whose records reach its mark: that is the upgrade of a data dir whose
    WAL had no name yet. ``reaches(seq)``: whether the journal holds a
    record at or after ``seq`` (None: not checked).

    Raises:
        StoreJournalMismatch: The store's rows come from another journal
            (their seqs are not this journal's: applying would skip records),
            or from this one as it was before it lost records (restored from
            an older copy, or cut by a repair): the store is ahead of it.
    """
    row = conn.execute(
        select(ProjectorState.journal, ProjectorState.last_seq).where(ProjectorState.id == state_id)
    ).one()
    held, mark = row.journal, int(row.last_seq or 0)
    empty = mark == seq_base(state_id - PROJECTOR_STATE_ID)
    named = journal or "the file WAL"
    ours = held == journal or held is None  # or another journal's, refused below
    if ours and not empty and reaches is not None and not reaches(mark):
        raise StoreJournalMismatch(
            f"this store holds the projection of a journal up to seq {mark}, and {named} "
            f"ends before seq {mark}: it is another data dir's WAL, or this one restored from "
            "an older copy or cut by a repair, so its next records would be taken for ones the "
            "store holds and skipped. Run `tiffany db rebuild` to project this journal alone, "
            "or give each data dir a database (or schema) of its own",
            store_journal=held,
            journal=journal,
            mark=mark,
        )
    if held == journal:
        return
    legacy = held is None and (journal or "").startswith(FILE_JOURNAL_PREFIX)
    if held is None and (empty or legacy):
        conn.execute(
            sql_update(ProjectorState).where(ProjectorState.id == state_id).values(journal=journal)
        )
        return
    raise StoreJournalMismatch(
        f"this store holds the projection of {held or 'an unnamed file WAL'} (up to seq {mark}), "
        f"not of {named}: give each journal a database (or schema) of its "
        "own, or run `tiffany db rebuild` to project this journal alone",
        store_journal=held,
        journal=journal,
        mark=mark,
    )


def _reused(reuse: Mapping[Any, Any], clock: float | None) -> dict[str, dict[str, Any]]:
    """The rows' settled columns of a re-run's reused steps, by step id, in ``reuse``'s order.

    They succeed at the run's start, as its planner settles them there, with
    the earlier output; their one attempt names the run and seq it was
    recorded at.
    """
    out: dict[str, dict[str, Any]] = {}
    for sid, given in reuse.items():
        if isinstance(given, Mapping):
            origin = {"run_id": given.get("run_id"), "seq": given.get("seq")}
            out[text(sid)] = {
                "status": _SUCCEEDED,
                "output": given.get("output"),
                "attempts": [{"attempt": 1, "reused": origin}],
                "started_at": clock,
                "ended_at": clock,
            }
    return out


def _made(row: dict[str, Any] | None, name: str, rec: Any) -> Any:
    """``jsonable(rec.<name>)``: the record's journal row made it already (else made now)."""
    data = row["data"] if row is not None else None
    if data.__class__ is dict and name in data:
        return data[name]
    return jsonable(getattr(rec, name))


def _part(made: Any, key: str, raw: Mapping[str, Any]) -> Any:
    """``jsonable(raw[key])``, taken from ``made`` (``jsonable(raw)``) when it holds it.

    The part was made one level down its parent, so a value nested exactly
    ``MAX_JSON_DEPTH`` deep is cut one level sooner than on its own: the
    same way every time, in a rebuild as in the live projection.
    """
    if made.__class__ is dict and key in made:
        return made[key]
    return jsonable(raw.get(key))


def _is_slot(rec: Any) -> bool:
    """True for the WAKE that gives a limited run its slot (``SLOT_SIGNAL``)."""
    value = rec.value
    return (
        rec.ltid == 0
        and rec.cause == "signal"
        and isinstance(value, list | tuple)
        and len(value) > 0
        and value[0] == SLOT_SIGNAL
    )
