"""CLI commands of the durable layer: ``replay`` and ``runs`` (``wal ...``: ``cli/wal.py``).

``tiffany replay RUN_ID`` resumes a crashed run (replay to the end of its
journal, then live); ``--verify`` replays a finished run without side
effects and exits 0 only when it replays identically (an archived run too:
the WAL read is the archive, then the live segments). ``tiffany wal dump``
prints records (``--json`` for one JSON object per line), ``wal verify``
checks every segment, archived ones included, without changing anything and
says in one line whether the log is ok or where it is damaged, ``wal repair
--salvage`` keeps every
record that checks out (``tiffany/wal/salvage.py``), fails the runs that lost
records with the reason (a RUN_END ``failed`` each) and rebuilds the store
(sequence numbers shift); ``wal repair --yes`` truncates at the first damage.
Both discard the checkpoints (their sequence numbers no longer hold).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from tiffany.cli import DataDirOption, exits, hints
from tiffany.cli.imports import ImportOption, import_tool_modules, tool_modules
from tiffany.cli.interrupt import CtrlC
from tiffany.cli.remote import TokenOption, UrlOption, printable, remote
from tiffany.wire.entries import EntryKind, WorkflowEntry, entry_kind, read_entry

if TYPE_CHECKING:
    from tiffany.durable import VerifyReport
    from tiffany.durable.history import RunInfo
    from tiffany.ports.journals import Journals

__all__ = ["print_report", "register"]


EXIT_DIVERGED = exits.FAILED
EXIT_NOT_FOUND = exits.NOT_FOUND


def _journals(ctx: typer.Context) -> Journals:
    """The engines' journals as the settings place them (:mod:`tiffany.ports.journals`)."""
    from tiffany.cli import _settings
    from tiffany.ports.journals import journals_for

    return journals_for(_settings(ctx))


def _wal_dir(ctx: typer.Context, engine: int = 0) -> Path:
    """An engine's WAL directory (refused with the reason on a journal that is not files)."""
    from tiffany.errors import JournalUnsupported

    try:
        return _journals(ctx).wal_dir(engine)
    except JournalUnsupported as exc:
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(exits.USAGE) from None


def _source(ctx: typer.Context, engine: int = 0) -> Any:
    """Where an engine's journal is read: its WAL directory, or its PostgreSQL stream."""
    return _journals(ctx).source(engine)


def _unknown_run(ctx: typer.Context, engine: int, exc: Exception) -> NoReturn:
    """Say that a run is not in the journal (and why it may not be), and exit 3."""
    from tiffany.durable.retention import released_note
    from tiffany.wire.shards import seq_base

    note = released_note(_source(ctx, engine), seq_base(engine) + 1)
    typer.echo(f"tiffany: {exc}{note}", err=True)
    raise typer.Exit(EXIT_NOT_FOUND)


def use_local_run(ctx: typer.Context, run_id: str) -> bool:
    """Switch this invocation to DATA_DIR/local when the run is there; True if it was.

    ``tiffany run`` beside a server (which holds the data dir) keeps its run
    in ``DATA_DIR/local`` and says so. A command given that run's id reads
    the data dir's journal first, then this one, so the README's ``tiffany
    replay RUN_ID --verify`` after ``tiffany run`` works while ``make run``
    serves. Says on stderr where the run was found.
    """
    from tiffany.cli import _Options, _settings
    from tiffany.cli.run import LOCAL_DATA_DIR, local_settings
    from tiffany.durable import scan
    from tiffany.ports.journals import journals_for

    settings = _settings(ctx)
    data_dir = Path(settings.data_dir)
    local = data_dir / LOCAL_DATA_DIR
    if data_dir.name == LOCAL_DATA_DIR or not local.is_dir():
        return False
    there = local_settings(settings)
    try:
        if run_id not in scan(journals_for(there).source(0)).runs:
            return False
    except Exception:  # noqa: BLE001 - no readable journal there: the run is unknown
        return False
    options = ctx.find_object(_Options)
    if options is None:
        return False
    options.data_dir, options.settings = local, there
    if ctx.params.get("data_dir") is not None:
        ctx.params["data_dir"] = local
    typer.echo(
        f"tiffany: run {run_id} is in {hints.shown_path(local)}, where `tiffany run` keeps "
        f"a run while a server holds {hints.shown_path(data_dir)}: reading it there",
        err=True,
    )
    return True


