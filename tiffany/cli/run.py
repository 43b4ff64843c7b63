"""``tiffany run PLAN`` and ``tiffany plan validate|graph``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tiffany.cli import DataDirOption, exits, hints
from tiffany.cli.failures import print_failures
from tiffany.cli.imports import ImportOption, import_tool_modules, tool_modules
from tiffany.cli.interrupt import CtrlC

if TYPE_CHECKING:
    from tiffany.config import Settings

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

    from tiffany.wire.documents import SIGNAL_NAME_PATTERN, DocumentError, load
    from tiffany.wire.records import reserved_signal, reserved_signal_message

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


def _signal_hint(console: Any, again: str, data_dir: str, *, quiet: bool) -> Any:
    """An instrument that says once per signal name, on stderr, how to send it.

    (The live view shows the wait in its task tree; without it, a run
    waiting a day for an approval would look hung.) ``again`` is what
    ``serve`` must be given to resume the run, ``data_dir`` what ``signal``
    must be given to find it (:func:`tiffany.cli.hints.again`).
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
                f"its data dir; `tiffany serve{again}` resumes it and `tiffany signal {run_id} "
                f"{call.channel} --data JSON{data_dir}` (or the dashboard) sends it; or run "
                "again with --signal",
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
    plan_path: Annotated[
        Path,
        typer.Argument(
            metavar="PLAN|MOD:FN", help="A plan file (JSON or YAML), or a @workflow function."
        ),
    ],
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
    """Run a plan, or a workflow, in this process, every tool enabled, with a live view.

    Prints the run's outputs. ``MOD:FN`` names a ``@workflow`` generator
    function: its module is imported (the working directory is importable)
    and ``--input`` gives its keyword arguments.

    A ``signal.wait`` step takes the ``--signal`` of its name (sent at the
    run's start and kept until it waits). A run left waiting for a signal
    nobody sent stays unfinished in the data dir: ``tiffany serve`` resumes
    it and ``tiffany signal RUN NAME --data JSON`` (or the dashboard) sends it.

    On a data dir that ``tiffany serve`` serves, the run goes into a data
    dir of its own inside it, ``<data dir>/local``, and says so: it still
    runs here, with every tool. ``tiffany submit PLAN`` runs a plan on the
    server instead, with the server's tools.
    """
    from rich.console import Console
    from rich.live import Live

    from tiffany.agents import PlanError
    from tiffany.cli import _build_engine, _settings
    from tiffany.cli.live import LiveView

    settings = _settings(ctx)
    target = _workflow_target(plan_path)
    if target is not None:  # mod:fn, a @workflow: its module is imported like --import's
        imports = [*(imports or ()), target[0]]
    doc = _load(plan_path) if target is None else {}
    given = _parse_inputs(inputs, ctx)
    sent = _parse_signals(signals)
    import_tool_modules(tool_modules(settings.tool_modules, imports))
    workflow: tuple[dict[str, Any], str] | None = None
    if target is not None:
        workflow = _workflow_entry(target, given, ctx)
    from tiffany.agents import parse_plan
    from tiffany.agents.plan import check_inputs
    from tiffany.agents.registry import ToolRegistry
    from tiffany.agents.tools.python import check_python_steps

    if workflow is None:
        try:  # validate before the engine opens the data dir, as a server checks a submission
            plan = parse_plan(doc, ToolRegistry.default().all_names(), strict=True)
            unknown = check_inputs(plan, given)
            if unknown:
                raise PlanError(unknown)
        except PlanError as exc:
            _print_plan_errors(exc, ctx)
            raise typer.Exit(EXIT_INVALID) from None
        _check_signals(doc, {**plan.inputs, **given}, sent)
        uncallable = check_python_steps(plan.steps)  # here: the functions this process imported
        if uncallable:
            _print_plan_errors(PlanError(uncallable), ctx)
            raise typer.Exit(EXIT_INVALID)
    from tiffany.wal.lock import holder

    user = holder(Path(settings.data_dir) / "wal")
    if user is not None:  # `tiffany serve` (or another run) holds it: a data dir of our own
        settings = _beside(settings, user)
    console = Console(stderr=True)
    view = LiveView(total_steps=len(doc.get("steps") or ()))
    use_live = live and console.is_terminal and not as_json
    # The modules its python steps need and the data dir go with every command we print.
    again = hints.again(settings.data_dir, imports=tool_modules((), imports))
    data_dir_flag = hints.again(settings.data_dir)
    engine = _build_engine(
        settings,
        enabled_tools=ToolRegistry.default().all_names(),
        instruments=[view, _signal_hint(console, again, data_dir_flag, quiet=use_live)],
        emit=view.on_event,
    )
    with CtrlC(engine.runtime.sched) as ctrl_c:  # until the run's state is read and the WAL closed
        try:
            try:
                if workflow is not None:
                    run_id = engine.start_entry(workflow[0], name=workflow[1])
                else:
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
        typer.echo(
            f"tiffany: interrupted; run {run_id} stays in its data dir: `tiffany replay "
            f"{run_id}{again}` resumes it (or `tiffany serve{again}`, which resumes every "
            "unfinished run)",
            err=True,
        )
        raise typer.Exit(exits.INTERRUPTED)
    if state.status == "running" and waits:
        names = ", ".join(waits)
        typer.echo(
            f"tiffany: run {run_id} waits for signal {names}: pass --signal NAME=JSON, or serve "
            f"its data dir (`tiffany serve{again}`: it resumes the run) and send it with "
            f"`tiffany signal {run_id} NAME --data JSON{data_dir_flag}` or the dashboard",
            err=True,
        )
    code = report(
        settings, run_id, state, view.summary(), use_live, as_json, workflow=workflow is not None
    )
    raise typer.Exit(code)


