"""``tiffany wal ...``: inspect, verify and repair the write-ahead log.

``tiffany wal dump`` prints records (``--json`` for one JSON object per
line), ``wal verify`` checks every segment, archived ones included, without
changing anything and says in one line whether the log is ok or where it is
damaged, ``wal streams`` lists the PostgreSQL journal's streams, ``wal repair
--salvage`` keeps every record that checks out (``tiffany/wal/salvage.py``),
fails the runs that lost records with the reason (a RUN_END ``failed`` each)
and rebuilds the store (sequence numbers shift); ``wal repair --yes``
truncates at the first damage. Both discard the checkpoints (their sequence
numbers no longer hold).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tiffany.cli import DataDirOption, EngineOption, exits, hints
from tiffany.cli.durable import (
    _as_dict,
    _emit,
    _engine_of_run,
    _existing_wal_dir,
    _journals,
    _json,
    _record_time,
    _source,
    _unknown_run,
    _wal_dir,
)

if TYPE_CHECKING:
    from tiffany.wal import Loss

wal_app = typer.Typer(help="Inspect, verify and repair the write-ahead log.", no_args_is_help=True)


@wal_app.command("dump")
def wal_dump(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's records.")] = None,
    from_seq: Annotated[int, typer.Option("--from", help="First sequence number.")] = 1,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many records.")] = None,
    engine: EngineOption = 0,
    data_dir: DataDirOption = None,
) -> None:
    """Print WAL records, decoded."""
    from tiffany.durable import UnknownRun, scan
    from tiffany.wal import spans_of
    from tiffany.wal.format import RECORD_HEADER_SIZE_BYTES
    from tiffany.wire.records import RecordType, Unknown, as_list, decode

    prefix = None
    names: dict[int, str] = {}
    if run_id is not None and engine == 0:
        engine = _engine_of_run(ctx, run_id)  # serve --engines N: the journal holding it
    source = _source(ctx, engine)
    if run_id is not None:
        try:
            info = scan(source).get(run_id)
        except UnknownRun as exc:
            _unknown_run(ctx, engine, exc)
        prefix = info.run_no.to_bytes(4, "little")
        from_seq = max(from_seq, info.first_seq)
    shown = 0
    for seq, code, data, start, end, segment in spans_of(source, from_seq=from_seq):
        payload = data[start:end]
        if prefix is not None and bytes(payload[:4]) != prefix:
            continue
        try:
            record = decode(code, payload)
            rtype = str(code) if isinstance(record, Unknown) else RecordType(code).name
            run_no, fields = int.from_bytes(payload[:4], "little"), as_list(record)
        except Exception as exc:  # noqa: BLE001 - shown, not hidden
            rtype, run_no, fields = str(code), -1, [f"<undecodable: {exc}>"]
        if rtype == "RUN_START":
            names[run_no] = str(fields[0])
        row = {
            "seq": seq,
            "type": rtype,
            "run": names.get(run_no, run_no),
            "fields": fields,
            "segment": segment,  # the stream's name, in PostgreSQL
            "offset": start - RECORD_HEADER_SIZE_BYTES if isinstance(source, Path) else 0,
        }
        if as_json:
            _emit(row, True)
        else:
            when = _record_time(rtype, fields)
            typer.echo(
                f"{seq:>8} {rtype:<10} {row['run']!s:<18} {_json(fields)}"
                + (f"  ({when})" if when else "")
            )
        shown += 1
        if limit is not None and shown >= limit:
            break


@wal_app.command("verify")
def wal_verify(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    engine: EngineOption = 0,
    data_dir: DataDirOption = None,
) -> None:
    """Check every segment and record; exit non-zero on damage. Changes nothing."""
    from tiffany.errors import WalError
    from tiffany.wal import verify as wal_verify_fn
    from tiffany.wal.segments import ARCHIVE_DIR_NAME, list_segments

    if not _journals(ctx).repairable:  # the database keeps its integrity: read every record
        _verify_stream(ctx, as_json, engine)
        return
    wal_dir = _existing_wal_dir(ctx, engine)
    try:
        report = wal_verify_fn(wal_dir, archived=True)
        archived = len(list_segments(wal_dir / ARCHIVE_DIR_NAME))
    except WalError as exc:
        _emit(exc.to_dict() if as_json else f"WAL unreadable: {exc}", as_json)
        raise typer.Exit(exits.WAL_DAMAGED) from None
    if as_json:
        _emit(_as_dict(report), True)
    elif report.corruption is not None:
        from tiffany.cli import _settings

        c = report.corruption
        again = hints.again(_settings(ctx).data_dir) + (f" --engine {engine}" if engine else "")
        typer.echo(
            f"WAL DAMAGED at segment {c.get('segment')} offset {c.get('offset')} "
            f"(seq {c.get('seq')}): {c.get('reason')}; run `tiffany wal repair --salvage{again}`",
            err=True,
        )
        typer.echo(
            f"  corrupt: {report.records} records check out before it; "
            f"`tiffany wal repair --salvage{again}` keeps every intact record after it too",
            err=True,
        )
    else:
        span = f" (seq {report.first_seq}..{report.last_seq})" if report.records else ""
        kept = f", {archived} of them archived" if archived else ""
        typer.echo(f"WAL ok: {report.records} records in {report.segments} segments{kept}{span}")
        if report.torn is not None:
            t = report.torn
            typer.echo(
                f"  the last segment {t.segment} ends in a torn tail at offset {t.offset} "
                f"({t.bytes_dropped} bytes, {t.reason}; never acknowledged): the next "
                "open cuts it"
            )
    raise typer.Exit(exits.OK if report.ok else exits.WAL_DAMAGED)


def _verify_stream(ctx: typer.Context, as_json: bool, engine: int = 0) -> None:
    """``wal verify`` of a PostgreSQL stream: every record read, seqs gapless up to the head."""
    from tiffany.errors import WalError
    from tiffany.wal import spans_of
    from tiffany.wire.records import decode

    stream = _source(ctx, engine)
    records, first, last, bad = 0, 0, 0, []
    try:
        for seq, code, data, start, end, _ in spans_of(stream):
            first = first or seq
            last = seq
            records += 1
            try:
                decode(code, data[start:end])
            except Exception as exc:  # noqa: BLE001 - reported, with its seq
                bad.append({"seq": seq, "error": f"{type(exc).__name__}: {exc}"})
    except WalError as exc:
        _emit(exc.to_dict() if as_json else f"journal unreadable: {exc}", as_json)
        raise typer.Exit(exits.WAL_DAMAGED) from None
    report = {"stream": stream.stream, "ok": not bad, "records": records, "first_seq": first}
    report |= {"last_seq": last, "undecodable": bad}
    if as_json:
        _emit(report, True)
    elif bad:
        typer.echo(f"journal stream {stream.stream!r}: {len(bad)} undecodable records", err=True)
        for b in bad[:20]:
            typer.echo(f"  seq {b['seq']}: {b['error']}", err=True)
    else:
        span = f" (seq {first}..{last})" if records else ""
        typer.echo(f"journal ok: {records} records in stream {stream.stream!r}{span}")
    raise typer.Exit(exits.WAL_DAMAGED if bad else exits.OK)


@wal_app.command("streams")
def wal_streams(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDirOption = None,
) -> None:
    """List the PostgreSQL journal's streams: head, epoch, which engine holds each, for how long."""
    from tiffany.errors import JournalUnsupported, WalError

    try:
        found = _journals(ctx).streams()
    except (JournalUnsupported, WalError) as exc:
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(1) from None
    for row in found:
        if as_json:
            _emit(row, True)
            continue
        holder = (
            f"held by {row['owner']} for {row['lease_left_s']:.1f} s more"
            if row["held"]
            else f"free (last held by {row['owner']})"
        )
        typer.echo(f"{row['stream']:<20} head {row['head']:>10}  epoch {row['epoch']:>4}  {holder}")


