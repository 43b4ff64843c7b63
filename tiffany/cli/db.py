"""CLI commands of the SQL store: ``tiffany db upgrade`` and ``tiffany db rebuild``.

``db upgrade`` migrates the store named by the settings
(``TIFFANY_DATABASE_URL``, else the SQLite file in the data dir) to the
newest Alembic revision. ``db rebuild`` empties the store and projects the
whole WAL into it again: the store is a projection of the journal, so this
is always safe (a record that cannot be projected is quarantined in
``dead_letters`` and reported, the rest is applied), and it is how a
store that was lost, or projected by an older version, is brought back.
Stop the engine first: two projectors writing one store would wait on
each other's mark, not corrupt it, but the rebuild would start over under
the engine's feet.

The WAL read is its whole history: the segments retention archived
(``wal/archive/``), then the live ones. When retention deleted segments
(``TIFFANY_WAL_RETAIN=delete``) the history no longer starts at seq 1 and
the rebuild refuses: it would drop every run those segments held.

Memory comes back from the journal too (:class:`MemoryWrites`): every
write a run's step made (``memory.put``, ``memory.link``,
``memory.delete``, an agent's ``remember``) is journaled with its result,
embedding included, and the rebuild re-applies those results in journal
order (``MemoryStore.apply``). A write the store holds already (its op
applied) is a no-op, so the memory tables are not emptied first: what
the HTTP API wrote (not journaled) stays as it is, and a store that lost
its memory (its rows deleted, its file gone) gets the runs' writes back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from tiffany.errors import TiffanyError

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from tiffany.config import Settings
    from tiffany.projector.tail import DecodedRecord
    from tiffany.wal import Source

__all__ = ["HistoryReleased", "MemoryWrites", "RebuildReport", "rebuild_store", "register"]

db_app = typer.Typer(
    help="The SQL store: migrate its schema, rebuild it from the WAL, turn pgvector on.",
    no_args_is_help=True,
)

#: Records per projector transaction during a rebuild.
REBUILD_BATCH_RECORDS: Final = 5_000

EXIT_FAILED = 1


class HistoryReleased(TiffanyError):
    """The WAL no longer holds its whole history (segments were deleted): no rebuild."""

    code = "store.history_released"


@dataclass(slots=True)
class RebuildReport:
    """What a rebuild did."""

    records: int = 0
    last_seq: int = 0
    runs: int = 0
    tasks: int = 0
    steps: int = 0
    orphans: int = 0
    #: Sequence numbers of the records quarantined in ``dead_letters``.
    quarantined: list[int] = field(default_factory=list)
    status: dict[str, int] = field(default_factory=dict)
    #: Memory writes the journal holds, those the store did not (re-applied), and
    #: those it refused to apply again (``{"op", "code", "message"}``).
    memory_writes: int = 0
    memory_restored: int = 0
    memory_refused: list[dict[str, str]] = field(default_factory=list)


class MemoryWrites:
    """Memory writes found in journal records, re-applied to the MemoryStore as they come.

    A write is a durable step named after a write tool (``memory.put``...:
    its STEP_START's name) whose result came back (the WAKE of the same task
    with cause ``step``, ok); that result is what the store answered, and
    ``MemoryStore.apply`` writes it again, idempotent on its op. The store
    is opened at the first write found (a journal with none never opens it).

    Args:
        engine: The store's database.
        settings: For the embedder the store is opened with (a re-applied
            write carries its vector: nothing is embedded again).
    """

    def __init__(self, engine: Engine, settings: Settings) -> None:
        from tiffany.agents.tools.memory import WRITE_TOOLS

        self._engine = engine
        self._settings = settings
        self._writes = WRITE_TOOLS
        self._store: Any = None
        #: (run_no, ltid) of the write steps started and not yet ended.
        self._pending: dict[tuple[int, int], str] = {}
        self.writes = 0
        self.restored = 0
        #: The writes the store refused to apply again (``{"op", "code", "message"}``).
        self.refused: list[dict[str, str]] = []

    def feed(self, batch: list[DecodedRecord]) -> None:
        """Re-apply the writes whose results ``batch`` holds (journal order)."""
        from tiffany.wire.records import StepStart, Wake
        from tiffany.wire.values import unpack_value

        pending = self._pending
        for _seq, _rtype, run_no, record in batch:
            if isinstance(record, StepStart):
                if record.name in self._writes:
                    pending[(run_no, record.ltid)] = record.name
                else:
                    pending.pop((run_no, record.ltid), None)
            elif (
                isinstance(record, Wake)
                and record.cause == "step"
                and pending.pop((run_no, record.ltid), None) is not None
                and record.ok
            ):
                self._apply(unpack_value(record.value))

    def _apply(self, result: Any) -> None:
        if not isinstance(result, dict) or not isinstance(result.get("op"), str):
            return
        store = self._open()
        self.writes += 1
        if store.applied(result["op"]) is not None:
            return  # the store holds it
        try:
            store.apply(result)
        except TiffanyError as exc:  # a link whose item is gone since, a namespace full...
            self.refused.append({"op": result["op"], "code": exc.code, "message": exc.message})
        else:
            self.restored += 1

    def _open(self) -> Any:
        if self._store is None:
            from tiffany.memory import MemoryStore

            self._store = MemoryStore.from_settings(self._settings, self._engine)
        return self._store

    def close(self) -> None:
        """Close the store, if a write opened it."""
        if self._store is not None:
            self._store.close()
            self._store = None


def rebuild_store(
    engine: Engine,
    wal_dir: Source,
    batch_records: int = REBUILD_BATCH_RECORDS,
    *,
    shard: int = 0,
    memory: MemoryWrites | None = None,
) -> RebuildReport:
    """Empty the store and project every record of the WAL (archive included) into it again.

    ``wal_dir`` may be another log (a PostgreSQL stream: ``journal=postgres``).
    ``shard``: the engine whose journal it is; only its rows are replaced
    (``serve --engines N``: tiffany/wire/shards.py). ``memory``: re-apply the
    journal's memory writes too (:class:`MemoryWrites`), in the same pass.

    Raises:
        HistoryReleased: Segments were deleted: the WAL starts after seq 1.
    """
    from sqlalchemy import func, select

    from tiffany.projector import Projector
    from tiffany.projector.tail import decoded_batches, journal_id
    from tiffany.store import Run, Step, Task, queries, session_factory
    from tiffany.wal.segments import history_start
    from tiffany.wire.shards import seq_base

    first = seq_base(shard) + 1
    start = history_start(wal_dir) if isinstance(wal_dir, Path) else first
    if start > first:
        raise HistoryReleased(
            f"the WAL in {wal_dir} starts at seq {start}: the segments before it were "
            "deleted (TIFFANY_WAL_RETAIN=delete), so a rebuild would lose their runs; "
            "the store is left as it is",
            first_seq=start,
        )

    # Whichever journal it held, this engine's share of the store is emptied.
    projector = Projector(engine, claim=False, shard=shard)
    projector.reset(journal_id(wal_dir))  # the store projects this journal from now on
    report = RebuildReport()
    writes, restored, refused = (
        (memory.writes, memory.restored, len(memory.refused)) if memory is not None else (0, 0, 0)
    )
    for batch in decoded_batches(wal_dir, batch_records):
        if memory is not None:
            memory.feed(batch)
        applied = projector.apply(batch)
        report.records += len(batch)
        report.orphans += applied.orphans
        report.quarantined += applied.quarantined
        report.last_seq = applied.last_seq
    with session_factory(engine)() as session:
        report.runs = session.scalar(select(func.count()).select_from(Run)) or 0
        report.tasks = session.scalar(select(func.count()).select_from(Task)) or 0
        report.steps = session.scalar(select(func.count()).select_from(Step)) or 0
        report.status = queries.counts_by_status(session)
    if memory is not None:
        report.memory_writes = memory.writes - writes
        report.memory_restored = memory.restored - restored
        report.memory_refused = memory.refused[refused:]
    return report


def _engine(ctx: typer.Context) -> tuple[Engine, str]:
    from tiffany.cli import _settings
    from tiffany.store import make_engine

    settings = _settings(ctx)
    return make_engine(settings.database_url), settings.public_dict()["database_url"]


@db_app.command("upgrade")
def upgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
) -> None:
    """Migrate the store's schema (Alembic) to the newest revision."""
    from tiffany.store.migrate import upgrade as alembic_upgrade

    engine, shown = _engine(ctx)
    try:
        at = alembic_upgrade(engine, revision)
    finally:
        engine.dispose()
    typer.echo(f"store {shown} is at revision {at}")


