"""``tiffany schedule add|list|pause|resume|rm``: cron schedules of plans or workflows.

On this data dir they write the store's ``schedules``
(``tiffany/schedules/store.py``) directly, so they work with or without a
running server; engine 0 of ``tiffany serve`` fires the ticks
(``tiffany/schedules/runner.py``). With ``--url`` (``TIFFANY_URL``) they go
through the Python SDK to that server's ``/api/schedules`` instead, as the
other remote commands do (``tiffany/cli/remote.py``): the same output, the
same exit codes, and the server checks the plan against its own tools.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tiffany.cli import DataDirOption, exits
from tiffany.cli.remote import TokenOption, UrlOption, remote
from tiffany.cli.run import EXIT_INVALID, InputsOption

__all__ = ["register"]

schedule_app = typer.Typer(help="Cron schedules of plans or workflows: each tick starts one run.")


def _sessions(ctx: typer.Context) -> Any:
    from tiffany.cli import _settings
    from tiffany.store import make_engine, session_factory
    from tiffany.store.migrate import upgrade_url

    settings = _settings(ctx)
    upgrade_url(settings.database_url)  # the table exists before the first serve, too
    return session_factory(make_engine(settings.database_url))


def _now() -> float:
    return time.time()  # noqa: TID251 - a schedule's ticks are wall-clock times


@schedule_app.command("add")
def add(
    ctx: typer.Context,
    plan_path: Annotated[
        Path | None,
        typer.Argument(metavar="[PLAN]", help="A plan file (JSON or YAML); or --workflow."),
    ] = None,
    cron: Annotated[
        str, typer.Option("--cron", help='e.g. "0 9 * * 1-5"; six fields: seconds.')
    ] = "",
    timezone: Annotated[str, typer.Option("--timezone", "--tz")] = "UTC",
    catchup: Annotated[str, typer.Option("--catchup", help="skip, one or all")] = "skip",
    inputs: InputsOption = None,
    workflow: Annotated[
        str | None,
        typer.Option(
            "--workflow",
            metavar="NAME",
            help="Schedule this @workflow instead of a plan (the server imports its module).",
        ),
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Add a schedule of a plan, or of a workflow by name; print its id.

    A workflow's name and inputs are checked by the running engine (which
    imported its module), as ``tiffany submit --workflow`` is; with no
    engine running, at its first tick (the schedule's ``last_error``).
    """
    from tiffany.agents import PlanError, parse_plan
    from tiffany.agents.registry import ToolRegistry
    from tiffany.cli.run import _load, _parse_inputs, _print_plan_errors
    from tiffany.schedules import store as schedules

    if (plan_path is None) == (workflow is None):
        typer.echo(
            "tiffany: schedule add wants a PLAN file or --workflow NAME (one of them)", err=True
        )
        raise typer.Exit(exits.USAGE)
    if not cron:
        typer.echo("tiffany: schedule add wants --cron", err=True)
        raise typer.Exit(exits.USAGE)
    doc = _load(plan_path) if plan_path is not None else None
    given = _parse_inputs(inputs)
    if url:
        with remote(url, token) as client:
            added = client.add_schedule(
                doc, cron, timezone=timezone, catchup=catchup, inputs=given, workflow=workflow
            )
        typer.echo(added.schedule_id)
        return
    if doc is None:  # a workflow's: the engine that imported it checks it
        from tiffany.cli.client import _command

        _command(ctx, lambda commands: commands.check_plan(None, given, workflow=workflow))
    else:
        try:
            parse_plan(doc, ToolRegistry.default().all_names())
        except PlanError as exc:
            _print_plan_errors(exc)
            raise typer.Exit(EXIT_INVALID) from None
    errors = schedules.check(cron, timezone, catchup)
    for e in errors:
        typer.echo(f"tiffany: --{e['loc']}: {e['msg']}", err=True)
    if errors:
        raise typer.Exit(EXIT_INVALID)
    from tiffany.cli import _settings

    with _sessions(ctx)() as session:
        try:
            row = schedules.create(
                session,
                plan=doc,
                workflow=workflow,
                inputs=given,
                cron=cron,
                timezone=timezone,
                catchup=catchup,
                now=_now(),
                max_schedules=_settings(ctx).max_schedules,
            )
        except schedules.TooManySchedules as exc:
            typer.echo(f"tiffany: {exc.message}", err=True)
            raise typer.Exit(exits.FAILED) from None
    typer.echo(row["schedule_id"])


@schedule_app.command("list")
def list_(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="JSON, one schedule a line.")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """List the schedules, oldest first: id, cron, time zone, state, next tick, last run.

    Read a page at a time (1,000 rows), printed as it comes.
    """
    from tiffany.schedules import store as schedules

    if url:
        with remote(url, token) as client:
            for row in client.schedules(page_size=schedules.MAX_PAGE):
                _print([row.model_dump()], as_json)
        return
    sessions = _sessions(ctx)
    after: str | None = None
    while True:
        with sessions() as session:
            page = schedules.list_schedules(session, _now(), after=after, limit=schedules.MAX_PAGE)
        _print(page["schedules"], as_json)
        after = page["next_after"]
        if after is None:
            return


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    for r in rows:
        if as_json:
            typer.echo(json.dumps(r))
            continue
        state = "paused" if r["paused"] else "active"
        nxt = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["next_tick"]))
            if r["next_tick"]
            else "-"
        )
        typer.echo(
            f"{r['schedule_id']}  {r['cron']!r} {r['timezone']}  {state}  next {nxt} UTC  "
            f"last run {r['last_run_id'] or '-'}  {r['name']}"
        )


def _set(
    ctx: typer.Context, schedule_id: str, paused: bool, url: str | None, token: str | None
) -> None:
    from tiffany.schedules import store as schedules

    if url:
        with remote(url, token) as client:
            if paused:
                client.pause_schedule(schedule_id)
            else:
                client.resume_schedule(schedule_id)
        typer.echo(f"{schedule_id}: {'paused' if paused else 'active'}")
        return
    with _sessions(ctx)() as session:
        if schedules.set_paused(session, schedule_id, paused, _now()) is None:
            typer.echo(f"tiffany: no schedule {schedule_id!r}", err=True)
            raise typer.Exit(exits.NOT_FOUND)
    typer.echo(f"{schedule_id}: {'paused' if paused else 'active'}")


@schedule_app.command("pause")
def pause(
    ctx: typer.Context,
    schedule_id: str,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Stop firing a schedule's ticks (those due meanwhile follow its catch-up policy)."""
    _set(ctx, schedule_id, True, url, token)


@schedule_app.command("resume")
def resume(
    ctx: typer.Context,
    schedule_id: str,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Fire a paused schedule's ticks again."""
    _set(ctx, schedule_id, False, url, token)


@schedule_app.command("rm")
def rm(
    ctx: typer.Context,
    schedule_id: str,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Delete a schedule (the runs it started stay)."""
    from tiffany.schedules import store as schedules

    if url:
        with remote(url, token) as client:
            client.delete_schedule(schedule_id)
        typer.echo(f"{schedule_id}: deleted")
        return
    with _sessions(ctx)() as session:
        if not schedules.remove(session, schedule_id):
            typer.echo(f"tiffany: no schedule {schedule_id!r}", err=True)
            raise typer.Exit(exits.NOT_FOUND)
    typer.echo(f"{schedule_id}: deleted")


def register(app: typer.Typer) -> None:
    """Add ``schedule`` to the root app."""
    app.add_typer(schedule_app, name="schedule")