def _engines(ctx: typer.Context) -> int:
    """How many engines' journals there are (``serve --engines N``)."""
    return _journals(ctx).count()


def _engine_of_run(ctx: typer.Context, run_id: str) -> int:
    """The engine whose journal holds ``run_id`` (0 when none does: it reports the run unknown)."""
    from tiffany.durable import scan

    n = _engines(ctx)
    for engine in range(n if n > 1 else 0):
        if run_id in scan(_source(ctx, engine)).runs:
            return engine
    return 0


def _existing_wal_dir(ctx: typer.Context, engine: int = 0) -> Path:
    """The WAL directory, or a clear error (exit 2 or 3) when there is none."""
    wal_dir = _wal_dir(ctx, engine)
    if not wal_dir.is_dir():
        typer.echo(f"tiffany: no WAL at {wal_dir} (check --data-dir)", err=True)
        raise typer.Exit(exits.NOT_FOUND)
    return wal_dir


def _json(obj: Any, indent: int | None = None) -> str:
    """JSON text of journal values (tuple keys, NaN, big ints: as the store shows them)."""
    from tiffany.store.records import jsonable

    return json.dumps(jsonable(obj), indent=indent, default=repr)


def _emit(obj: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(_json(obj))
    else:
        typer.echo(obj if isinstance(obj, str) else _json(obj, indent=2))


def _add_paths(paths: list[Path] | None) -> None:
    for p in paths or ():
        sys.path.insert(0, str(p.resolve()))


def print_report(report: VerifyReport, as_json: bool, source: str = "") -> None:
    """Print a verify report: one line when identical, else where it first diverged.

    ``source``: what the run was read from, when not the data dir (an export file).
    """
    run_id = report.run_id
    if as_json:
        _emit(report.to_dict(), True)
    elif report.ok:
        upto = " up to the end of its journal (the run had not finished)" if report.partial else ""
        typer.echo(
            f"run {run_id}{source} replays identically{upto}: {report.dispatches} dispatches, "
            f"{report.records} records, status {report.status}"
        )
    else:
        typer.echo(f"run {run_id}{source} does NOT replay identically", err=True)
        if report.divergence:
            d = report.divergence
            seq = d.get("seq")
            where = f"WAL seq {seq}" if seq is not None else "no WAL record there"
            typer.echo(
                f"  at dispatch #{d.get('dispatch')} ({where}), "
                f"task {d.get('task')} ({d.get('task_name')})",
                err=True,
            )
            if d.get("source"):
                typer.echo(f"  at {d.get('source')}", err=True)
            if d.get("hint"):
                typer.echo(f"  hint: {d.get('hint')}", err=True)
            typer.echo(f"  expected (journal): {d.get('expected')}", err=True)
            typer.echo(f"  actual   (code):    {d.get('actual')}", err=True)
            for frame in d.get("stack") or ():
                typer.echo(f"    {frame}", err=True)
        for problem in report.problems:
            typer.echo(f"  {problem}", err=True)


def replay(
    ctx: typer.Context,
    run_id: Annotated[
        str,
        typer.Argument(
            metavar="RUN_OR_FILE",
            help="The run to replay, or a file `tiffany export` wrote (an existing file "
            "is read as an export; anything else is a run id).",
        ),
    ],
    verify_only: Annotated[
        bool, typer.Option("--verify", help="Check that a finished run replays identically.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    live: Annotated[
        bool, typer.Option("--live/--no-live", help="The live task view (on a terminal).")
    ] = True,
    path: Annotated[
        list[Path] | None,
        typer.Option(
            "--path",
            metavar="DIR",
            help="Add a directory to sys.path (where the run's code lives; repeatable).",
        ),
    ] = None,
    imports: ImportOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Resume a crashed run from the WAL, or verify that a finished one replays identically.

    A run whose steps call your ``@python_tool`` functions needs their
    module (``--import MOD``, as ``tiffany run`` had it) to go on.

    ``tiffany replay FILE --verify --import MOD`` replays a run exported with
    ``tiffany export`` against the code as it is now (docs/replay.md): a
    run exported before its end is checked up to where its journal ends.
    Exit codes of ``--verify``: 0 it replays identically, 1 it diverges (the
    first divergence is printed), 2 bad input (no ``--verify`` with a FILE,
    a module that does not import, a FILE in a newer format or not an
    export), 3 no such run, 4 the FILE is damaged or truncated (the byte
    offset is printed).
    """
    from tiffany.agents.registry import ToolRegistry
    from tiffany.cli import _build_engine, _settings
    from tiffany.durable import UnknownRun, verify
    from tiffany.engine import replay_resolvers

    _add_paths(path)
    import_tool_modules(tool_modules(_settings(ctx).tool_modules, imports))
    if Path(run_id).is_file():
        from tiffany.cli.export import replay_file

        replay_file(ctx, Path(run_id), verify_only=verify_only, as_json=as_json)
    engine_no = _engine_of_run(ctx, run_id)  # serve --engines N: the journal holding it
    settings = _settings(ctx).for_engine(engine_no)
    data_dir = Path(settings.data_dir)
    try:
        if verify_only:
            report = verify(
                data_dir,
                run_id,
                resolvers=replay_resolvers(settings),
                log=_source(ctx, engine_no),
            )
            print_report(report, as_json)
            raise typer.Exit(0 if report.ok else EXIT_DIVERGED)
        from rich.console import Console
        from rich.live import Live

        from tiffany.cli.live import LiveView
        from tiffany.cli.run import _signals_awaited
        from tiffany.cli.run import report as print_result

        view = LiveView(total_steps=0)
        use_live = live and Console(stderr=True).is_terminal and not as_json
        engine = _build_engine(
            settings,
            enabled_tools=ToolRegistry.default().all_names(),
            instruments=[view],
            emit=view.on_event,
        )
        # Ctrl-C: until the run's state is read and the WAL closed (cli/interrupt.py).
        with CtrlC(engine.runtime.sched) as ctrl_c, engine.runtime as rt:
            resumed = engine.recover_runs(only=[run_id])
            if not resumed:
                typer.echo(f"run {run_id} has already finished; nothing to resume", err=True)
                raise typer.Exit(0)
            entry = read_entry(rt.index.get(run_id).entry) if rt.index else None
            plan = entry.plan_doc if entry is not None else None
            steps = plan.get("steps") if plan is not None else None
            view.total_steps = len(steps) if isinstance(steps, list) else 0
            with ctrl_c.loop():
                if use_live:
                    live_view = Live(
                        get_renderable=view.render,
                        console=Console(stderr=True),
                        refresh_per_second=8,
                        transient=False,
                    )
                    with live_view:
                        rt.run()
                else:
                    rt.run()
            state = rt.status(run_id)
            waits = _signals_awaited(rt.journal.runs.get(run_id))
            held = [h.reason for h in rt.journal.held.values() if h.run_id == run_id]
            workflow = isinstance(entry, WorkflowEntry)
        # The data dir, modules and paths this replay was given go with the commands it prints.
        root = _settings(ctx)
        again = hints.again(root.data_dir, imports=tool_modules((), imports))
        if ctrl_c.pressed and state.status == "running":
            dirs = "".join(f" --path {shlex.quote(str(p))}" for p in path or ())
            typer.echo(
                f"tiffany: interrupted; run {run_id} stays in its data dir: "
                f"`tiffany replay {run_id}{again}{dirs}` resumes it again",
                err=True,
            )
            raise typer.Exit(exits.INTERRUPTED)
        if state.status == "running" and waits:
            typer.echo(
                f"tiffany: run {run_id} waits for signal {', '.join(waits)}: serve its data dir "
                f"(`tiffany serve{again}`) and send it with "
                f"`tiffany signal {run_id} NAME --data JSON{hints.again(root.data_dir)}`",
                err=True,
            )
        if state.status == "running" and held:
            for reason in dict.fromkeys(held):
                typer.echo(f"tiffany: run {run_id} cannot go on here: {reason}", err=True)
        code = print_result(
            settings, run_id, state, view.summary(), use_live, as_json, workflow=workflow
        )
        raise typer.Exit(code)
    except UnknownRun as exc:
        if use_local_run(ctx, run_id):
            replay(ctx, run_id, verify_only, as_json, live, path, imports, None)
        _unknown_run(ctx, engine_no, exc)


def runs(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Show the newest N runs (0: all) [default: 50; with --json: all].",
            show_default=False,
        ),
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            help="Only runs with this status (waiting: the runs that need someone).",
            show_default=False,
        ),
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """List the runs in the WAL (or --url's server), newest first, with their age.

    A run is ``waiting`` when every live step waits for a signal or an
    operator (a step held for its tool or function): what it waits for is
    listed after the runs. A run the WAL shows unfinished while no engine
    holds the data dir was interrupted (a crash, Ctrl-C): `tiffany replay
    RUN` or `tiffany serve` resumes it.
    """
    from tiffany.wire.status import RunStatus

    if status is not None and status not in set(RunStatus):
        known = ", ".join(s.value for s in RunStatus)
        typer.echo(f"tiffany: --status: {status!r} is not a run status ({known})", err=True)
        raise typer.Exit(exits.USAGE)
    from tiffany.cli import _settings

    if url:  # a URL or token from the environment is there for the next command too
        typed = _typed(ctx, "url")
        token_typed = _typed(ctx, "token")
        again = hints.again(url=url if typed else None, token_given=bool(token) and token_typed)
        _remote_runs(url, token, limit, as_json, status, again)
        return
    again = hints.again(_settings(ctx).data_dir)
    listed = _local_runs(ctx)
    if status is not None:
        listed = [r for r in listed if r.status == status]
    if limit is None:
        limit = 0 if as_json else 50
    shown = listed[:limit] if limit else listed
    now = time.time()  # noqa: TID251 - ages, for people
    for run in shown:
        info = run.info
        if as_json:
            held = next((w["reason"] for w in run.waiting_for if "reason" in w), None)
            row = {
                "run_id": info.run_id,
                "name": info.name,
                "kind": info.kind,
                "status": run.status,
                "interrupted": run.interrupted,
                "held": held,
                "waiting_for": run.waiting_for,
                "started_at": info.started_at,
                "ended_at": info.ended_at,
                "first_seq": info.first_seq,
            }
            _emit(row, True)
            continue
        shown_as = "interrupted" if run.interrupted else run.status
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(info.started_at))
        age = _age(now - info.started_at)
        kind = printable(info.kind or "-")
        typer.echo(
            f"{info.run_id}  {shown_as:<11} {age:>8}  {started}  {kind:<8} {printable(info.name)}"
        )
    if as_json:
        return
    if len(shown) < len(listed):
        typer.echo(f"({len(listed) - len(shown)} older runs: --limit 0 lists them all)", err=True)
    if any(r.interrupted for r in shown):
        typer.echo(
            f"interrupted: `tiffany replay RUN{again}` resumes one, `tiffany serve{again}` "
            "resumes them all",
            err=True,
        )
    for run in shown:
        if not run.interrupted:
            _say_waits(run.info.run_id, run.waiting_for, again)


@dataclass(frozen=True, slots=True)
class _Listed:
    """A run as ``tiffany runs`` lists it from the WAL."""

    info: RunInfo
    #: ``waiting`` (every live step waits for a person), else the WAL's status.
    status: str
    #: Unfinished while no engine holds its data dir.
    interrupted: bool
    #: What its waiting tasks wait for (``tiffany/store/waits.py``).
    waiting_for: list[dict[str, Any]]


def _local_runs(ctx: typer.Context) -> list[_Listed]:
    """The data dir's runs, newest first, each unfinished one folded for its waits.

    One pass over each engine's journal: the runs' starts and ends, and the
    records of the unfinished ones, which go through the store's own rule
    (:func:`~tiffany.store.waits.waits_of`), so the list says ``waiting``
    exactly when the store does.
    """
    from tiffany.durable.history import read_runs
    from tiffany.store.waits import waits_of
    from tiffany.wire.records import decode, root_role

    journals = _journals(ctx)
    out: list[_Listed] = []
    for e in range(journals.count()):
        # The engine is known to be stopped (nobody holds its WAL): nothing runs its runs.
        idle = journals.stopped(e)
        loaded = read_runs(journals.source(e), unfinished_only=True)
        index = loaded.index
        for info in index.runs.values():
            spans = loaded.spans.get(info.run_no.to_bytes(4, "little"))
            if info.finished or spans is None:
                out.append(_Listed(info, info.status, False, []))
                continue
            plan = entry_kind(info.entry) is EntryKind.PLAN
            records = (decode(rtype, data[start:end]) for _, rtype, data, start, end, _ in spans)
            waits = waits_of(plan, root_role(info.entry), records)
            status = "waiting" if waits.waiting() else "running"
            out.append(_Listed(info, status, idle, waits.waiting_for()))
    out.sort(key=lambda r: (r.info.started_at, r.info.first_seq), reverse=True)
    return out


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was given on the command line (not by the environment)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _say_waits(run_id: str, waiting_for: list[dict[str, Any]] | list[Any], again: str) -> None:
    """What a run's tasks wait for, one line each on stderr (``runs``, local and ``--url``).

    ``again``: the options the printed ``tiffany signal`` needs (:func:`hints.again`).
    """
    for w in waiting_for:
        entry = w if isinstance(w, dict) else w.model_dump()
        step = f" (step {printable(entry['step'])})" if entry.get("step") else ""
        if entry.get("kind") == "signal":
            typer.echo(
                f"waiting: {run_id} waits for signal {printable(entry['name'])}{step}: "
                f"`tiffany signal {run_id} {printable(entry['name'])} --data JSON{again}` "
                "sends it",
                err=True,
            )
        else:
            typer.echo(f"held: {run_id} waits: {printable(entry.get('reason'))}", err=True)


def _remote_runs(
    url: str,
    token: str | None,
    limit: int | None,
    as_json: bool,
    status: str | None = None,
    again: str = "",
) -> None:
    """``runs --url``: the server's runs list, newest first, in the same lines."""
    if limit is None:
        limit = 0 if as_json else 50
    now = time.time()  # noqa: TID251 - ages, for people
    shown, before, total = 0, None, None
    waits: list[tuple[str, list[Any]]] = []
    with remote(url, token) as client:
        while True:
            page = client.list(
                status=status,  # checked against RunStatus
                limit=min(limit - shown, 200) if limit else 200,
                before=before,
            )
            if total is None:
                total = page.counts.get(status, 0) if status else sum(page.counts.values())
            for run in page:
                shown += 1
                if as_json:
                    _emit(run.model_dump(), True)
                    continue
                started = run.started_at or run.created_at or now
                when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started))
                age, name = _age(now - started), printable(run.name)
                kind = printable(run.kind or "-")
                typer.echo(f"{run.run_id}  {run.status:<11} {age:>8}  {when}  {kind:<8} {name}")
                if run.waiting_for and not run.finished:
                    waits.append((run.run_id, run.waiting_for))
            before = page.next_before
            if before is None or (limit and shown >= limit):
                break
    if not as_json and total is not None and shown < total:
        typer.echo(f"({total - shown} older runs: --limit 0 lists them all)", err=True)
    for run_id, waiting_for in waits:
        _say_waits(run_id, waiting_for, again)


#: Where a record holds its wall-clock time (a ``now`` OUTCOME: its value).
_TIME_FIELD = {"RUN_START": 3, "RUN_END": 2}


def _record_time(rtype: str, fields: list[Any]) -> str | None:
    """The record's time as local time (``2026-11-24 15:17:45.235 UTC``), for a person."""
    index = _TIME_FIELD.get(rtype)
    if rtype == "OUTCOME" and len(fields) > 3 and fields[2] == "now":
        index = 3
    value = fields[index] if index is not None and len(fields) > index else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e11:
        return None
    return local_time(value)


def local_time(ts: float) -> str:
    """``2026-11-24 15:17:45.235 UTC``: epoch seconds as local time with the zone."""
    base = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    return f"{base}.{int(ts * 1000) % 1000:03d} {time.strftime('%Z', time.localtime(ts))}"


def _age(seconds: float) -> str:
    """``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def _as_dict(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    return repr(obj)


def register(app: typer.Typer) -> None:
    """Add the durable layer's commands to the root app (``wal ...``: :mod:`tiffany.cli.wal`)."""
    from tiffany.cli.wal import wal_app

    app.command("replay")(replay)
    app.command("runs")(runs)
    app.add_typer(wal_app, name="wal")
