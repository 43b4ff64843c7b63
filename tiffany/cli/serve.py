"""``tiffany serve``: the engine process and the API side-process, supervised.

``serve`` starts two children of its own interpreter, ``tiffany engine``
(the kernel loop, WAL, PAL hub, projector, control socket) and ``tiffany
api`` (FastAPI under uvicorn), waits until both answer, optionally submits
the demo plan, prints the dashboard's address and writes it to
``<data dir>/serve.json``. A child that dies is restarted (with backoff) on
its own: the API resumes the feed where it was, the engine recovers its runs
from the WAL, and ``serve.json`` is rewritten with the new pids.
SIGINT/SIGTERM stop the API first (no new requests), then the engine (the
WAL is flushed), and ``serve`` exits 0.

Each child gets only the secrets it uses (docs/security.md): the API the
API token (``TIFFANY_API_TOKEN``), the engine the LLM key
(``TIFFANY_LLM_API_KEY``); every other secret-looking variable
(:func:`tiffany.config.is_secret_name`) is left out of both. A shell step
that escapes its sandbox, or runs without one, finds no API token in the
engine's ``/proc/<pid>/environ``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Final, NoReturn

import typer

from tiffany.cli import DataDirOption, exits
from tiffany.cli.imports import ImportOption, import_tool_modules, tool_modules
from tiffany.config import scrub_secrets
from tiffany.shards import engine_for_key, engine_home, homes

__all__ = ["register"]

#: How long serve waits for a child to come up, in seconds.
START_TIMEOUT_S: Final = 60.0
#: How long a child gets to stop after SIGTERM before SIGKILL, in seconds.
STOP_TIMEOUT_S: Final = 20.0
#: The wait before restarting a child that died, in seconds; doubled at each
#: restart up to MAX_RESTART_DELAY_S, and back to this once a child stayed up STABLE_S.
RESTART_DELAY_S: Final = 0.5
MAX_RESTART_DELAY_S: Final = 30.0
STABLE_S: Final = 60.0


def demo_key(plan: Mapping[str, Any]) -> str:
    """The demo's idempotency key: ``serve --demo`` submits each demo plan once per data dir.

    Named after the plan's content, so a Tiffany whose demo changed runs the new one.
    """
    blob = json.dumps(plan, sort_keys=True, separators=(",", ":")).encode()
    return f"demo:{hashlib.sha256(blob).hexdigest()[:16]}"


#: Where ``serve --demo`` notes the demo run it submitted (``{"key", "run_id"}``).
DEMO_FILE: Final = "demo-run.json"


def submit_demo(
    data_dir: Path, call: Callable[..., dict[str, Any]], engines: int = 1
) -> tuple[str, bool]:
    """Submit the demo plan unless this data dir ran it: ``(run_id, submitted now)``.

    The idempotency key covers a second ``serve --demo`` within the engine's
    key window (a day); the note in the data dir covers the days after.
    With several ``engines`` the key goes where the API sends it
    (:func:`~tiffany.shards.engine_for_key`).
    """
    plan = demo_plan()
    key = demo_key(plan)
    note = data_dir / DEMO_FILE
    with contextlib.suppress(OSError, ValueError):
        seen = json.loads(note.read_text())
        if (
            isinstance(seen, dict)
            and seen.get("key") == key
            and isinstance(seen.get("run_id"), str)
        ):
            return seen["run_id"], False
    home = engine_home(data_dir, engine_for_key(key, engines))
    answer = call(home, "submit", plan=plan, inputs={}, key=key)
    run_id = str(answer["run_id"])
    tmp = note.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "run_id": run_id}))
    tmp.replace(note)
    return run_id, bool(answer.get("created", True))


def demo_plan() -> dict[str, Any]:
    """Return the packaged demo plan."""
    import yaml

    text = resources.files("tiffany.plans").joinpath("demo.yaml").read_text()
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


class _Child:
    """One supervised child process."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], ready_file: Path) -> None:
        self.name = name
        self.argv = [*argv, "--ready-file", str(ready_file)]
        self.ready_file = ready_file  # written by the child once it is up
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.started_at = 0.0
        self._delay = RESTART_DELAY_S

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.argv, env=self.env)

    def restart_delay(self) -> float:
        """The wait before restarting this child (a crash loop backs off, a stable child not)."""
        if time.monotonic() - self.started_at >= STABLE_S:
            self._delay = RESTART_DELAY_S
        delay, self._delay = self._delay, min(self._delay * 2, MAX_RESTART_DELAY_S)
        return delay

    def stop(self, *, signalled: bool = False) -> int | None:
        """SIGTERM the child (unless ``signalled`` already), wait, SIGKILL at the deadline."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        if not signalled:  # a second SIGTERM could land after its handler is gone
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            typer.echo(
                f"tiffany: {self.name} did not stop in {STOP_TIMEOUT_S:g}s; killing it", err=True
            )
            proc.kill()
            return proc.wait()


def _start(
    engines: list[_Child],
    api: _Child,
    *,
    standby: bool,
    stop: threading.Event,
    up: Callable[[str], None],
) -> str:
    """Start the engines and the API; call ``up(url)`` once the API answers; return its URL.

    On the PostgreSQL journal (``standby``) an engine may wait for its
    stream's lease as long as another engine holds it: the API comes up
    first, so that a standby is alive (``/healthz``) but not ready
    (``/readyz``: no engine), and the wait for the engines ends only when
    they are ready or ``stop`` is set.

    Otherwise the API starts with the engines but listens only once they
    are up (``tiffany api --after``, their ready files): it imports its
    modules meanwhile, a second of start-up that no longer follows the
    engines', and no client sees an API (its log line, its ``/healthz``)
    whose engine cannot take a submission yet (a 503: the test of the
    dashboard in a browser got one when both simply started at once).
    """
    for engine in engines:
        engine.start()
    api.start()
    if not standby:
        for engine in engines:
            _wait_file(engine.ready_file, engine, START_TIMEOUT_S)
    url = str(_wait_file(api.ready_file, api, START_TIMEOUT_S)["url"])
    up(url)
    if standby:
        typer.echo(
            f"tiffany: API at {url}; each engine takes its journal stream's lease, "
            "or waits while another engine holds it"
        )
        for engine in engines:
            _wait_file(engine.ready_file, engine, float("inf"), stop=stop)
    return url


def _stop_all(children: list[_Child]) -> list[int | None]:
    """Stop children together (SIGTERM to all, then wait for each); return their codes."""
    if len(children) == 1:
        return [children[0].stop()]
    for child in children:
        proc = child.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return [child.stop(signalled=True) for child in children]


def _wait_file(
    path: Path, child: _Child, timeout: float, stop: threading.Event | None = None
) -> dict[str, Any]:
    """Wait for ``child``'s ready file; ``{}`` if ``stop`` is set first (SIGINT, SIGTERM)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            return {}
        if path.exists():
            with contextlib.suppress(ValueError, OSError):
                data: dict[str, Any] = json.loads(path.read_text())
                return data
        if child.proc is not None and child.proc.poll() is not None:
            raise RuntimeError(
                f"{child.name} exited with code {child.proc.returncode} while starting"
            )
        time.sleep(0.05)
    raise RuntimeError(f"{child.name} did not start within {timeout:g}s")