#: Where ``tiffany run`` keeps its runs while another process holds the data dir.
LOCAL_DATA_DIR = "local"


def local_settings(settings: Settings) -> Settings:
    """The settings of ``DATA_DIR/local``: its own WAL and SQLite store (``tiffany run``)."""
    from tiffany.config import SQLITE_FILE_NAME

    local = Path(settings.data_dir) / LOCAL_DATA_DIR
    url = f"sqlite:///{local / SQLITE_FILE_NAME}"
    return settings.model_copy(update={"data_dir": local, "database_url": url})


def _workflow_target(path: Path) -> tuple[str, str] | None:
    """``(module, function)`` of a ``mod:fn`` argument (not a file), or None for a plan file."""
    text = str(path)
    module, sep, function = text.partition(":")
    if not sep or path.exists() or not module or not function.isidentifier():
        return None
    if not all(part.isidentifier() for part in module.split(".")):
        return None
    return module, function


def _workflow_entry(
    target: tuple[str, str], given: dict[str, Any], ctx: typer.Context
) -> tuple[dict[str, Any], str]:
    """The run entry of ``mod:fn`` (imported already), a ``@workflow``; exit 2 if it is none."""
    import sys

    from tiffany.cli.remote import print_problem
    from tiffany.workflows import WorkflowInputError, names, prepare_workflow
    from tiffany.workflows import lookup as lookup_workflow

    module, function = target
    fn = getattr(sys.modules[module], function, None)
    name = next((n for n in names() if lookup_workflow(n).fn is fn), None)
    if fn is None or name is None:
        what = "has no function" if fn is None else "has no @workflow function"
        typer.echo(
            f"tiffany: module {module} {what} {function!r}: `tiffany run MOD:FN` runs a "
            '@workflow("name") generator function (registered: '
            f"{', '.join(names()) or 'none'})",
            err=True,
        )
        raise typer.Exit(EXIT_INVALID)
    try:
        return prepare_workflow(name, given)
    except WorkflowInputError as exc:
        print_problem(exc.message, [(e["loc"], e["msg"]) for e in exc.errors], ctx)
        raise typer.Exit(EXIT_INVALID) from None


