"""CLI commands of the durable layer: ``replay``, ``runs`` and ``wal ...``.

``tiffany replay RUN_ID`` resumes a crashed run (replay to the end of its
journal, then live); ``--verify`` replays a finished run without side
effects and exits 0 only when it replays identically. ``tiffany wal dump``
prints records (``--json`` for one JSON object per line), ``wal verify``
checks every segment without changing anything, ``wal repair`` truncates at
the first corruption (keeping a ``.broken`` copy) only when asked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tiffany.cli import DataDirOption

__all__ = ["register"]

wal_app = typer.Typer(help="Inspect, verify and repair the write-ahead log.", no_args_is_help=True)

EXIT_DIVERGED = 1
EXIT_NOT_FOUND = 3


def _wal_dir(ctx: typer.Context) -> Path:
    from tiffany.cli import _settings

    return Path(_settings(ctx).data_dir) / "wal"


def _emit(obj: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(obj, default=repr))
    else:
        typer.echo(obj if isinstance(obj, str) else json.dumps(obj, indent=2, default=repr))


def _add_paths(paths: list[Path] | None) -> None:
    for p in paths or ():
        sys.path.insert(0, str(p.resolve()))


def replay(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run to replay.")],
    verify_only: Annotated[
        bool, typer.Option("--verify", help="Check that a finished run replays identically.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    path: Annotated[
        list[Path] | None,
        typer.Option("--path", help="Add a directory to sys.path (where the run's code lives)."),
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Resume a crashed run from the WAL, or verify that a finished one replays identically."""
    from tiffany.agents.registry import ToolRegistry
    from tiffany.cli import _settings
    from tiffany.durable import UnknownRun, verify
    from tiffany.engine import build, replay_resolvers

    settings = _settings(ctx)
    _add_paths(path)
    data_dir = Path(settings.data_dir)
    try:
        if verify_only:
            report = verify(data_dir, run_id, resolvers=replay_resolvers(settings))
            if as_json:
                _emit(report.to_dict(), True)
            elif report.ok:
                typer.echo(
                    f"run {run_id} replays identically: {report.dispatches} dispatches, "
                    f"{report.records} records, status {report.status}"
                )
            else:
                typer.echo(f"run {run_id} does NOT replay identically", err=True)
                if report.divergence:
                    d = report.divergence
                    typer.echo(
                        f"  at dispatch #{d.get('dispatch')} (WAL seq {d.get('seq')}), "
                        f"task {d.get('task')} ({d.get('task_name')})",
                        err=True,
                    )
                    typer.echo(f"  expected (journal): {d.get('expected')}", err=True)
                    typer.echo(f"  actual   (code):    {d.get('actual')}", err=True)
                    for frame in d.get("stack") or ():
                        typer.echo(f"    {frame}", err=True)
                for problem in report.problems:
                    typer.echo(f"  {problem}", err=True)
            raise typer.Exit(0 if report.ok else EXIT_DIVERGED)
        engine = build(settings, enabled_tools=ToolRegistry.default().all_names())
        with engine.runtime as rt:
            resumed = rt.recover(only=[run_id])
            if not resumed:
                typer.echo(f"run {run_id} has already finished; nothing to resume", err=True)
                raise typer.Exit(0)
            rt.run()
            state = rt.status(run_id)
            out = {
                "run_id": run_id,
                "status": state.status,
                "result": state.result,
                "error": repr(state.error) if state.error else None,
            }
            _emit(out, as_json)
            raise typer.Exit(0 if state.status == "succeeded" else EXIT_DIVERGED)
    except UnknownRun as exc:
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(EXIT_NOT_FOUND) from None


def runs(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDirOption = None,
) -> None:
    """List the runs in the WAL, oldest first."""
    from tiffany.durable import scan

    index = scan(_wal_dir(ctx))
    for info in index.runs.values():
        row = {
            "run_id": info.run_id,
            "name": info.name,
            "status": info.status,
            "started_at": info.started_at,
            "ended_at": info.ended_at,
            "first_seq": info.first_seq,
        }
        if as_json:
            _emit(row, True)
        else:
            typer.echo(f"{info.run_id}  {info.status:<10} {info.name}")


@wal_app.command("dump")
def wal_dump(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's records.")] = None,
    from_seq: Annotated[int, typer.Option("--from", help="First sequence number.")] = 1,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many records.")] = None,
) -> None:
    """Print WAL records, decoded."""
    from tiffany.durable import RecordType, scan
    from tiffany.durable.records import decode
    from tiffany.wal import iter_records

    wal_dir = _wal_dir(ctx)
    prefix = None
    names: dict[int, str] = {}
    if run_id is not None:
        info = scan(wal_dir).get(run_id)
        prefix = info.run_no.to_bytes(4, "little")
        from_seq = max(from_seq, info.first_seq)
    shown = 0
    for rec in iter_records(wal_dir, from_seq=from_seq):
        if prefix is not None and bytes(rec.payload[:4]) != prefix:
            continue
        try:
            rtype = RecordType(rec.rtype).name
            run_no, fields = decode(rec.payload)
        except Exception as exc:  # noqa: BLE001 - shown, not hidden
            rtype, run_no, fields = str(rec.rtype), -1, [f"<undecodable: {exc}>"]
        if rtype == "RUN_START":
            names[run_no] = str(fields[0])
        row = {
            "seq": rec.seq,
            "type": rtype,
            "run": names.get(run_no, run_no),
            "fields": fields,
            "segment": rec.segment,
            "offset": rec.offset,
        }
        if as_json:
            _emit(row, True)
        else:
            typer.echo(
                f"{rec.seq:>8} {rtype:<10} {row['run']!s:<18} {json.dumps(fields, default=repr)}"
            )
        shown += 1
        if limit is not None and shown >= limit:
            break


@wal_app.command("verify")
def wal_verify(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check every segment and record; exit non-zero on corruption. Changes nothing."""
    from tiffany.errors import WalError
    from tiffany.wal import verify as wal_verify_fn

    try:
        report = wal_verify_fn(_wal_dir(ctx))
    except WalError as exc:
        _emit(exc.to_dict() if as_json else f"WAL corrupt: {exc}", as_json)
        raise typer.Exit(1) from None
    _emit(_as_dict(report) if as_json else f"WAL ok: {_as_dict(report)}", as_json)
    raise typer.Exit(0 if getattr(report, "ok", True) else 1)


@wal_app.command("repair")
def wal_repair(
    ctx: typer.Context,
    yes: Annotated[
        bool, typer.Option("--yes", help="Really truncate at the first corruption.")
    ] = False,
) -> None:
    """Truncate the WAL at its first corruption, keeping a ``.broken`` copy."""
    from tiffany.wal import repair as wal_repair_fn
    from tiffany.wal import verify as wal_verify_fn

    if not yes:
        typer.echo(
            "this truncates the WAL at its first bad record (a .broken copy is kept); "
            "run again with --yes",
            err=True,
        )
        raise typer.Exit(2)
    report = wal_repair_fn(_wal_dir(ctx))
    typer.echo(f"repaired: {_as_dict(report)}")
    wal_verify_fn(_wal_dir(ctx))


def _as_dict(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    return repr(obj)


def register(app: typer.Typer) -> None:
    """Add the durable layer's commands to the root app."""
    app.command("replay")(replay)
    app.command("runs")(runs)
    app.add_typer(wal_app, name="wal")
