"""The SQL store's tables: runs, their tasks and plan steps, and the projector's mark.

The store is a projection of the journal (docs/architecture.md, "Storage"): every
row here can be rebuilt from the WAL (``tiffany db rebuild``), so nothing in
it is a source of truth, except the ``wal_*`` tables: they are the
journal itself when it lives in PostgreSQL (``TIFFANY_JOURNAL=postgres``,
``tiffany.wal.pg``); a rebuild never touches them. Alembic owns the schema
(``migrations/versions/``); a change here needs a new revision, and
``alembic check`` (run by the tests) fails when they disagree.

Times are float seconds since the epoch, as the journal records them (the
run's clock, ``Now()``), not database timestamps: the projection must come
out the same whenever it is rebuilt.

Discussion: states are strings with a CHECK constraint rather than native
enum types. A native PostgreSQL enum needs its own migration to gain a
value, and SQLite has none; the Python side names the values in the
``StrEnum`` classes below.
"""

from __future__ import annotations

import enum
import hashlib
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from tiffany.wire.status import RunStatus, StepStatus, TaskState

__all__ = [
    "ANSWERS_CHANNEL",
    "DB_NOW_SQL",
    "FEED_CHANNEL",
    "MAX_NOTIFY_BYTES",
    "PROJECTED_CHANNEL",
    "PROJECTOR_STATE_ID",
    "REQUESTS_CHANNEL",
    "Base",
    "DeadLetter",
    "EngineRequest",
    "JournalRecord",
    "ProjectorState",
    "Run",
    "RunStatus",
    "Schedule",
    "ScheduleClock",
    "Step",
    "StepStatus",
    "Task",
    "TaskKind",
    "TaskState",
    "WalCheckpoint",
    "WalRecord",
    "WalStream",
    "channel",
    "url_schema",
]

#: Constraint and index names the same on every database (Alembic compares them).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: The channels of the database that engines and API processes share
#: (``TIFFANY_JOURNAL=postgres``, docs/engines.md): requests inserted, their
#: answers, the engines' activity feed, and each move of a projector's mark.
REQUESTS_CHANNEL = "tiffany_requests"
ANSWERS_CHANNEL = "tiffany_answers"
FEED_CHANNEL = "tiffany_feed"
PROJECTED_CHANNEL = "tiffany_projected"
#: PostgreSQL's longest identifier, in bytes (a channel's name is one).
_MAX_IDENTIFIER_BYTES = 63
_SEARCH_PATH = re.compile(r"-c\s*search_path\s*=\s*(\S+)")


def url_schema(url: str) -> str | None:
    """The schema a database URL's connections create tables in, if it names one.

    That is the first schema of a ``search_path`` set in the URL's
    ``options`` (``...?options=-csearch_path%3Dstaging``); None without one.
    """
    for options in parse_qs(urlsplit(url).query).get("options", []):
        found = _SEARCH_PATH.search(options)
        if found is None:
            continue
        for part in found.group(1).split(","):
            schema = part.strip().strip('"')
            if schema and schema != "$user":
                return schema
    return None


def channel(name: str, url: str) -> str:
    """The channel ``name`` (``REQUESTS_CHANNEL``...) of the Tiffany whose store ``url`` is.

    LISTEN and NOTIFY channels belong to the database, not to a schema: two
    Tiffanys in one database, each in a schema of its own (:func:`url_schema`),
    would otherwise hear each other's requests, answers, marks and feed.
    The default schema keeps the bare name; another one is appended to it,
    or its digest where it does not fit an identifier as it is.
    """
    schema = url_schema(url)
    if schema is None or schema == "public":
        return name
    tail = re.sub(r"[^a-z0-9_]", "_", schema.lower())
    full = f"{name}__{tail}"
    if tail != schema or len(full) > _MAX_IDENTIFIER_BYTES:  # two schemas, one name: never
        full = f"{name}__{hashlib.sha256(schema.encode()).hexdigest()[:16]}"
    return full


#: The longest NOTIFY payload sent (PostgreSQL refuses 8,000 bytes or more).
MAX_NOTIFY_BYTES = 7_900
#: The database's clock, in seconds since the epoch (SQL).
DB_NOW_SQL = "extract(epoch from clock_timestamp())"

#: The primary key of the single ``projector_state`` row.
PROJECTOR_STATE_ID = 1