@wal_app.command("repair")
def wal_repair(
    ctx: typer.Context,
    yes: Annotated[
        bool,
        typer.Option("--yes", help="Truncate at the first damage (drops everything after it)."),
    ] = False,
    salvage: Annotated[
        bool,
        typer.Option(
            "--salvage",
            help="Keep every record that checks out; fail the runs that lost records.",
        ),
    ] = False,
    engine: EngineOption = 0,
    data_dir: DataDirOption = None,
) -> None:
    """Repair a damaged WAL: ``--salvage`` keeps every good record, ``--yes`` truncates."""
    from tiffany.errors import WalError

    try:
        _repair(ctx, yes=yes, salvage=salvage, engine=engine)
    except WalError as exc:  # locked by a running engine, or another format
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(1) from None


def _repair(ctx: typer.Context, *, yes: bool, salvage: bool, engine: int = 0) -> None:
    if salvage:
        _salvage(ctx, engine)
        return
    if not yes:
        typer.echo(
            "tiffany wal repair needs one of:\n"
            "  --salvage  keep every record that checks out, fail the runs that lost "
            "records, resume the others (recommended)\n"
            "  --yes      truncate at the first damage: every record after it is dropped "
            "(kept in .broken files)",
            err=True,
        )
        raise typer.Exit(2)
    from tiffany.wal import repair as wal_repair_fn
    from tiffany.wal.salvage import scan_salvage

    wal_dir = _existing_wal_dir(ctx, engine)
    intact = len(scan_salvage(wal_dir)[0])
    report = wal_repair_fn(wal_dir)
    if report.corruption is None:
        typer.echo("WAL ok: nothing to repair")
        return
    c = report.corruption
    dropped = max(0, intact - report.records_kept)
    where = f"{report.truncated} at offset {report.offset}" if report.truncated else c["segment"]
    typer.echo(
        f"repaired: truncated the WAL at segment {c['segment']} offset {c['offset']} "
        f"(seq {c['seq']}: {c['reason']}): kept {report.records_kept} records, "
        f"DROPPED {dropped} records that still checked out after it"
    )
    typer.echo(f"  cut {where}; set aside whole: {', '.join(report.moved_aside) or 'none'}")
    typer.echo(
        f"  the dropped bytes are in: {', '.join(report.copies + report.moved_aside) or '-'}"
    )
    _discard_checkpoints(wal_dir)
    _rebuild_store(ctx, engine)