def _beside(settings: Any, pid: int) -> Any:
    """The settings of a run whose data dir another process holds: ``<data dir>/local``.

    ``tiffany run`` runs a plan in its own engine with every tool enabled,
    wherever it is typed; the data dir only says where the run is kept.
    When a server (or another ``run``) holds the data dir's WAL, the run is
    kept in a data dir of its own inside it, with its own WAL and SQLite
    store, and one line on stderr says so and names it, as every hint
    printed later does (``--data-dir``).

    A store the settings name (``TIFFANY_DATABASE_URL``) is the server's
    too: a second journal projected into it would collide with the
    server's. That is refused (exit 2), naming what to set.

    Discussion: rejected, submitting the plan to the server (what ``run``
    did, silently): the run then had the server's tools, not every tool as
    ``run`` promises (``shell`` is off on a server by default, exit 2), nor
    this shell's environment (``TIFFANY_HTTP_ALLOW`` for a plan that fetches
    from loopback, exit 1); ``tiffany submit`` does that, on purpose.
    Rejected too, refusing: the documented ``tiffany run PLAN`` would fail
    beside ``make run``.
    """
    from tiffany.config import SQLITE_FILE_NAME

    data_dir = Path(settings.data_dir)
    served = hints.shown_path(data_dir)
    if settings.database_url != f"sqlite:///{data_dir / SQLITE_FILE_NAME}":
        typer.echo(
            f"tiffany: {served} is in use by pid {pid} (`tiffany serve`, or another `tiffany "
            "run`), and its store (TIFFANY_DATABASE_URL) with it: `tiffany run` runs a plan in "
            "an engine of its own, which needs a data dir and a store of its own (--data-dir "
            "DIR, and TIFFANY_DATABASE_URL unset or another); or run the plan on the server, "
            "with its tools: `tiffany submit PLAN`",
            err=True,
        )
        raise typer.Exit(EXIT_INVALID)
    local = data_dir / LOCAL_DATA_DIR
    typer.echo(
        f"tiffany: {served} is in use by pid {pid} (`tiffany serve`, or another `tiffany run`): "
        f"this run runs here, every tool enabled, kept in the data dir {hints.shown_path(local)} "
        "(--data-dir DIR keeps it elsewhere; `tiffany submit PLAN` runs a plan on the server "
        "instead, with the server's tools)",
        err=True,
    )
    return local_settings(settings)


def report(
    settings: Any,
    run_id: str,
    state: Any,
    summary: Any,
    use_live: bool,
    as_json: bool,
    *,
    workflow: bool = False,
) -> int:
    """Project the run into the store, print its result; return the exit code.

    ``run`` and ``replay`` both end here, so both print one shape: the
    task summary (unless the live view showed it), then ``{"run_id",
    "status", "outputs", "steps"}`` (or ``"error"``).
    """
    from rich.console import Console

    from tiffany.engine import journal_source
    from tiffany.projector.apply import StoreJournalMismatch
    from tiffany.projector.tail import project_wal

    stale = None
    try:
        project_wal(settings.database_url, journal_source(settings))  # into the store
    except StoreJournalMismatch as exc:  # the run is journaled; only the store is behind
        stale = exc
        typer.echo(f"tiffany: the store was not updated: {exc}", err=True)
    from tiffany.store.records import jsonable

    result = jsonable(
        run_result(run_id, state, workflow=workflow)
    )  # tuple keys, NaN, big ints: as the store shows them
    if as_json:
        typer.echo(json.dumps(result, default=repr))
    else:
        if not use_live:
            Console(stderr=True).print(summary)
        print_failures(result.get("steps"))  # a python step's traceback, as Python prints it
        typer.echo(json.dumps(result, indent=2, default=repr))
    return exits.OK if state.status == "succeeded" and stale is None else exits.FAILED


def run_result(run_id: str, state: Any, *, workflow: bool = False) -> dict[str, Any]:
    """A finished (or stopped) run as ``run`` and ``replay`` print it.

    ``workflow``: a workflow run, whose result is ``{"outputs": ...}``.
    """
    result: dict[str, Any] = {"run_id": run_id, "status": state.status}
    value = state.result
    if state.status == "succeeded":
        plan = isinstance(value, dict) and "steps" in value
        shaped = plan or (workflow and isinstance(value, dict))
        result["outputs"] = value.get("outputs") if shaped else value
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
