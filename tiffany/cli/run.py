"""``tiffany run PLAN`` and ``tiffany plan validate|graph``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from tiffany.cli import DataDirOption, exits
from tiffany.cli.failures import print_failures
from tiffany.cli.imports import ImportOption, import_tool_modules, tool_modules
from tiffany.cli.interrupt import CtrlC

__all__ = ["register"]

plan_app = typer.Typer(help="Validate and draw plans.", no_args_is_help=True)

EXIT_FAILED = exits.FAILED
EXIT_INVALID = exits.USAGE


#: ``--input key=value`` (repeatable), for the commands that take a plan.
InputsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        "-i",
        metavar="KEY=VALUE",
        help="An input, key=value (JSON values allowed; repeatable).",
    ),
]


def _parse_inputs(pairs: list[str] | None, ctx: typer.Context | None = None) -> dict[str, Any]:
    """``--input key=value`` options as a dict (a value that parses as JSON is that value).

    A pair without ``=`` exits 2 naming the option as it was typed (``-i``
    or ``--input``).
    """
    from tiffany.cli.flags import typed_flag

    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            flag = typed_flag(ctx, "inputs", pair.__eq__)
            typer.echo(f"tiffany: {flag} wants key=value, got {pair!r}", err=True)
            raise typer.Exit(EXIT_INVALID)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _parse_signals(pairs: list[str] | None) -> list[tuple[str, Any]]:
    """``--signal NAME=JSON`` options: (name, payload), the JSON checked like a request body."""
    import re

    from tiffany.documents import SIGNAL_NAME_PATTERN, DocumentError, load
    from tiffany.records import reserved_signal, reserved_signal_message

    out: list[tuple[str, Any]] = []
    for pair in pairs or ():
        name, sep, text = pair.partition("=")
        if not sep or re.match(SIGNAL_NAME_PATTERN, name) is None:
            msg = f"tiffany: --signal wants NAME=JSON with a valid name, got {pair!r}"
            typer.echo(msg, err=True)
            raise typer.Exit(EXIT_INVALID)
        if reserved_signal(name) is not None:
            typer.echo(f"tiffany: --signal: {reserved_signal_message(name)}", err=True)
            raise typer.Exit(EXIT_INVALID)
        try:
            payload = None
            if text:
                payload = load(text.encode(), "application/json", loc=["signal", name])
        except DocumentError as exc:
            typer.echo(f"tiffany: --signal {name}: {exc.msg}", err=True)
            raise typer.Exit(EXIT_INVALID) from None
        out.append((name, payload))
    return out


def _signal_hint(console: Any, *, quiet: bool) -> Any:
    """An instrument that says once per signal name, on stderr, how to send it.

    (The live view shows the wait in its task tree; without it, a run
    waiting a day for an approval would look hung.)
    """
    from tiffany.kernel import Instrument, Receive

    said: set[str] = set()

    class SignalHint(Instrument):
        def task_blocked(self, task: Any, call: Any) -> None:
            if call.__class__ is not Receive or call.channel in said or quiet:
                return
            said.add(call.channel)
            run_id = getattr(getattr(task.meta, "run", None), "run_id", "RUN_ID")
            console.print(
                f"run {run_id} waits for signal {call.channel}: Ctrl-C leaves it waiting in "
                f"this data dir; `tiffany serve` resumes it and `tiffany signal {run_id} "
                f"{call.channel} --data JSON` (or the dashboard) sends it; or run again with "
                "--signal",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )

    return SignalHint()


def _check_signals(doc: dict[str, Any], inputs: dict[str, Any], sent: list[Any]) -> None:
    """Hold ``--signal`` payloads to the plan's waits' schemas, as a server does (exit 2)."""
    from tiffany.agents.tools.signal import RunSignals
    from tiffany.cli.remote import control_problems, print_problem

    waits = RunSignals.of_steps(doc.get("steps"), inputs)
    for name, payload in sent:
        refused = waits.refusal(name, payload)
        if refused is not None:
            print_problem(f"--signal {refused[0]}", control_problems(refused[1]))
            raise typer.Exit(EXIT_INVALID)
        warning = waits.warning(name, "the plan")
        if warning is not None:
            typer.echo(f"tiffany: warning: --signal {warning}", err=True)


def _signals_awaited(run: Any) -> list[str]:
    """The signal names the run's tasks wait for (a run the loop left stalled)."""
    if run is None:
        return []
    return sorted(name for name, waiting in run.receivers.items() if waiting)