def _salvage(ctx: typer.Context, engine: int = 0) -> None:
    """``wal repair --salvage``: rewrite the log, fail the runs that lost records, rebuild."""
    from tiffany.wal import salvage as wal_salvage_fn

    charged: dict[str, list[str]] = {}
    report = wal_salvage_fn(
        _existing_wal_dir(ctx, engine),
        finish=lambda recs, losses: _fail_losers(recs, losses, charged),
    )
    if not report.losses:
        typer.echo("WAL ok: nothing lost, nothing to salvage")
        return
    typer.echo(
        f"salvaged the WAL: {report.records_kept} records kept in {len(report.written)} "
        f"new segments (seq {report.first_seq}..{report.last_seq}); the damaged originals "
        f"are {', '.join(n + '.broken' for n in report.moved_aside)}"
    )
    for loss in report.losses:
        typer.echo(f"  lost: {loss.describe()}")
    if charged:
        typer.echo("runs that lost records:")
        for run_id, reasons in charged.items():
            typer.echo(f"  {run_id}: {'; '.join(reasons)}")
    else:
        typer.echo("no unfinished run lost a record; every run resumes")
    _discard_checkpoints(_wal_dir(ctx, engine))
    _rebuild_store(ctx, engine)


def _fail_losers(
    records: list[tuple[int, bytes]], losses: list[Loss], charged: dict[str, list[str]]
) -> list[tuple[int, bytes]]:
    """Charge each loss to its runs; return a RUN_END ``failed`` for each still running.

    A skipped frame whose payload names a run live at that point is that
    run's loss; any other loss is charged to every run live (started, not
    ended) where it happened. A run that ended after its loss keeps its end.
    """
    from tiffany.durable.records import pack_error
    from tiffany.errors import WalCorruptionError
    from tiffany.wire.records import RUN_PREFIX, RecordType, RunEnd, decode, encode, run_of

    live: dict[int, str] = {}
    reasons: dict[int, list[Loss]] = {}
    pending = sorted(losses, key=lambda x: x.kept_before)
    li = 0
    for i in range(len(records) + 1):
        while li < len(pending) and pending[li].kept_before <= i:
            loss = pending[li]
            li += 1
            if loss.records == 0:
                continue
            owner = run_of(loss.prefix) if loss.prefix is not None else None
            for run_no in [owner] if owner in live else list(live):
                assert run_no is not None
                reasons.setdefault(run_no, []).append(loss)
        if i == len(records):
            break
        rtype, payload = records[i]
        if rtype == RecordType.RUN_START:
            live[run_of(payload)] = str(decode(rtype, payload).run_id)  # type: ignore[union-attr]
        elif rtype == RecordType.RUN_END:
            run_no = run_of(payload)
            if run_no in reasons and run_no in live:
                charged[live[run_no]] = [
                    "ended before the salvage, left as it ended; lost "
                    + "; ".join(x.describe() for x in reasons[run_no])
                ]
            live.pop(run_no, None)
    out: list[tuple[int, bytes]] = []
    for run_no, run_losses in reasons.items():
        if run_no not in live:
            continue
        first = run_losses[0]
        described = [x.describe() for x in run_losses]
        error = WalCorruptionError(
            f"the WAL lost records of this run: {'; '.join(described)} "
            "(salvaged by `tiffany wal repair --salvage`)",
            segment=first.segment,
            offset=first.offset,
            seq=first.seq,
            reason=first.reason,
        )
        charged[live[run_no]] = ["now FAILED; lost " + "; ".join(described)]
        end = RunEnd("failed", pack_error(error), time.time())  # noqa: TID251 - a record's wall time
        out.append((int(RecordType.RUN_END), encode(RUN_PREFIX.pack(run_no), end)))
    return out


def _discard_checkpoints(wal_dir: Path) -> None:
    """Drop the checkpoints of a log whose sequence numbers a repair changed."""
    from tiffany.durable.checkpoint import discard_checkpoints

    gone = discard_checkpoints(wal_dir)
    if gone:
        typer.echo(f"  discarded the checkpoints {', '.join(gone)}: the next start scans the WAL")


def _rebuild_store(ctx: typer.Context, engine_no: int = 0) -> None:
    """Rebuild the SQL store from the repaired WAL (its sequence numbers changed)."""
    from tiffany.cli import _settings
    from tiffany.cli.db import _engine, rebuild_store
    from tiffany.store.migrate import upgrade as alembic_upgrade

    try:
        engine, shown = _engine(ctx)
        try:
            alembic_upgrade(engine)
            done = rebuild_store(engine, _source(ctx, engine_no), shard=engine_no)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - said, with what to do
        typer.echo(
            f"the store could not be rebuilt ({exc}); run `tiffany"
            f"{hints.again(_settings(ctx).data_dir)} db rebuild` before starting the engine",
            err=True,
        )
        raise typer.Exit(1) from None
    typer.echo(f"rebuilt the store {shown} from {done.records} records")