class TaskKind(enum.StrEnum):
    """What a task is in its run: the role its SPAWN record holds (``tiffany.wire.records``)."""

    PLANNER = "planner"
    WORKER = "worker"
    TOOL = "tool"
    STEP = "step"
    TASK = "task"


def _one_of(column: str, values: type[enum.StrEnum]) -> str:
    listed = ", ".join(f"'{v.value}'" for v in values)
    return f"{column} IN ({listed})"


class Base(DeclarativeBase):
    """Declarative base of the store's models (``Base.metadata`` is Alembic's target)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Run(Base):
    """One run: a plan or a callable root task and everything it spawned."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(_one_of("status", RunStatus), name="status"),
        Index("ix_runs_created_at_start_seq", "created_at", "start_seq"),
        Index("ix_runs_status_created_at_start_seq", "status", "created_at", "start_seq"),
        Index("ix_runs_run_no", "run_no"),
    )

    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    #: The run's number in the WAL (the 4-byte prefix of its records). Not
    #: unique: an old WAL may reuse it (old layout: see docs/wal-format.md, compatibility).
    run_no: Mapped[int] = mapped_column(Integer)
    #: The WAL sequence number of the run's RUN_START (unique by construction;
    #: the runs list's order). Null only for rows projected before revision 0003
    #: that the migration could not match to a RUN_START record.
    start_seq: Mapped[int | None] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String(16))
    #: The RUN_START entry: ``{"kind": "plan", "plan": ..., "inputs": ...}`` or a callable.
    entry: Mapped[Any] = mapped_column(JSON)
    inputs: Mapped[Any | None] = mapped_column(JSON)
    outputs: Mapped[Any | None] = mapped_column(JSON)
    #: ``{"type", "message", "args", "repr", "fields"}`` of a failed or cancelled run.
    error: Mapped[Any | None] = mapped_column(JSON)
    #: A plan with a ``budget``: its model usage, ``{"tokens", "usd"}`` (at its end).
    usage: Mapped[Any | None] = mapped_column(JSON)
    #: What its waiting tasks wait for (a signal, a tool, a function), oldest
    #: first: ``[{"kind", "name", "step", "task", "reason"?}]``; null when none
    #: waits (``tiffany/store/waits.py``). Revision 0012 on.
    waiting_for: Mapped[Any | None] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Double)
    started_at: Mapped[float | None] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    #: The latest time the run's journal recorded (its clock, ``Now()``, its end).
    updated_at: Mapped[float | None] = mapped_column(Double)
    #: The run's dispatch count (the ``n`` of its last DISPATCH record).
    dispatches: Mapped[int] = mapped_column(Integer, default=0)
    #: The WAL sequence number of the run's last projected record.
    last_seq: Mapped[int] = mapped_column(BigInteger)

    tasks: Mapped[list[Task]] = relationship(
        back_populates="run",
        order_by="Task.ltid",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )
    steps: Mapped[list[Step]] = relationship(
        back_populates="run",
        order_by="Step.position",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )


class Task(Base):
    """One journaled task of a run (``ltid`` is its id within the run, 1 for the root)."""

    __tablename__ = "tasks"
    __table_args__ = (
        CheckConstraint(_one_of("state", TaskState), name="state"),
        CheckConstraint(_one_of("kind", TaskKind), name="kind"),
    )

    run_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    ltid: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The parent's ltid (None for the root).
    parent_ltid: Mapped[int | None] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String)
    kind: Mapped[str] = mapped_column(String(16))
    #: The plan step a worker or tool task serves.
    step_id: Mapped[str | None] = mapped_column(String)
    state: Mapped[str] = mapped_column(String(32))
    #: What a blocked task waits on: its call's kind and argument ("sleep 2.0").
    blocked_on: Mapped[str | None] = mapped_column(String)
    started_at: Mapped[float | None] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    result: Mapped[Any | None] = mapped_column(JSON)
    error: Mapped[Any | None] = mapped_column(JSON)
    #: The WAL sequence number of the last record that changed this row (null
    #: for rows projected before revision 0004 that no record has changed since).
    last_seq: Mapped[int | None] = mapped_column(BigInteger)

    run: Mapped[Run] = relationship(back_populates="tasks")


