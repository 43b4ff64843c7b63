"""CLI commands of the durable layer: ``replay``, ``runs`` and ``wal ...``.

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

from tiffany.cli import DataDirOption, EngineOption, exits, hints
from tiffany.cli.imports import ImportOption, import_tool_modules, tool_modules
from tiffany.cli.interrupt import CtrlC
from tiffany.cli.remote import TokenOption, UrlOption, printable, remote

if TYPE_CHECKING:
    from tiffany.durable import VerifyReport
    from tiffany.durable.history import RunInfo
    from tiffany.wal import Loss

__all__ = ["print_report", "register"]

wal_app = typer.Typer(help="Inspect, verify and repair the write-ahead log.", no_args_is_help=True)

EXIT_DIVERGED = exits.FAILED
EXIT_NOT_FOUND = exits.NOT_FOUND


def _wal_dir(ctx: typer.Context, engine: int = 0) -> Path:
    from tiffany.cli import _settings

    return Path(_settings(ctx).for_engine(engine).data_dir) / "wal"


def _source(ctx: typer.Context, engine: int = 0) -> Any:
    """Where an engine's journal is read: its WAL directory, or its PostgreSQL stream."""
    from tiffany.cli import _settings
    from tiffany.engine import journal_source

    return journal_source(_settings(ctx).for_engine(engine))


def _unknown_run(ctx: typer.Context, engine: int, exc: Exception) -> NoReturn:
    """Say that a run is not in the journal (and why it may not be), and exit 3."""
    from tiffany.durable.retention import released_note
    from tiffany.wire.shards import seq_base

    note = released_note(_source(ctx, engine), seq_base(engine) + 1)
    typer.echo(f"tiffany: {exc}{note}", err=True)
    raise typer.Exit(EXIT_NOT_FOUND)


def _engines(ctx: typer.Context) -> int:
    """How many engines' journals the data dir holds (``serve --engines N``)."""
    from tiffany.cli import _settings
    from tiffany.wire.shards import homes

    settings = _settings(ctx)
    if settings.journal == "postgres":
        from tiffany.wal.pg import streams

        names = {s["stream"] for s in streams(settings.database_url)}
        n = 1
        while f"{settings.journal_stream}-{n}" in names:
            n += 1
        return n
    return len(homes(settings.data_dir))


def _engine_of_run(ctx: typer.Context, run_id: str) -> int:
    """The engine whose journal holds ``run_id`` (0 when none does: it reports the run unknown)."""
    from tiffany.durable import scan

    n = _engines(ctx)
    for engine in range(n if n > 1 else 0):
        if run_id in scan(_source(ctx, engine)).runs:
            return engine
    return 0


def _on_postgres(ctx: typer.Context) -> bool:
    from tiffany.cli import _settings

    return _settings(ctx).journal == "postgres"


def _existing_wal_dir(ctx: typer.Context, engine: int = 0) -> Path:
    """The WAL directory, or a clear error (exit 2 or 3) when there is none."""
    if _on_postgres(ctx):
        typer.echo(
            "tiffany: the journal is in PostgreSQL (TIFFANY_JOURNAL=postgres); this command "
            "works on the file WAL (the database keeps its own integrity)",
            err=True,
        )
        raise typer.Exit(exits.USAGE)
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
            steps = (
                (rt.index.get(run_id).entry.get("plan") or {}).get("steps") if rt.index else None
            )
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
            workflow = rt.index is not None and rt.index.get(run_id).entry.get("kind") == "workflow"
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
        typer.echo(f"{info.run_id}  {shown_as:<11} {age:>8}  {started}  {printable(info.name)}")
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
    from tiffany.wal.lock import holder
    from tiffany.wire.records import decode, root_role

    on_pg = _on_postgres(ctx)
    out: list[_Listed] = []
    for e in range(_engines(ctx)):
        # Nobody holds this engine's WAL: nothing is running its runs.
        idle = not on_pg and holder(_wal_dir(ctx, e)) is None
        loaded = read_runs(_source(ctx, e), unfinished_only=True)
        index = loaded.index
        for info in index.runs.values():
            spans = loaded.spans.get(info.run_no.to_bytes(4, "little"))
            if info.finished or spans is None:
                out.append(_Listed(info, info.status, False, []))
                continue
            plan = isinstance(info.entry, dict) and info.entry.get("kind") == "plan"
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
                typer.echo(f"{run.run_id}  {run.status:<11} {age:>8}  {when}  {name}")
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

    if _on_postgres(ctx):
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
    from tiffany.cli import _settings
    from tiffany.errors import WalError
    from tiffany.wal.pg import streams

    settings = _settings(ctx)
    if settings.journal != "postgres":
        typer.echo(
            "tiffany: the journal is the file WAL (one engine, one data dir): "
            "`tiffany status` shows it; streams exist with TIFFANY_JOURNAL=postgres",
            err=True,
        )
        raise typer.Exit(1)
    try:
        found = streams(settings.database_url)
    except WalError as exc:
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
    import time

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