def check_address(host: str, port: int) -> None:
    """Exit 2 at once, saying what to do, if the API could not listen on ``host:port``.

    Checked before any engine starts: otherwise an engine recovers its WAL,
    the API starts and fails on the address, and everything stops again
    after seconds of start-up lines. The check binds as uvicorn does
    (``SO_REUSEADDR``: a port in ``TIME_WAIT`` counts as free) and lets go
    at once; port 0 (any free port) is never taken.
    """
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        _refuse(f"cannot listen on {host!r}: {exc.strerror}; pass an address with --host")
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if exc.errno == errno.EADDRINUSE:
                why = "is in use (another server is listening there); pick another with --port"
            elif exc.errno == errno.EACCES:
                why = "needs privileges (ports below 1024); pick one above with --port"
            else:
                why = f"cannot be listened on ({exc.strerror}); check --host and --port"
            _refuse(f"the API's address {shown} {why}")


def _refuse(message: str) -> NoReturn:
    typer.echo(f"tiffany: {message}", err=True)
    raise typer.Exit(exits.USAGE)


def serve(
    ctx: typer.Context,
    host: Annotated[
        str | None, typer.Option(help="Address the API binds to [default: 127.0.0.1].")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="API port (0: any free port) [default: 8000].")
    ] = None,
    demo: Annotated[bool, typer.Option("--demo", help="Submit the demo plan once up.")] = False,
    engines: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Engine processes, runs spread over them (one per core) [default: 1].",
        ),
    ] = None,
    enable_tool: Annotated[
        list[str] | None,
        typer.Option(
            "--enable-tool",
            metavar="TOOL",
            help="Let the engine run this tool (repeatable; adds to the defaults).",
        ),
    ] = None,
    imports: ImportOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Serve the dashboard and API, and run submitted plans (engine + API processes)."""
    from tiffany.cli import _settings
    from tiffany.control import ControlError, ControlUnavailable, call

    settings = _settings(ctx)
    # Imported here first, so a broken module is told before anything starts;
    # the engines import them again (TIFFANY_TOOL_MODULES), from this directory.
    modules = import_tool_modules(tool_modules(settings.tool_modules, imports))
    data_dir = Path(settings.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if modules:
        env["TIFFANY_TOOL_MODULES"] = ",".join(modules)
    env["TIFFANY_DATA_DIR"] = str(data_dir)
    env["TIFFANY_LOG_FORMAT"] = settings.log_format
    env["TIFFANY_LOG_LEVEL"] = settings.log_level
    env["TIFFANY_HOST"] = host if host is not None else settings.host
    env["TIFFANY_PORT"] = str(port if port is not None else settings.port)
    check_address(env["TIFFANY_HOST"], int(env["TIFFANY_PORT"]))
    if enable_tool:
        tools = list(dict.fromkeys([*settings.enabled_tools, *enable_tool]))
        env["TIFFANY_ENABLED_TOOLS"] = ",".join(tools)
    count = engines if engines is not None else settings.engines
    engine_homes = homes(data_dir, count)
    if len(engine_homes) > count:
        typer.echo(
            f"tiffany: {data_dir} holds the journals of {len(engine_homes)} engines "
            f"(an earlier --engines {len(engine_homes)}); starting them all, so that "
            "their runs resume"
        )
    env["TIFFANY_ENGINES"] = str(len(engine_homes))
    api_ready = data_dir / "api.json"
    for stale in (api_ready, data_dir / "serve.json", *(h / "engine.json" for h in engine_homes)):
        stale.unlink(missing_ok=True)
    exe = [sys.executable, "-m", "tiffany"]
    engine_env = scrub_secrets(env, keep=("TIFFANY_LLM_API_KEY",))
    api_env = scrub_secrets(env, keep=("TIFFANY_API_TOKEN",))
    children = []
    for i, home in enumerate(engine_homes):
        # Engine i lives in its home (its WAL, sockets, workspaces), writes
        # seqs of its own (tiffany/shards.py) and projects into the one store.
        home.mkdir(parents=True, exist_ok=True)
        env_i = {
            **engine_env,
            "TIFFANY_DATA_DIR": str(home),
            "TIFFANY_DATABASE_URL": settings.database_url,
            "TIFFANY_ENGINE": str(i),
        }
        name = "engine" if len(engine_homes) == 1 else f"engine {i}"
        children.append(_Child(name, [*exe, "engine"], env_i, home / "engine.json"))
    # An API started with the engines listens once they are up (see _start).
    standby = settings.journal == "postgres"
    after = [] if standby else [c.ready_file for c in children]
    api = _Child(
        "api", [*exe, "api", *(a for f in after for a in ("--after", str(f)))], api_env, api_ready
    )
    serve_file = data_dir / "serve.json"

    def write_serve_file(url: str) -> None:
        # Atomically: readers (tests, scripts) never see half a file.
        pids = [c.proc.pid if c.proc else None for c in children]
        tmp = serve_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "url": url,
                    "engine_pid": pids[0],
                    "engine_pids": pids,
                    "api_pid": api.proc.pid if api.proc else None,
                }
            )
        )
        tmp.replace(serve_file)

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        url = _start(children, api, standby=standby, stop=stop, up=write_serve_file)
        if not stop.is_set():
            typer.echo(
                f"Tiffany is serving the dashboard at {url}  (data dir {data_dir}; Ctrl-C stops)"
            )
        if demo and not stop.is_set():
            try:
                run_id, created = submit_demo(data_dir, call, len(engine_homes))
                if created:
                    typer.echo(f"submitted the demo plan: run {run_id}  ({url}#/run/{run_id})")
                else:  # `make run` again on the same data dir: the same run
                    typer.echo(
                        f"the demo plan ran here already: run {run_id}  ({url}#/run/{run_id})"
                    )
            except (ControlError, ControlUnavailable) as exc:
                typer.echo(f"tiffany: could not submit the demo plan: {exc}", err=True)
        sys.stdout.flush()
        while not stop.wait(0.2):
            for child in (*children, api):
                proc = child.proc
                if proc is not None and proc.poll() is not None and not stop.is_set():
                    if child is not api and proc.returncode == exits.WAL_DAMAGED:
                        raise RuntimeError(
                            f"the {child.name} refused a damaged WAL (see its message above); "
                            "not restarting it: run `tiffany wal verify`, then `tiffany wal "
                            "repair --salvage`"
                        )
                    delay = child.restart_delay()
                    typer.echo(
                        f"tiffany: the {child.name} process exited with code {proc.returncode}; "
                        f"restarting it in {delay:g}s",
                        err=True,
                    )
                    if stop.wait(delay):
                        break
                    child.restarts += 1
                    child.start()
                    write_serve_file(url)  # the old pid is dead: never leave it there
    except RuntimeError as exc:
        typer.echo(f"tiffany: {exc}", err=True)
        api.stop()
        _stop_all(children)
        serve_file.unlink(missing_ok=True)
        # An engine that refused a damaged WAL: its code, the table's (cli/exits.py).
        damaged = any(
            c is not api and c.proc is not None and c.proc.returncode == exits.WAL_DAMAGED
            for c in children
        )
        raise typer.Exit(exits.WAL_DAMAGED if damaged else exits.FAILED) from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    typer.echo("tiffany: stopping (API first, then the engine flushes the WAL)")
    codes = [("api", api.stop())]
    codes += zip([c.name for c in children], _stop_all(children), strict=True)
    (data_dir / "serve.json").unlink(missing_ok=True)
    bad = [(n, c) for n, c in codes if c not in (0, None)]
    if bad:
        typer.echo(f"tiffany: {', '.join(f'{n} exited {c}' for n, c in bad)}", err=True)
        raise typer.Exit(1)
    typer.echo("tiffany: stopped cleanly")


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
) -> None:
    """Run the engine process alone (what ``serve`` starts): loop, WAL, PAL, projector."""
    from tiffany.cli import _settings
    from tiffany.engine.service import EXIT_WAL_DAMAGED, EngineService
    from tiffany.errors import WalCorruptionError, WalError

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
    from tiffany.engine.projector_proc import run_projector

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
) -> None:
    """Run the API side-process alone (what ``serve`` starts)."""
    from tiffany.api import run_api
    from tiffany.cli import _settings

    raise typer.Exit(run_api(_settings(ctx), ready_file=ready_file, after=after or ()))


def register(app: typer.Typer) -> None:
    """Add ``serve``, and the hidden ``engine`` and ``api`` commands, to ``app``."""
    app.command("serve")(serve)
    app.command("engine", hidden=True)(engine_cmd)
    app.command("api", hidden=True)(api_cmd)
    app.command("projector", hidden=True)(projector_cmd)
