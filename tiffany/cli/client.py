"""Commands for a running engine (``tiffany serve`` on the same data dir).

``submit``, ``cancel``, ``signal``, ``rerun`` and ``status`` go through the
commands port the API uses (``tiffany/ports/commands.py``: the engines'
control sockets, ``<data dir>/control.sock``, or the database's requests on
the PostgreSQL journal); ``tail`` follows the activity feed
(``<data dir>/feed.sock``). They need no API token: the sockets are the
data dir owner's only (mode 0600).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from tiffany.cli import DataDirOption, exits
from tiffany.cli.remote import (
    TokenOption,
    UrlOption,
    control_problems,
    print_problem,
    printable,
    remote,
)
from tiffany.cli.run import InputsOption
from tiffany.wire.entries import WorkflowEntry, reading
from tiffany.wire.status import TERMINAL

if TYPE_CHECKING:
    from tiffany.config import Settings
    from tiffany.ports.commands import Commands

__all__ = ["register"]

#: Exit code when no engine answers on the data dir (the table's UNAVAILABLE).
EXIT_NO_ENGINE = exits.UNAVAILABLE

#: How long a command waits for an engine's answer, in seconds.
ANSWER_WAIT_S = 30.0

T = TypeVar("T")


def _homes(ctx: typer.Context) -> list[Path]:
    """The engines' homes under the data dir (``serve --engines N``: tiffany/wire/shards.py)."""
    from tiffany.cli import _settings
    from tiffany.wire.shards import homes

    return homes(_settings(ctx).data_dir)


@contextlib.contextmanager
def _answered(ctx: typer.Context | None = None) -> Iterator[None]:
    """Print a command's refusal as the CLI does, and exit with its code (``exits.py``).

    ``ctx``: the command's, so that a refused field names the option that
    gave it (``tiffany/cli/flags.py``).
    """
    from tiffany.errors import EngineUnavailable, Refusal

    try:
        yield
    except EngineUnavailable as exc:
        typer.echo(f"tiffany: {exc} (is `tiffany serve` running on this data dir?)", err=True)
        raise typer.Exit(EXIT_NO_ENGINE) from None
    except Refusal as exc:
        print_problem(exc.message, control_problems(exc.detail), ctx)
        raise typer.Exit(exits.for_refusal(exc)) from None


def _command(ctx: typer.Context, send: Callable[[Commands], Awaitable[T]]) -> T:
    """``send(commands)`` through the :class:`~tiffany.ports.commands.Commands` port.

    The port is the API's, chosen from the settings the same way: the
    engines' sockets, or the database's requests on the PostgreSQL journal;
    it decides which engine gets the command.
    """
    from tiffany.cli import _settings
    from tiffany.ports.commands import commands_for

    settings = _settings(ctx)

    async def run() -> T:
        commands = commands_for(settings, _store_owner(settings))
        commands.start()
        try:
            await commands.connected(LISTEN_WAIT_S)
            return await send(commands)
        finally:
            await commands.close()

    with _answered(ctx):
        return asyncio.run(run())


def _store_owner(settings: Settings) -> Callable[[str], Awaitable[int | None]]:
    """The engine that started a run, as the store says (read in a thread: blocking SQL)."""

    def read(run_id: str) -> int | None:
        from tiffany.store import make_engine, queries, session_factory
        from tiffany.wire.shards import engine_of

        store = make_engine(settings.database_url)
        try:
            with session_factory(store)() as session:
                start = queries.start_seq_of(session, run_id)
        finally:
            store.dispose()
        return None if start is None else engine_of(start)

    async def owner(run_id: str) -> int | None:
        return await asyncio.to_thread(read, run_id)

    return owner


#: How long a request through the database waits for its listener to connect, in seconds
#: (without it the answer is read from its row a second later; a database that is down
#: fails the request itself).
LISTEN_WAIT_S = 1.0