@db_app.command("rebuild")
def rebuild(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Empty the store and project the whole WAL into it again (refused while an engine runs)."""
    from tiffany.cli import _settings
    from tiffany.cli.durable import _journals
    from tiffany.store.migrate import upgrade as alembic_upgrade

    engine, shown = _engine(ctx)
    journals = _journals(ctx)
    sources = [journals.source(e) for e in range(journals.count())]
    memory = MemoryWrites(engine, _settings(ctx))
    try:
        with journals.engines_stopped():
            alembic_upgrade(engine)
            # Engine by engine (serve --engines N): each replaces its own rows.
            reports = [
                rebuild_store(engine, source, shard=e, memory=memory)
                for e, source in enumerate(sources)
            ]
    except TiffanyError as exc:
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        memory.close()
        engine.dispose()
    report = reports[-1]  # its counts are the whole store's
    report.records = sum(r.records for r in reports)
    report.orphans = sum(r.orphans for r in reports)
    report.quarantined = [q for r in reports for q in r.quarantined]
    report.last_seq = reports[0].last_seq if len(reports) == 1 else max(r.last_seq for r in reports)
    report.memory_writes, report.memory_restored = memory.writes, memory.restored
    report.memory_refused = memory.refused
    if as_json:
        typer.echo(json.dumps(asdict(report)))
        return
    statuses = ", ".join(f"{n} {s}" for s, n in report.status.items() if n)
    typer.echo(
        f"rebuilt {shown} from {report.records} records (last seq {report.last_seq}): "
        f"{report.runs} runs ({statuses or 'none'}), {report.tasks} tasks, {report.steps} steps"
    )
    if report.memory_writes:
        typer.echo(
            f"memory: {report.memory_writes} writes in the journal, "
            f"{report.memory_restored} re-applied (the rest were in the store)"
        )
    if report.memory_refused:
        first = report.memory_refused[0]
        typer.echo(
            f"memory: {len(report.memory_refused)} writes could not be applied again "
            f"(the first: op {first['op']}: {first['code']}: {first['message']})",
            err=True,
        )
    if report.orphans:
        typer.echo(f"{report.orphans} records belonged to runs with no start in the WAL", err=True)
    if report.quarantined:
        shown_seqs = ", ".join(str(q) for q in report.quarantined[:10])
        more = "..." if len(report.quarantined) > 10 else ""
        typer.echo(
            f"{len(report.quarantined)} records could not be projected and were quarantined"
            f" in dead_letters (seq {shown_seqs}{more})",
            err=True,
        )


@db_app.command("pgvector")
def pgvector(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Turn pgvector on for memory: create the extension, make and fill ``mem_vectors``.

    PostgreSQL only; creating the extension needs a superuser (a database
    where it exists already needs none). Idempotent: run again, it rewrites
    the vector rows that are missing or stale. Exits 1, saying why, where
    pgvector cannot be used (memory then ranks its vectors in the process).
    """
    from sqlalchemy.exc import DBAPIError

    from tiffany.memory.pgvector import install
    from tiffany.store.migrate import upgrade as alembic_upgrade

    engine, shown = _engine(ctx)
    try:
        if engine.dialect.name != "postgresql":
            typer.echo(
                f"tiffany: {shown} is not PostgreSQL: memory ranks its vectors exactly in the "
                "process (pgvector is PostgreSQL's)",
                err=True,
            )
            raise typer.Exit(EXIT_FAILED)
        alembic_upgrade(engine)
        try:
            with engine.begin() as conn:
                report = install(conn, create_extension=True)
        except DBAPIError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            typer.echo(
                f"tiffany: could not create the vector extension: {reason} (a superuser can: "
                "CREATE EXTENSION vector; then run this again): memory ranks its vectors "
                "exactly in the process",
                err=True,
            )
            raise typer.Exit(EXIT_FAILED) from None
    finally:
        engine.dispose()
    found = report.probe
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "ready": found.ready,
                    "reason": found.why_not(),
                    "available": found.available,
                    "version": found.version,
                    "schema": found.schema,
                    "created_extension": report.created_extension,
                    "created_table": report.created_table,
                    "synced": report.synced,
                    "rows": report.rows,
                }
            )
        )
    elif found.ready:
        typer.echo(
            f"pgvector {found.version} (schema {found.schema}) is on for {shown}: "
            f"mem_vectors holds {report.rows} vectors ({report.synced} written now)"
        )
    else:
        typer.echo(f"tiffany: {found.why_not()}: memory ranks its vectors in the process", err=True)
    if not found.ready:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add the ``db`` command group to the root app."""
    app.add_typer(db_app, name="db")
