"""The processes ``tiffany serve`` starts, each run alone: ``engine``, ``api``, ``projector``.

Hidden commands: ``serve`` (``serve.py``) starts ``tiffany engine`` and
``tiffany api`` as its children, and each engine starts ``tiffany
projector``. A child started by serve writes its ready file once it is up
(``--ready-file``: serve reads it to know) and follows serve's death
(``--supervisor``: ``tiffany/supervisor/lifeline.py``); run by hand, each
is the process alone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from tiffany.cli.imports import ImportOption, import_tool_modules, tool_modules
from tiffany.supervisor import lifeline

__all__ = ["SupervisorOption", "api_cmd", "engine_cmd", "projector_cmd"]


#: ``--supervisor PID``: the ``serve`` process whose death this child follows (lifeline.py).
SupervisorOption = Annotated[
    int | None,
    typer.Option(help="Stop when this process (tiffany serve, the parent) dies.", hidden=True),
]


def engine_cmd(
    ctx: typer.Context,
    ready_file: Annotated[
        Path | None,
        typer.Option(
            help="Write {pid, control, feed} here once up (the sockets, the projector's report)."
        ),
    ] = None,
    enable_tool: Annotated[
        list[str] | None, typer.Option("--enable-tool", metavar="TOOL", help="Also run this tool.")
    ] = None,
    imports: ImportOption = None,
    supervisor: SupervisorOption = None,
) -> None:
    """Run the engine process alone (what ``serve`` starts): loop, WAL, PAL, projector."""
    from tiffany.cli import _settings
    from tiffany.engine.service import EXIT_WAL_DAMAGED, EngineService
    from tiffany.errors import WalCorruptionError, WalError

    if supervisor is not None:
        lifeline.hold(supervisor)  # SIGTERM (a clean stop) when serve dies
    settings = _settings(ctx)
    import_tool_modules(tool_modules(settings.tool_modules, imports))
    tools = list(dict.fromkeys([*settings.enabled_tools, *(enable_tool or [])]))
    # Until the service installs its own handlers: a stop while the engine
    # opens its journal (a standby waiting for the lease) is a clean exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        service = EngineService(settings, enabled_tools=tools)
    except WalCorruptionError as exc:
        typer.echo(f"tiffany engine: {exc.message}", err=True)
        raise typer.Exit(EXIT_WAL_DAMAGED) from None
    except WalError as exc:  # held by another engine (a WAL lock, a stream lease), or failed
        typer.echo(f"tiffany engine: {exc.message}", err=True)
        raise typer.Exit(1) from None

    def ready() -> None:
        if ready_file is not None:
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "control": str(service.control.path),
                        "feed": str(service.feed.path),
                    }
                )
            )
            tmp.replace(ready_file)

    raise typer.Exit(service.serve(ready=ready))


def projector_cmd(ctx: typer.Context) -> None:
    """Run the projector process (what the engine starts): tails the WAL into the SQL store."""
    from tiffany.cli import _settings
    from tiffany.engine import journal_source
    from tiffany.projector.process import run_projector

    settings = _settings(ctx)
    raise typer.Exit(
        run_projector(
            settings.database_url,
            journal_source(settings),
            shard=settings.engine,
            nice=settings.projector_nice,
        )
    )


def api_cmd(
    ctx: typer.Context,
    ready_file: Annotated[
        Path | None, typer.Option(help="Write {url, pid} here once listening.")
    ] = None,
    after: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="FILE",
            help="Listen once this file exists (repeatable: engines' ready files).",
        ),
    ] = None,
    fd: Annotated[
        list[int] | None,
        typer.Option(
            metavar="FD",
            help="Listen on this inherited bound socket, not on --host/--port (repeatable).",
        ),
    ] = None,
    supervisor: SupervisorOption = None,
) -> None:
    """Run the API side-process alone (what ``serve`` starts)."""
    from tiffany.api import run_api
    from tiffany.cli import _settings

    if supervisor is not None:
        lifeline.hold(supervisor)  # SIGTERM (its port closed first) when serve dies
    raise typer.Exit(
        run_api(_settings(ctx), ready_file=ready_file, after=after or (), fds=fd or ())
    )
