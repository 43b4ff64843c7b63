"""The projector: journal records in, rows of runs, tasks and steps out.

The engine hands :meth:`Projector.apply` batches of journal records it has
already decoded, ``(seq, rtype, run_no, record)`` (the typed structs of
:mod:`tiffany.wire.records`); the store never reads the WAL itself (it sits
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

What each record means as rows is the fold's (``fold.py``): this module
owns the transactions around it.

Nothing journaled stops the projection (docs/store.md): a batch that fails
with a deterministic error (a constraint, a value SQL refuses, a bug:
anything but a transient database error, :func:`is_transient`) is split in
halves, each applied on its own, down to the one record that fails; that
record is quarantined in ``dead_letters`` (its seq, run, type, the error
and a bounded excerpt), the mark moves past it, and the rest is applied.
Transient errors propagate: the caller retries the batch, and the mark
makes the retry skip what was kept. A rebuild quarantines the same records
as the incremental projection, so the two stay row for row the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
from tiffany.projector import pgflush
from tiffany.projector.fold import RowFold
from tiffany.projector.rows import Batch, driver, mark_sql
from tiffany.store.journal import record_row
from tiffany.store.models import (
    PROJECTED_CHANNEL,
    PROJECTOR_STATE_ID,
    DeadLetter,
    JournalRecord,
    ProjectorState,
    Run,
    Step,
    Task,
    channel,
)
from tiffany.store.records import (
    excerpt,
    text,
)
from tiffany.wire.records import (
    Record,
    RecordType,
    RunStart,
    Undecodable,
    Unknown,
    as_list,
)
from tiffany.wire.shards import seq_base, seq_last

__all__ = [
    "PROJECTED_CHANNEL",
    "ApplyReport",
    "Decoded",
    "Projector",
    "StoreJournalMismatch",
    "is_transient",
]


#: The longest error message a dead letter keeps, in characters.
MAX_ERROR_CHARS: Final = 1_000


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
            name; ``postgres:<stream>``; None, an unnamed WAL, old layout:
            see docs/wal-format.md, compatibility): an empty store is claimed for it, and a
            store holding another journal's rows is refused
            (:class:`StoreJournalMismatch`), unless ``claim`` is false (a
            rebuild, which empties the store first).
        shard: The engine whose journal this is (``tiffany/wire/shards.py``): its
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
        self._channel = channel(PROJECTED_CHANNEL, engine.url.render_as_string())
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
        #: What each record means as rows, and what is kept of each run.
        self._fold = RowFold(shard)
        #: Records in ``dead_letters`` (kept up to date by :meth:`apply`).
        self.dead_letters = 0
        with engine.begin() as conn:
            self._ensure_state(conn)
            if claim:
                _claim(conn, journal, self._state_id, reaches)
            self._fold.load_run_ids(conn)
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
        self._fold.evict()
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
                if self._fold.run_ids_stale:
                    self._fold.load_run_ids(conn)
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
                if self._fold.run_ids_stale:
                    self._fold.load_run_ids(conn)
                changes = self._collect(conn, batch, mark, report)
                if report.last_seq > mark:
                    moved = (report.last_seq, self._state_id, mark)
                    notify = (self._channel, f"{self.shard} {report.last_seq}")
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
            if self._fold.apply(conn, changes, seq, run_no, rec):
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
                if self._fold.run_ids_stale:
                    self._fold.load_run_ids(conn)
                if rtype == RecordType.RUN_START:
                    run_id: str | None = text(rec.run_id) if isinstance(rec, RunStart) else None
                    self._fold.run_ids.pop(run_no, None)  # its records are orphans now
                else:
                    run_id = self._fold.run_ids.get(run_no)
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
                params += (self._channel, f"{self.shard} {last}")
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
                # commit (``min_seq`` reads: tiffany/ports/commands_pg.py).
                payload = f"{self.shard} {report.last_seq}"
                conn.execute(select(func.pg_notify(self._channel, payload)))
                report.statements += 1

    def reset(self, journal: str | None = None) -> None:
        """Delete this engine's projected rows and set its mark back (before a rebuild).

        Its row then projects ``journal`` (None: whichever projector claims it first).
        """
        lo, hi = self._base, self._last
        try:
            with self.engine.begin() as conn:
                self._lock_mark(conn)
                runs = select(Run.run_id).where(self._fold.own_runs())
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

    def _forget(self) -> None:
        """Drop what memory holds of the rows and the mark (read again in the next transaction)."""
        self._fold.forget()
        self._mark = None

    def _ensure_state(self, conn: Connection) -> None:
        exists = conn.scalar(
            select(func.count())
            .select_from(ProjectorState)
            .where(ProjectorState.id == self._state_id)
        )
        if not exists:
            # An engine's mark starts below its first seq (tiffany/wire/shards.py).
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
    None (an unnamed WAL; old layout, and how its store is taken over: see
    docs/wal-format.md, compatibility). ``reaches(seq)``: whether the journal holds a
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