class Step(Base):
    """One step of a plan run (declared in the plan, or added by a dynamic step)."""

    __tablename__ = "steps"
    __table_args__ = (CheckConstraint(_one_of("status", StepStatus), name="status"),)

    run_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    step_id: Mapped[str] = mapped_column(String, primary_key=True)
    #: Order of appearance: plan order, then dynamic steps as they were spawned.
    position: Mapped[int] = mapped_column(Integer)
    tool: Mapped[str | None] = mapped_column(String)
    status: Mapped[str] = mapped_column(String(16))
    #: The worker's attempt records: ``[{"attempt", "started_at", "ok", "ended_at", ...}]``.
    attempts: Mapped[Any | None] = mapped_column(JSON)
    output: Mapped[Any | None] = mapped_column(JSON)
    error: Mapped[Any | None] = mapped_column(JSON)
    started_at: Mapped[float | None] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    #: Why the step waits, e.g. its tool is disabled on this engine (None: it does not).
    waiting: Mapped[str | None] = mapped_column(Text)
    #: The WAL sequence number of the last record that changed this row (as for tasks).
    last_seq: Mapped[int | None] = mapped_column(BigInteger)

    run: Mapped[Run] = relationship(back_populates="steps")


class ProjectorState(Base):
    """The projector's mark: the last WAL sequence number applied (one row).

    This is the store's watermark (docs/clock.md): every record up to it is
    in the rows, in the same transaction that moved it; a reader's
    ``min_seq`` is compared with it.
    """

    __tablename__ = "projector_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    #: Which journal the rows project (NULL: the file WAL; ``postgres:<stream>``):
    #: another journal's seqs name other records, so a projector refuses a
    #: store that holds another journal's (``tiffany db rebuild`` re-assigns it).
    journal: Mapped[str | None] = mapped_column(String(128))


class JournalRecord(Base):
    """One journal record, decoded (the dashboard's journal table, ``GET /api/runs/{id}/events``).

    ``data`` names the record's fields (``{"n", "ltid", "kind", "arg"}`` for a
    DISPATCH: the fields of its struct in ``tiffany/wire/records.py``). Keyed by
    WAL sequence number, so applying a batch twice changes nothing.
    """

    __tablename__ = "journal_records"
    __table_args__ = (Index("ix_journal_records_run_no_seq", "run_no", "seq"),)

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    run_no: Mapped[int] = mapped_column(Integer)
    #: The record type's name (``DISPATCH``...).
    rtype: Mapped[str] = mapped_column(String(16))
    #: The task's run-local id, for the records that concern one task.
    ltid: Mapped[int | None] = mapped_column(Integer)
    data: Mapped[Any] = mapped_column(JSON)


class DeadLetter(Base):
    """A journal record the projection could not apply, quarantined (docs/store.md).

    The projector skips it and goes on; the record is still in the WAL, so a
    fixed projector picks it up again on ``tiffany db rebuild``.
    """

    __tablename__ = "dead_letters"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    #: The run the record belongs to, if the projector knew it.
    run_id: Mapped[str | None] = mapped_column(String(128))
    run_no: Mapped[int] = mapped_column(Integer)
    #: The record type's name (``RUN_START``...).
    rtype: Mapped[str] = mapped_column(String(16))
    #: ``TypeName: message`` of what failed (bounded).
    error: Mapped[str] = mapped_column(Text)
    #: A bounded excerpt of the record's fields (``reprlib``, sanitized).
    excerpt: Mapped[str] = mapped_column(Text)
    #: When it was quarantined: the run's journal clock if known, else 0 (deterministic).
    at: Mapped[float] = mapped_column(Double)


class WalStream(Base):
    """A journal stream in PostgreSQL: its head and its writer's lease (docs/pg-journal.md).

    One engine at a time writes a stream: the one whose lease (``owner``,
    ``epoch``, ``lease_until``) is current. Every commit moves ``head`` with
    ``WHERE epoch = <the writer's epoch>`` in the same transaction as its
    records, so a writer whose lease was taken over (a higher epoch) can
    write nothing more: the fence.
    """

    __tablename__ = "wal_streams"

    stream: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: The last seq committed to the stream (0: none).
    head: Mapped[int] = mapped_column(BigInteger)
    #: Raised by one at every take-over of the lease.
    epoch: Mapped[int] = mapped_column(BigInteger)
    #: Who holds the lease (``host:pid:nonce``).
    owner: Mapped[str] = mapped_column(String(128))
    #: Until when, in seconds since the epoch by the database's clock.
    lease_until: Mapped[float] = mapped_column(Double)


