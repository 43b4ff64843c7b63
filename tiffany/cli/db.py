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
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from tiffany.errors import TiffanyError

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from tiffany.wal import Source

__all__ = ["HistoryReleased", "RebuildReport", "rebuild_store", "register"]

db_app = typer.Typer(
    help="The SQL store: migrate its schema, rebuild it from the WAL.", no_args_is_help=True
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


def rebuild_store(
    engine: Engine,
    wal_dir: Source,
    batch_records: int = REBUILD_BATCH_RECORDS,
    *,
    shard: int = 0,
) -> RebuildReport:
    """Empty the store and project every record of the WAL (archive included) into it again.

    ``wal_dir`` may be another log (a PostgreSQL stream: ``journal=postgres``).
    ``shard``: the engine whose journal it is; only its rows are replaced
    (``serve --engines N``: tiffany/wire/shards.py).

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
    for batch in decoded_batches(wal_dir, batch_records):
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


@contextlib.contextmanager
def engines_stopped(sources: list[Source]) -> Iterator[None]:
    """Hold every file WAL's lock while the body runs; refuse a stream an engine holds.

    A rebuild empties the store and projects the journal again: beside a
    running engine it would race that engine's projector, and read records
    the engine has written but not yet made durable. With the WAL's lock
    held (as ``wal repair`` holds it), no engine runs, and none starts
    until the rebuild is done. A PostgreSQL stream's lease is the engine's
    to take: a stream whose lease is held is refused.

    Raises:
        WalLockedError: An engine runs on one of the journals.
    """
    from tiffany.errors import WalLockedError
    from tiffany.wal.lock import lock_dir, unlock
    from tiffany.wal.pg import PgStream, streams

    fds: list[int] = []
    try:
        for source in sources:
            if isinstance(source, Path):
                if source.is_dir():
                    fds.append(lock_dir(source))
            elif isinstance(source, PgStream):
                for row in streams(source.url):
                    if row["stream"] == source.stream and row["held"]:
                        raise WalLockedError(
                            f"the journal stream {source.stream!r} is held by {row['owner']} "
                            f"for {row['lease_left_s']} s more: an engine is running on it "
                            "(stop it first)",
                            stream=source.stream,
                            owner=row["owner"],
                        )
        yield
    finally:
        for fd in fds:
            unlock(fd)


@db_app.command("rebuild")
def rebuild(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Empty the store and project the whole WAL into it again (refused while an engine runs)."""
    from tiffany.cli.durable import _engines, _source
    from tiffany.store.migrate import upgrade as alembic_upgrade

    engine, shown = _engine(ctx)
    sources = [_source(ctx, e) for e in range(_engines(ctx))]
    try:
        with engines_stopped(sources):
            alembic_upgrade(engine)
            # Engine by engine (serve --engines N): each replaces its own rows.
            reports = [rebuild_store(engine, source, shard=e) for e, source in enumerate(sources)]
    except TiffanyError as exc:
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        engine.dispose()
    report = reports[-1]  # its counts are the whole store's
    report.records = sum(r.records for r in reports)
    report.orphans = sum(r.orphans for r in reports)
    report.quarantined = [q for r in reports for q in r.quarantined]
    report.last_seq = reports[0].last_seq if len(reports) == 1 else max(r.last_seq for r in reports)
    if as_json:
        typer.echo(json.dumps(asdict(report)))
        return
    statuses = ", ".join(f"{n} {s}" for s, n in report.status.items() if n)
    typer.echo(
        f"rebuilt {shown} from {report.records} records (last seq {report.last_seq}): "
        f"{report.runs} runs ({statuses or 'none'}), {report.tasks} tasks, {report.steps} steps"
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


def register(app: typer.Typer) -> None:
    """Add the ``db`` command group to the root app."""
    app.add_typer(db_app, name="db")