def submit(
    ctx: typer.Context,
    plan_path: Annotated[
        Path | None,
        typer.Argument(metavar="[PLAN]", help="A plan file (JSON or YAML); or --workflow."),
    ] = None,
    inputs: InputsOption = None,
    key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="Resubmitting with it returns the same run."),
    ] = None,
    workflow: Annotated[
        str | None,
        typer.Option(
            "--workflow",
            metavar="NAME",
            help="Run this @workflow instead of a plan (the server imports its module).",
        ),
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Submit a plan, or a workflow by name, to the running engine (or --url's server).

    Prints its run id once it is durable. A workflow (``--workflow NAME``) is a
    ``@workflow`` function of a module the server imported (``--import MOD``
    or ``TIFFANY_TOOL_MODULES``); ``--input`` gives its keyword arguments.
    """
    from tiffany.cli.run import _load, _parse_inputs

    if (plan_path is None) == (workflow is None):
        typer.echo("tiffany: submit wants a PLAN file or --workflow NAME (one of them)", err=True)
        raise typer.Exit(exits.USAGE)
    given = _parse_inputs(inputs, ctx)
    fields: dict[str, Any] = {"workflow": workflow} if workflow is not None else {}
    doc = _load(plan_path) if plan_path is not None else None
    if url:
        with remote(url, token, ctx) as client:
            run = client.submit(doc, inputs=given, idempotency_key=key, **fields)
        answer = {"run_id": run.run_id, "created": run.created}
    else:
        done = _command(ctx, lambda commands: commands.submit(doc, given, key, workflow=workflow))
        answer = {"run_id": done.run_id, "created": done.created}
    typer.echo(answer["run_id"])
    if not answer.get("created", True):
        typer.echo("(an earlier submission with this idempotency key)", err=True)


def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run to cancel.")],
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Cancel a running run (its tasks are killed cooperatively, subprocesses included)."""
    if url:
        with remote(url, token, ctx) as client:
            done = client.cancel(run_id)
        typer.echo(f"run {done.run_id}: {done.status}")
        return
    answer = _command(ctx, lambda commands: commands.cancel(run_id, "cancelled"))
    typer.echo(f"run {answer.run_id}: {answer.status}")


def rerun(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The finished run to re-run.")],
    from_step: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Restart at this step, or a workflow's call (tool_2) (default: where it failed).",
        ),
    ] = None,
    inputs: InputsOption = None,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Re-run a finished run from a step: the other steps reuse their recorded outputs.

    Prints the new run's id once it is durable. Steps not downstream of the
    restart point are not called again (each names the run and journal seq
    its output came from); the new run starts with a copy of the old run's
    workspace. A workflow run's re-run forks its journal before the call to
    restart from: every earlier call's result is replayed, not called again
    (docs/workflows.md).
    """
    from tiffany.cli.run import _parse_inputs

    if url:
        with remote(url, token, ctx) as client:
            again = client.rerun(
                run_id, from_step=from_step, inputs=_parse_inputs(inputs, ctx) or None
            )
        typer.echo(again.run_id)
        return
    given = _parse_inputs(inputs, ctx)
    again = _command(
        ctx, lambda commands: commands.rerun(run_id, inputs=given, from_step=from_step, key=None)
    )
    typer.echo(again.run_id)


def signal(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run to signal.")],
    name: Annotated[str, typer.Argument(help="The signal's name (a signal.wait step's name).")],
    data: Annotated[
        str | None, typer.Option("--data", help="The payload as JSON (default: null).")
    ] = None,
    signal_id: Annotated[
        str | None,
        typer.Option("--id", help="The signal's id: sending it again with the same id is a no-op."),
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Send a signal to a running run (a step waiting in signal.wait gets its payload).

    Prints the seq of the signal's journal record once it is durable.
    """
    from tiffany.wire.documents import DocumentError, load

    try:
        payload = None if data is None else load(data.encode(), "application/json", loc=["data"])
    except DocumentError as exc:
        typer.echo(f"tiffany: --data: {exc.msg}", err=True)
        raise typer.Exit(exits.USAGE) from None
    if url:
        with remote(url, token, ctx) as client:
            sent = client.signal(run_id, name, payload, signal_id=signal_id)
        typer.echo(f"run {sent.run_id}: signal {sent.name} journaled (seq {sent.seq})")
        if sent.warning:
            typer.echo(f"tiffany: warning: {printable(sent.warning)}", err=True)
        return
    sid = signal_id or uuid.uuid4().hex  # one id: a retry of this command is journaled once
    answer = _command(ctx, lambda commands: commands.signal(run_id, name, payload, sid))
    typer.echo(f"run {answer.run_id}: signal {answer.name} journaled (seq {answer.seq})")
    if answer.warning:  # no step waits for that name (it may be early)
        typer.echo(f"tiffany: warning: {printable(answer.warning)}", err=True)


def status(
    ctx: typer.Context,
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar="RUN", help="A run: its status, steps and a failed step's traceback."
        ),
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Print the running engine's status as JSON (ready, runs active, WAL position...).

    With several engines (``serve --engines N``): ``{"engines": [...]}``, one
    status an engine (``{"engine": i, "error": ...}`` for one that does not answer).
    With RUN: that run as ``tiffany run`` prints it when it ends (from the
    store, or --url's server), a failed python step's traceback on stderr.
    """
    if run_id is not None:
        _run_status(ctx, run_id, url, token)
        return
    if url:  # the server's readiness, and how many runs it is running
        with remote(url, token, ctx) as client:
            ready = client.readiness()
            ready["runs_running"] = client.list(status="running", limit=1).counts.get("running", 0)
        typer.echo(json.dumps(ready, indent=2))
        if not ready.get("ready"):
            raise typer.Exit(exits.UNAVAILABLE)
        return
    answers = _command(ctx, lambda commands: commands.status(ANSWER_WAIT_S))
    if len(answers) == 1:
        with _answered(ctx):
            if isinstance(answers[0], Exception):
                raise answers[0]
        assert isinstance(answers[0], dict)
        typer.echo(json.dumps(_with_local_times(answers[0]), indent=2))
        return
    listed: list[dict[str, Any]] = []
    for i, answer in enumerate(answers):
        if isinstance(answer, dict):
            listed.append(_with_local_times(answer))
        else:
            listed.append({"engine": i, "error": str(answer)})
    typer.echo(json.dumps({"engines": listed}, indent=2))
    if all("error" in e for e in listed):
        raise typer.Exit(EXIT_NO_ENGINE)


def _run_status(ctx: typer.Context, run_id: str, url: str | None, token: str | None) -> None:
    """``tiffany status RUN``: the run's result, in the shape ``tiffany run`` prints it."""
    from tiffany.cli.failures import print_failures

    if url:
        with remote(url, token) as client:
            detail: dict[str, Any] | None = client.get(run_id).model_dump(mode="json")
    else:
        from tiffany.cli import _settings
        from tiffany.store import make_engine, queries, session_factory

        engine = make_engine(_settings(ctx).database_url)
        try:
            with session_factory(engine)() as session:
                detail = queries.run_detail_of(session, run_id)
        finally:
            engine.dispose()
        if detail is None:
            typer.echo(f"tiffany: no run {run_id} in the store", err=True)
            raise typer.Exit(exits.NOT_FOUND)
    assert detail is not None
    result: dict[str, Any] = {"run_id": run_id, "name": detail.get("name")}
    result["kind"] = detail.get("kind")
    entry = reading(detail.get("entry"))
    code_run = isinstance(entry, WorkflowEntry)  # not a plan's: its tasks, not steps
    if isinstance(entry, WorkflowEntry):  # its function's name and inputs
        result["workflow"] = entry.workflow
        result["inputs"] = detail.get("inputs")
    result["status"] = detail.get("status")
    steps = {s["step_id"]: s for s in detail.get("steps") or ()}
    if result["status"] == "succeeded":
        result["outputs"] = detail.get("outputs")
        result["steps"] = {k: s.get("status") for k, s in steps.items()}
    else:
        error = detail.get("error") or None
        result["error"] = error
        result["steps"] = {
            k: {"status": s.get("status"), "error": s.get("error")} for k, s in steps.items()
        }
        print_failures(result["steps"])
    if code_run:
        # Each task: its function's name, its state, and (live) its current call.
        result["tasks"] = [
            {
                "ltid": t.get("ltid"),
                "name": t.get("name"),
                "parent": t.get("parent_ltid"),
                "state": t.get("state"),
                **({"call": t["blocked_on"]} if t.get("blocked_on") else {}),
            }
            for t in detail.get("tasks") or ()
        ]
        if detail.get("waiting_for") and result["status"] not in ("succeeded", "failed"):
            result["waiting_for"] = detail["waiting_for"]
    typer.echo(json.dumps(result, indent=2, default=repr))


def _with_local_times(status: dict[str, Any]) -> dict[str, Any]:
    """An engine's status with its start as local time and its uptime, for people."""
    started = status.get("started_at")
    if isinstance(started, int | float) and not isinstance(started, bool):
        import time

        from tiffany.cli.durable import _age, local_time

        status = {**status, "started": local_time(started)}
        status["up"] = _age(time.time() - started).removesuffix(" ago")  # noqa: TID251
    return status


def tail(
    ctx: typer.Context,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's events.")] = None,
    since: Annotated[int | None, typer.Option(help="Resume after this seq.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON event per line (feed schema v2).")
    ] = False,
    kernel: Annotated[
        bool,
        typer.Option(
            "--kernel",
            help="Every event of the feed, each kernel dispatch (queue_get, woke...) included.",
        ),
    ] = False,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Follow the runs step by step (Ctrl-C stops); with --run, that run, until it finishes.

    One line per run started or finished, step started, retrying, finished
    or failed (with its duration), and signal; --kernel shows every event of
    the activity feed instead, and --json prints the events shown as JSON.
    With --run, from the run's first event the engine still holds: a run that
    already finished shows them and ends at once; an unknown run exits 3.
    """
    from tiffany.cli.tailview import TailView
    from tiffany.feed.transport import FEED_SOCKET, follow

    view = TailView(kernel=kernel, as_json=as_json)
    if url:
        with remote(url, token, ctx) as client, contextlib.suppress(KeyboardInterrupt):
            for item in client.events(run_id, since=since, until_finished=run_id is not None):
                view.show(item.model_dump(exclude_none=True))
        return

    paths = [home / FEED_SOCKET for home in _homes(ctx)]
    if not paths[0].exists():
        typer.echo(f"tiffany: no feed at {paths[0]} (is `tiffany serve` running?)", err=True)
        raise typer.Exit(EXIT_NO_ENGINE)
    start = _run_start(ctx, run_id) if run_id is not None and since is None else None

    async def frames() -> Any:
        """Every engine's feed, as the frames come (``--since`` is engine 0's)."""
        if start is not None:  # the run's engine, from its first event the ring still holds
            engine, first, _ = start
            async for frame in follow(paths[engine], since=first, run_id=run_id):
                yield frame
            return
        if len(paths) == 1:
            async for frame in follow(paths[0], since=since, run_id=run_id):
                yield frame
            return
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def pump(path: Path, resume: int | None) -> None:
            async for frame in follow(path, since=resume, run_id=run_id):
                await queue.put(frame)

        tasks = [
            asyncio.create_task(pump(p, since if i == 0 else None)) for i, p in enumerate(paths)
        ]
        try:
            while True:
                yield await queue.get()
        finally:
            for task in tasks:
                task.cancel()

    async def main() -> None:
        async for frame in frames():
            if start is not None and frame.get("type") == "gone" and start[2] is not None:
                # Its events have left the ring, its end too: say how it ended.
                typer.echo(f"run {run_id}: finished ({start[2]}); its events are no longer held")
                return
            view.show(frame)
            if run_id is not None and frame.get("kind") == "run.finished":
                return

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def _run_start(ctx: typer.Context, run_id: str) -> tuple[int, int, str | None]:
    """Where ``tail --run`` follows a run from: ``(engine, since, status if finished)``.

    From the store, once it holds what every engine had made durable (a run
    just submitted is there): the run's engine and the feed seq just before
    its first event, so the events the ring still holds of it come first and
    a run that already finished ends the tail with its ``run.finished``
    (following from now on, that never came). Exits 3 for an unknown run.
    """
    from tiffany.cli import _settings
    from tiffany.feed.events import SEQS_PER_RECORD
    from tiffany.store import make_engine, queries, session_factory
    from tiffany.wire.control import call
    from tiffany.wire.shards import engine_of, seq_base

    with _answered(ctx):
        for home in _homes(ctx):
            call(home, "wait_projected", written=True)
    store = make_engine(_settings(ctx).database_url)
    try:
        with session_factory(store)() as session:
            row = queries.get_run(session, run_id)
            start_seq = None if row is None else queries.start_seq_of(session, run_id)
            status = None if row is None else str(row.status)
    finally:
        store.dispose()
    if start_seq is None:
        typer.echo(f"tiffany: no run {run_id!r}", err=True)
        raise typer.Exit(exits.NOT_FOUND)
    engine = engine_of(start_seq)
    since = (start_seq - seq_base(engine)) * SEQS_PER_RECORD - 1
    return engine, since, status if status in TERMINAL else None


def register(app: typer.Typer) -> None:
    """Add ``submit``, ``cancel``, ``signal``, ``rerun``, ``status`` and ``tail`` to ``app``."""
    app.command("submit")(submit)
    app.command("cancel")(cancel)
    app.command("signal")(signal)
    app.command("rerun")(rerun)
    app.command("status")(status)
    app.command("tail")(tail)