class WalRecord(Base):
    """One journal record of a stream in PostgreSQL: the WAL record's type and payload."""

    __tablename__ = "wal_records"

    stream: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    rtype: Mapped[int] = mapped_column(SmallInteger)
    #: The record's opaque payload (the run's 4-byte number first), as in a WAL segment.
    payload: Mapped[bytes] = mapped_column(LargeBinary)


class EngineRequest(Base):
    """A command for the engines, through the database (``TIFFANY_JOURNAL=postgres``).

    An API process inserts it (``pending``) and notifies ``tiffany_requests``;
    an engine claims it with ``FOR UPDATE SKIP LOCKED`` (a submission: any
    engine; a run's command: the engine that holds the run), does it, stores
    the answer (``done``) and notifies ``tiffany_answers``: docs/engines.md.
    """

    __tablename__ = "engine_requests"
    __table_args__ = (Index("ix_engine_requests_state_id", "state", "id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    #: ``submit``, ``cancel`` or ``verify`` (the control channel's ops).
    op: Mapped[str] = mapped_column(String(16))
    #: The engine that must do it (a run's command), or that claimed a submission.
    engine: Mapped[int | None] = mapped_column(Integer)
    run_id: Mapped[str | None] = mapped_column(String(128), index=True)
    #: A submission's ``Idempotency-Key``: one row a key.
    idem_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    digest: Mapped[str | None] = mapped_column(String(64))
    #: The request's fields (a submission: ``plan`` and ``inputs``).
    body: Mapped[Any] = mapped_column(JSON)
    #: ``pending`` -> ``claimed`` -> ``done``; ``withdrawn`` when its API gave up first.
    state: Mapped[str] = mapped_column(String(16))
    #: The engine's answer, or ``{"error": {"status", "message", "detail"}}``.
    answer: Mapped[Any | None] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Double)
    claimed_at: Mapped[float | None] = mapped_column(Double)


class WalCheckpoint(Base):
    """A checkpoint of a journal stream in PostgreSQL: its bytes, as a checkpoint file holds them.

    A start reads the newest one that checks out and then only the records
    after it (and those of the runs it lists as unfinished): docs/wal-format.md.
    """

    __tablename__ = "wal_checkpoints"

    stream: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Schedule(Base):
    """A cron schedule of a plan or a workflow: each tick starts one run.

    The ticks: ``tiffany/schedules/runner.py``.

    Written by the API and the CLI; engine 0 fires the ticks and moves
    ``last_tick`` once a tick's run is durable (its Idempotency-Key,
    ``schedule:<id>:<tick>``, makes a tick fired twice one run).
    """

    __tablename__ = "schedules"
    __table_args__ = (
        Index("ix_schedules_version", "version"),
        Index("ix_schedules_created_at_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    #: The plan each tick runs; None for a schedule of a workflow.
    plan: Mapped[Any | None] = mapped_column(JSON, nullable=True)
    #: The registered ``@workflow`` each tick runs (instead of a plan), or None.
    workflow: Mapped[str | None] = mapped_column(String(200))
    inputs: Mapped[Any] = mapped_column(JSON)
    #: Five fields (minute hour day month weekday) or six (and seconds, last).
    cron: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64))
    #: Ticks missed while no engine fired them: ``skip``, ``one`` (the last) or ``all``.
    catchup: Mapped[str] = mapped_column(String(8))
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Double)
    #: The last tick fired or skipped (epoch seconds); None: none yet.
    last_tick: Mapped[float | None] = mapped_column(Double)
    last_run_id: Mapped[str | None] = mapped_column(String(128))
    #: Why the last tick started no run (an invalid plan, say), or None.
    last_error: Mapped[str | None] = mapped_column(Text)
    #: The :class:`ScheduleClock` seq of the last add, pause or resume (0: none
    #: since revision 0011): the runner reads the rows changed since it last looked.
    version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class ScheduleClock(Base):
    """One row: the seq the last change of a schedule took (``Schedule.version``).

    A change takes the next seq with an ``UPDATE`` of this row in its own
    transaction, so the row's lock orders the seqs as the commits: a reader
    that saw seq N never sees a change with a smaller seq appear later
    (``tiffany/schedules/store.py``: :func:`~tiffany.schedules.store.changed_since`).
    """

    __tablename__ = "schedule_clock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(BigInteger)
