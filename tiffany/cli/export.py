"""``tiffany export RUN`` and ``tiffany replay FILE --verify``: replay as a test of new code.

``export`` writes one run's journal to one file (``tiffany/durable/export.py``,
format in docs/replay.md), from the data dir's journal: the file WAL, or the
PostgreSQL stream with ``TIFFANY_JOURNAL=postgres``. ``replay FILE
--verify --import MOD`` (``tiffany/cli/durable.py`` hands a FILE here)
replays it against the code as it is now, as ``tiffany.testing.replay_file``
does in a test suite.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from tiffany.cli import DataDirOption, EngineOption, exits
from tiffany.cli.remote import TokenOption, UrlOption, remote

if TYPE_CHECKING:
    from tiffany.durable.export import ExportMeta

__all__ = ["EXPORT_SUFFIX", "register", "replay_file"]

#: The suffix ``export`` gives a file it names itself.
EXPORT_SUFFIX = ".tfx"


def export(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run to export.")],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            metavar="FILE",
            help=f"Where to write it ('-': standard output) [default: RUN{EXPORT_SUFFIX}].",
            show_default=False,
        ),
    ] = None,
    engine: EngineOption = 0,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Write one run's journal to one file, to replay it against new code (docs/replay.md).

    The file holds the run's records as the journal holds them, and a
    header (format version, the run's journal version, run id, tiffany
    version, when): ``tiffany replay FILE --verify --import MOD`` or
    ``tiffany.testing.replay_file`` replays it. A run not finished yet is
    exported as far as its journal goes; its replay checks that prefix. Reads
    the data dir's WAL, or the PostgreSQL journal (``TIFFANY_JOURNAL=postgres``),
    or with ``--url`` asks the server (``GET /api/runs/{run_id}/export``).
    Exit codes: 0 written, 3 no such run, 1 the file could not be written, 4
    the journal is damaged, 5
    the server at ``--url`` is unreachable.
    """
    import tiffany
    from tiffany.cli.durable import _engine_of_run, _source, _unknown_run, use_local_run
    from tiffany.durable import UnknownRun
    from tiffany.durable.export import export_run
    from tiffany.errors import WalError

    target: Path | None = output if output != Path("-") else None
    if output is None:
        target = Path(f"{run_id}{EXPORT_SUFFIX}")
    if url:
        meta = _export_remote(ctx, url, token, run_id, target)
        _said(meta, target)
        return
    if engine == 0:
        engine = _engine_of_run(ctx, run_id)  # serve --engines N: the journal holding it
    try:
        meta = export_run(
            _source(ctx, engine),
            run_id,
            target if target is not None else sys.stdout.buffer,
            tiffany_version=tiffany.__version__,
        )
    except UnknownRun as exc:
        if use_local_run(ctx, run_id):
            export(ctx, run_id, output, engine, url, token, None)
            return
        _unknown_run(ctx, engine, exc)
    except WalError as exc:
        typer.echo(f"tiffany: the journal cannot be read: {exc}", err=True)
        raise typer.Exit(exits.WAL_DAMAGED) from None
    except OSError as exc:
        typer.echo(f"tiffany: cannot write {target}: {exc.strerror or exc}", err=True)
        raise typer.Exit(exits.FAILED) from None
    _said(meta, target)


def _export_remote(
    ctx: typer.Context, url: str, token: str | None, run_id: str, target: Path | None
) -> ExportMeta:
    """``export --url``: the server's export of the run, checked, then written."""
    from tiffany.durable.export import parse_export, write_file
    from tiffany.errors import ExportError

    with remote(url, token, ctx) as client:
        data = client.export(run_id)
    try:
        meta = parse_export(data, f"{url} (run {run_id})").meta
    except ExportError as exc:  # the server answered something else than an export
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(exits.FAILED) from None
    try:
        if target is None:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            write_file(target, [data])
    except OSError as exc:
        typer.echo(f"tiffany: cannot write {target}: {exc.strerror or exc}", err=True)
        raise typer.Exit(exits.FAILED) from None
    return meta


def _said(meta: ExportMeta, target: Path | None) -> None:
    """One line: what was exported, where (on stderr when the file went to stdout)."""
    state = "finished " + meta.status if meta.finished else "NOT finished (running)"
    where = str(target) if target is not None else "standard output"
    typer.echo(
        f"exported run {meta.run_id} ({meta.records} records, seq {meta.first_seq}.."
        f"{meta.last_seq}, {state}) to {where}",
        err=target is None,
    )
    if not meta.finished:
        typer.echo(
            "  the run had not finished: its replay checks the code up to where its journal ends",
            err=True,
        )


def replay_file(ctx: typer.Context, path: Path, *, verify_only: bool, as_json: bool) -> NoReturn:
    """``tiffany replay FILE``: verify an export against the code (modules imported already)."""
    from tiffany.cli import _settings
    from tiffany.cli.durable import EXIT_DIVERGED, print_report
    from tiffany.durable.export import read_export, verify_export
    from tiffany.durable.runtime import EntryError
    from tiffany.engine import replay_resolvers
    from tiffany.errors import ExportError, ExportTooNew

    if not verify_only:
        typer.echo(
            f"tiffany: {path} is a file: an export is replayed with --verify only "
            "(`tiffany replay FILE --verify --import MOD`); a run is resumed by its id",
            err=True,
        )
        raise typer.Exit(exits.USAGE)
    try:
        exported = read_export(path)
    except ExportTooNew as exc:
        _refuse(exc.to_dict() if as_json else str(exc), as_json, exits.USAGE)
    except ExportError as exc:
        reason = str(exc.fields.get("reason", ""))
        code = exits.USAGE if reason.startswith("not a tiffany run export") else exits.WAL_DAMAGED
        _refuse(exc.to_dict() if as_json else str(exc), as_json, code)
    try:
        report = verify_export(exported, replay_resolvers(_settings(ctx)))
    except EntryError as exc:  # the run's code is not importable here
        _refuse(exc.to_dict() if as_json else str(exc), as_json, exits.USAGE)
    print_report(report, as_json, source=f" (from {path})")
    raise typer.Exit(exits.OK if report.ok else EXIT_DIVERGED)


def _refuse(what: object, as_json: bool, code: int) -> NoReturn:
    if as_json:
        import json

        typer.echo(json.dumps(what))
    else:
        typer.echo(f"tiffany: {what}", err=True)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``export`` to the root app."""
    app.command("export")(export)