def _load(path: Path) -> dict[str, Any]:
    from tiffany.agents import PlanError, load_plan

    try:
        return load_plan(path)
    except FileNotFoundError:
        typer.echo(f"tiffany: no such plan file: {path}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    except OSError as exc:  # a directory, no permission
        typer.echo(f"tiffany: cannot read plan file {path}: {exc.strerror or exc}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    except PlanError as exc:
        _print_plan_errors(exc)
        raise typer.Exit(EXIT_INVALID) from None


def _print_plan_errors(exc: Any, ctx: typer.Context | None = None) -> None:
    """A refused plan as every command prints one (an input's problem names its --input)."""
    from tiffany.cli.remote import print_problem

    print_problem(exc.message, [(e["loc"], e["msg"]) for e in exc.errors], ctx)


def run(
    ctx: typer.Context,
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="A plan file (JSON or YAML).")],
    inputs: InputsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON only.")] = False,
    live: Annotated[
        bool, typer.Option("--live/--no-live", help="The live task view (on a terminal).")
    ] = True,
    signals: Annotated[
        list[str] | None,
        typer.Option(
            "--signal",
            metavar="NAME=JSON",
            help="Send the run signal NAME with a JSON payload up front (repeatable).",
        ),
    ] = None,
    imports: ImportOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Run a plan on the embedded engine with a live view; print its outputs.

    A ``signal.wait`` step takes the ``--signal`` of its name (sent at the
    run's start and kept until it waits). A run left waiting for a signal
    nobody sent stays unfinished in the data dir: ``tiffany serve`` resumes
    it and ``tiffany signal RUN NAME --data JSON`` (or the dashboard) sends it.
    """
    from rich.console import Console
    from rich.live import Live

    from tiffany.agents import PlanError
    from tiffany.cli import _build_engine, _settings
    from tiffany.cli.live import LiveView

    settings = _settings(ctx)
    doc = _load(plan_path)
    given = _parse_inputs(inputs, ctx)
    sent = _parse_signals(signals)
    import_tool_modules(tool_modules(settings.tool_modules, imports))
    from tiffany.agents import parse_plan
    from tiffany.agents.plan import check_inputs
    from tiffany.agents.registry import ToolRegistry
    from tiffany.agents.tools.python import check_python_steps

    try:  # validate before the engine opens the data directory, as a server checks a submission
        plan = parse_plan(doc, ToolRegistry.default().all_names(), strict=True)
        unknown = check_inputs(plan, given)
        if unknown:
            raise PlanError(unknown)
    except PlanError as exc:
        _print_plan_errors(exc, ctx)
        raise typer.Exit(EXIT_INVALID) from None
    _check_signals(doc, {**plan.inputs, **given}, sent)
    from tiffany.wal.lock import holder

    console = Console(stderr=True)
    view = LiveView(total_steps=len(doc.get("steps") or ()))
    use_live = live and console.is_terminal and not as_json
    server = holder(Path(settings.data_dir) / "wal")
    if server is not None:  # `tiffany serve` holds the data dir: run the plan there
        code = _run_on_server(
            settings, server, doc, given, sent, as_json, view, console, use_live, ctx
        )
        raise typer.Exit(code)
    uncallable = check_python_steps(plan.steps)  # here: the functions this process imported
    if uncallable:
        _print_plan_errors(PlanError(uncallable), ctx)
        raise typer.Exit(EXIT_INVALID)
    engine = _build_engine(
        settings,
        enabled_tools=ToolRegistry.default().all_names(),
        instruments=[view, _signal_hint(console, quiet=use_live)],
        emit=view.on_event,
    )
    with CtrlC(engine.runtime.sched) as ctrl_c:  # until the run's state is read and the WAL closed
        try:
            try:
                run_id = engine.submit_plan(doc, given)
            except PlanError as exc:
                _print_plan_errors(exc, ctx)
                raise typer.Exit(EXIT_INVALID) from None
            for i, (name, payload) in enumerate(sent):  # journaled at the first wait stage
                engine.runtime.journal.request_signal(
                    run_id, name, payload, f"run-option-{i}", lambda seq, ended: None
                )
            with ctrl_c.loop():
                if use_live:
                    with Live(
                        get_renderable=view.render,
                        console=console,
                        refresh_per_second=8,
                        transient=False,
                    ):
                        engine.runtime.run()
                else:
                    engine.runtime.run()
            state = engine.runtime.status(run_id)
            waits = _signals_awaited(engine.runtime.journal.runs.get(run_id))
        finally:
            engine.runtime.close()
    if ctrl_c.pressed and state.status == "running":
        # The modules its python steps need go with the command that resumes it.
        again = "".join(f" --import {m}" for m in tool_modules((), imports))
        typer.echo(
            f"tiffany: interrupted; run {run_id} stays in this data dir: `tiffany replay "
            f"{run_id}{again}` resumes it (or `tiffany serve{again}`, which resumes every "
            "unfinished run)",
            err=True,
        )
        raise typer.Exit(exits.INTERRUPTED)
    if state.status == "running" and waits:
        names = ", ".join(waits)
        typer.echo(
            f"tiffany: run {run_id} waits for signal {names}: pass --signal NAME=JSON, or serve "
            f"this data dir (`tiffany serve`: it resumes the run) and send it with "
            f"`tiffany signal {run_id} NAME --data JSON` or the dashboard",
            err=True,
        )
    raise typer.Exit(report(settings, run_id, state, view.summary(), use_live, as_json))


def _run_on_server(
    settings: Any,
    pid: int,
    doc: dict[str, Any],
    given: dict[str, Any],
    sent: list[tuple[str, Any]],
    as_json: bool,
    view: Any,
    console: Any,
    use_live: bool,
    ctx: typer.Context | None = None,
) -> int:
    """``tiffany run`` while a server holds the data dir: submit there, follow, print the result.

    The plan goes through the engine's control socket (as ``submit``), the
    ``--signal`` payloads after it; its activity is followed on the engine's
    feed from the run's first record on, into the same live view a local run
    shows (:meth:`LiveView.on_feed`); the result is read from the store once
    the run has finished, and printed in the shape a local run prints.
    Ctrl-C stops following; the run goes on in the server.
    """
    import asyncio
    import contextlib

    from rich.live import Live

    from tiffany.control import ControlError, ControlUnavailable, call
    from tiffany.pal.events import SEQS_PER_RECORD
    from tiffany.pal.transport import FEED_SOCKET, follow

    data_dir = Path(settings.data_dir)
    try:
        answer = call(data_dir, "submit", plan=doc, inputs=given, key=None)
        run_id = str(answer["run_id"])
        # The feed's keys start at the record's seq times SEQS_PER_RECORD
        # (tiffany/pal/events.py; engine 0, whose control socket this is).
        since = max(0, int(answer["seq"]) * SEQS_PER_RECORD - 1)
        for i, (name, payload) in enumerate(sent):
            sid = f"run-option-{run_id}-{i}"
            call(data_dir, "signal", run_id=run_id, name=name, payload=payload, signal_id=sid)
    except ControlUnavailable as exc:
        typer.echo(
            f"tiffany: the data dir is in use by pid {pid}, whose engine does not answer ({exc}); "
            "stop it, or use another --data-dir",
            err=True,
        )
        return exits.UNAVAILABLE
    except ControlError as exc:
        from tiffany.cli.remote import control_problems, print_problem

        print_problem(exc.message, control_problems(exc.detail), ctx)
        return exits.for_status(exc.status)
    typer.echo(
        f"tiffany: this data dir is served (pid {pid}): run {run_id} submitted to the server; "
        "following it (Ctrl-C stops following, the run goes on)",
        err=True,
    )

    async def watch() -> None:
        async for frame in follow(data_dir / FEED_SOCKET, since=since, run_id=run_id):
            view.on_feed(frame)
            if frame.get("kind") == "run.finished":
                return

    try:
        if use_live:
            with Live(
                get_renderable=view.render, console=console, refresh_per_second=8, transient=False
            ):
                asyncio.run(watch())
        else:
            asyncio.run(watch())
    except KeyboardInterrupt:
        typer.echo(
            f"tiffany: stopped following; run {run_id} goes on in the server "
            f"(`tiffany tail --run {run_id}` follows it again)",
            err=True,
        )
        return exits.INTERRUPTED
    detail = _finished_in_store(settings, run_id)
    if detail is None:
        typer.echo(f"tiffany: run {run_id} finished; the store has not shown it yet", err=True)
        return exits.FAILED
    result: dict[str, Any] = {"run_id": run_id, "status": detail["status"]}
    steps = {s["step_id"]: s for s in detail.get("steps") or ()}
    if detail["status"] == "succeeded":
        result["outputs"] = detail.get("outputs")
        result["steps"] = {k: s["status"] for k, s in steps.items()}
    else:
        error = detail.get("error") or {}
        result["error"] = (
            f"{error.get('type') or 'Error'}: {error.get('message')}" if error else None
        )
        result["steps"] = {
            k: {"status": s["status"], "error": s.get("error")} for k, s in steps.items()
        }
    with contextlib.suppress(BrokenPipeError):
        if not as_json and not use_live:
            console.print(view.summary())
        if not as_json:
            print_failures(result.get("steps"))
        typer.echo(json.dumps(result, default=repr) if as_json else json.dumps(result, indent=2))
    return exits.OK if detail["status"] == "succeeded" else exits.FAILED


def _finished_in_store(settings: Any, run_id: str, timeout: float = 30.0) -> Any:
    """The run's detail once the store shows it finished (it follows the journal), or None."""
    import time

    from tiffany.store import make_engine, queries, session_factory

    engine = make_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            with sessions() as session:
                detail = queries.run_detail_of(session, run_id)
            if detail is not None and detail["status"] in ("succeeded", "failed", "cancelled"):
                return detail
            if time.monotonic() > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
    finally:
        engine.dispose()


def report(
    settings: Any, run_id: str, state: Any, summary: Any, use_live: bool, as_json: bool
) -> int:
    """Project the run into the store, print its result; return the exit code.

    ``run`` and ``replay`` both end here, so both print one shape: the
    task summary (unless the live view showed it), then ``{"run_id",
    "status", "outputs", "steps"}`` (or ``"error"``).
    """
    from rich.console import Console

    from tiffany.engine import journal_source
    from tiffany.engine.projection import project_wal
    from tiffany.store.projector import StoreJournalMismatch

    stale = None
    try:
        project_wal(settings.database_url, journal_source(settings))  # into the store
    except StoreJournalMismatch as exc:  # the run is journaled; only the store is behind
        stale = exc
        typer.echo(f"tiffany: the store was not updated: {exc}", err=True)
    from tiffany.store.records import jsonable

    result = jsonable(
        run_result(run_id, state)
    )  # tuple keys, NaN, big ints: as the store shows them
    if as_json:
        typer.echo(json.dumps(result, default=repr))
    else:
        if not use_live:
            Console(stderr=True).print(summary)
        print_failures(result.get("steps"))  # a python step's traceback, as Python prints it
        typer.echo(json.dumps(result, indent=2, default=repr))
    return exits.OK if state.status == "succeeded" and stale is None else exits.FAILED


def run_result(run_id: str, state: Any) -> dict[str, Any]:
    """A finished (or stopped) run as ``run`` and ``replay`` print it."""
    result: dict[str, Any] = {"run_id": run_id, "status": state.status}
    value = state.result
    if state.status == "succeeded":
        plan = isinstance(value, dict) and "steps" in value
        result["outputs"] = value.get("outputs") if plan else value
        if plan:
            result["steps"] = {k: v["status"] for k, v in value["steps"].items()}
        return result
    result["error"] = f"{type(state.error).__name__}: {state.error}" if state.error else None
    steps = getattr(state.error, "fields", {}).get("steps")
    if steps:
        result["steps"] = {
            k: {"status": v["status"], "error": v["error"]} for k, v in steps.items()
        }
    return result


@plan_app.command("validate")
def validate(
    ctx: typer.Context,
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN")],
    enable_tool: Annotated[
        list[str] | None,
        typer.Option(
            "--enable-tool", metavar="TOOL", help="Count this tool as enabled too (repeatable)."
        ),
    ] = None,
    all_tools: Annotated[
        bool, typer.Option("--all-tools", help="Every tool enabled, as `tiffany run` has them.")
    ] = False,
    imports: ImportOption = None,
) -> None:
    """Check a plan as a server would at submission; print every problem with its path.

    The tools are those a server with these settings runs (TIFFANY_ENABLED_TOOLS,
    default: all but shell) plus --enable-tool; a disabled one is named with its fix.
    A python step's function must be registered by the modules the server
    imports (TIFFANY_TOOL_MODULES, --import MOD), and its kwargs must fit the
    function's parameters.
    """
    from tiffany.agents import PlanError, parse_plan
    from tiffany.agents.registry import ToolRegistry
    from tiffany.agents.tools.python import check_python_steps
    from tiffany.cli import _settings

    doc = _load(plan_path)
    settings = _settings(ctx)
    import_tool_modules(tool_modules(settings.tool_modules, imports))
    every = ToolRegistry.default().all_names()
    if all_tools:
        enabled = set(every)
    else:
        enabled = {*settings.enabled_tools, *(enable_tool or [])} & set(every)
    try:
        plan = parse_plan(doc, sorted(enabled), strict=True, disabled=sorted(set(every) - enabled))
        uncallable = check_python_steps(plan.steps)
        if uncallable:
            raise PlanError(uncallable)
    except PlanError as exc:
        _print_plan_errors(exc, ctx)
        raise typer.Exit(EXIT_INVALID) from None
    typer.echo(f"plan {plan.name!r} is valid: {len(plan.steps)} steps")


@plan_app.command("graph")
def graph(
    ctx: typer.Context,
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN")],
    mermaid: Annotated[
        bool, typer.Option("--mermaid", help="Mermaid flowchart instead of text.")
    ] = False,
) -> None:
    """Print the plan's DAG as text or as a Mermaid flowchart."""
    from tiffany.agents import PlanError, parse_plan

    doc = _load(plan_path)
    try:
        plan = parse_plan(doc, None)
    except PlanError as exc:
        _print_plan_errors(exc)
        raise typer.Exit(EXIT_INVALID) from None
    if mermaid:
        typer.echo("flowchart TD")
        for s in plan.steps:
            typer.echo(f'    {s.id}["{s.id}: {s.tool}"]')
        for s in plan.steps:
            for dep in s.after:
                typer.echo(f"    {dep} --> {s.id}")
        return
    level: dict[str, int] = {}

    def depth(step_id: str) -> int:
        if step_id not in level:
            level[step_id] = 0
            deps = plan.step(step_id).after
            level[step_id] = 1 + max((depth(d) for d in deps), default=-1)
        return level[step_id]

    for s in sorted(plan.steps, key=lambda s: (depth(s.id), s.id)):
        arrow = f"  <- {', '.join(s.after)}" if s.after else ""
        extra = []
        if s.retries:
            extra.append(f"retries={s.retries}")
        if s.timeout_s:
            extra.append(f"timeout={s.timeout_s:g}s")
        typer.echo(f"{'  ' * depth(s.id)}{s.id} [{s.tool}]{arrow} {' '.join(extra)}".rstrip())


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``plan`` to the root app."""
    app.command("run")(run)
    app.add_typer(plan_app, name="plan")
