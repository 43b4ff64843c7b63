"""``tiffany serve``: the engine process and the API side-process, supervised.

``serve`` starts two children of its own interpreter, ``tiffany engine``
(the kernel loop, WAL, PAL hub, projector, control socket) and ``tiffany
api`` (FastAPI under uvicorn), waits until both answer, optionally submits
the demo plan, prints the dashboard's address and writes it to
``<data dir>/serve.json``. A child that dies is restarted (with backoff) on
its own, whenever it dies, while starting too: the API resumes the feed
where it was, the engine recovers its runs from the WAL, and ``serve.json``
is rewritten with the new pids. SIGINT/SIGTERM stop the API first (no new
requests), then the engine (the WAL is flushed), and ``serve`` exits 0.

The API's address is serve's: serve binds the listening socket once, before
any child starts, and hands it to every API process it starts (``tiffany
api --fd``). A restarted API listens on the same port, ``--port 0`` too, so
the URL in ``serve.json`` and in the clients that read it stays good, and a
client that connects while no API runs waits in the socket's backlog for
the next one instead of being refused. (Until the first API listens the
socket is bound only, and refuses: no client meets an API whose engines
are not up.)

The supervisor survives what its children survive (issue 38):

* Only a child's exit code that says a restart cannot help stops ``serve``
  (:data:`NO_RESTART`: a bad usage or setting, a damaged WAL), and so does
  a child alive but not up within ``START_TIMEOUT_S`` of its start, before
  the service was first up. Any other death, at any moment, is restarted.
* A file of its own it cannot write (``serve.json`` on a full disk, its
  output) is told and retried, never fatal: once space is freed, the next
  restart of a child comes up and ``serve.json`` is written again.
* Its children die with it: every way out of ``serve`` stops them, and each
  holds a lifeline (``tiffany/supervisor/lifeline.py``: the parent-death signal)
  for the ways out that run no code of ours (``kill -9``).

Each child gets only the secrets it uses (docs/security.md): the API the
API token (``TIFFANY_API_TOKEN``), the engine the LLM key
(``TIFFANY_LLM_API_KEY``); every other secret-looking variable
(:func:`tiffany.config.is_secret_name`) is left out of both. A shell step
that escapes its sandbox, or runs without one, finds no API token in the
engine's ``/proc/<pid>/environ``.

The children's side (the hidden ``tiffany engine``, ``tiffany api`` and
``tiffany projector`` commands, each a process alone) is ``processes.py``'s.
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

from tiffany.cli import DataDirOption, exits, hints
from tiffany.cli.imports import ImportOption, import_tool_modules, tool_modules
from tiffany.cli.processes import api_cmd, engine_cmd, projector_cmd
from tiffany.config import scrub_secrets
from tiffany.supervisor import Child, NoRestart, RestartPolicy, stop_all
from tiffany.wire.shards import engine_for_key, engine_home, homes

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
#: How often serve looks at its children while they start, then once up, in seconds.
STARTING_POLL_S: Final = 0.05
POLL_S: Final = 0.2
#: Exit codes of a child that restarting cannot help (cli/exits.py): a bad
#: option or setting (USAGE), a damaged WAL (WAL_DAMAGED, ``tiffany wal
#: repair``). serve stops, with the child's code. Any other exit, whenever
#: it comes (a crash, a fail-stop on a full disk, a fence, while starting
#: too), is a restart with backoff.
NO_RESTART: Final = frozenset({exits.USAGE, exits.WAL_DAMAGED})
#: How serve starts a child: this interpreter, this Tiffany.
_EXE: Final = (sys.executable, "-m", "tiffany")


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
    (:func:`~tiffany.wire.shards.engine_for_key`).
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


def _say(message: str, *, err: bool = False) -> None:
    """Tell the operator, best effort: a full disk under serve's output is no reason to die."""
    with contextlib.suppress(OSError):
        typer.echo(message, err=err)


class _GiveUp(Exception):
    """serve stops: a child's death that restarting cannot help."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _Child(Child):
    """One child of serve (:class:`~tiffany.supervisor.Child`), up once its ready file is.

    Its deaths are told to the operator on stderr; a code in :data:`NO_RESTART`
    stops serve.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        ready_file: Path,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        super().__init__(
            name,
            [*argv, "--ready-file", str(ready_file), "--supervisor", str(os.getpid())],
            env,
            RestartPolicy(
                RESTART_DELAY_S, MAX_RESTART_DELAY_S, stable_s=STABLE_S, no_restart=NO_RESTART
            ),
            pass_fds=pass_fds,
            on_died=_told_death,
        )
        self.ready_file = ready_file  # written by the child once it is up
        #: Its latest process wrote its ready file (it is up, or was).
        self.came_up = False

    def start(self) -> subprocess.Popen[bytes]:
        self.came_up = False
        return super().start()

    def check_up(self) -> bool:
        """Whether its latest process came up (its ready file is read until it has)."""
        if not self.came_up:
            self.came_up = self.up() is not None
        return self.came_up

    def up(self) -> dict[str, Any] | None:
        """Its ready file, if this process (not an earlier one) wrote it."""
        if self.proc is None:
            return None
        with contextlib.suppress(ValueError, OSError):
            data: dict[str, Any] = json.loads(self.ready_file.read_text())
            if data.get("pid") == self.proc.pid:
                return data
        return None

    def killing(self, timeout: float) -> None:
        _say(f"tiffany: {self.name} did not stop in {timeout:g}s; killing it", err=True)


def _told_death(child: Child, code: int, delay: float) -> None:
    """Tell the operator a child died and when it restarts (its ``on_died``)."""
    assert isinstance(child, _Child)
    when = " while starting" if not child.check_up() else ""
    _say(
        f"tiffany: the {child.name} process exited with code {code}{when}; "
        f"restarting it in {delay:g}s",
        err=True,
    )


class _Supervisor:
    """serve's loop: start the children, restart any that dies, say when the service is up.

    On the PostgreSQL journal (``standby``) an engine may wait for its
    stream's lease as long as another engine holds it: the API comes up
    first, so that a standby is alive (``/healthz``) but not ready
    (``/readyz``: no engine), and the engines have no start deadline.

    Otherwise the API starts with the engines but listens only once they
    are up (``tiffany api --after``, their ready files): it imports its
    modules meanwhile, most of its start-up, which no longer follows the
    engines', and no client sees an API (its log line, its ``/healthz``)
    whose engine cannot take a submission yet (a 503: the test of the
    dashboard in a browser got one when both simply started at once).

    Discussion: one loop for the start and the life after it. The start
    used to wait for each child's ready file and stop everything when one
    died meanwhile (a PostgreSQL engine killed in its first seconds took
    the healthy engine and the API with it); a death is now a death, the
    same restart with backoff whenever it comes, and each child's backoff
    runs on its own deadline, never blocking the care of the others.
    """

    def __init__(
        self,
        engines: list[_Child],
        api: _Child,
        *,
        standby: bool,
        serve_file: Path,
        stop: threading.Event,
    ) -> None:
        self.engines = engines
        self.api = api
        self.standby = standby
        self.serve_file = serve_file
        self.stop = stop
        #: The API's address, once it listened.
        self.url: str | None = None
        self._serving = False
        self._serve_file_due = False  # serve.json is to be (re)written
        self._serve_file_told = False  # its failure was told (once per streak)

    def run(self, serving: Callable[[str], None]) -> None:
        """Supervise until ``stop`` is set; call ``serving(url)`` once everything is up.

        Raises:
            _GiveUp: A child exited with a code in :data:`NO_RESTART`, or
                did not come up within ``START_TIMEOUT_S`` of its start.
        """
        for child in (*self.engines, self.api):
            child.start()
        while not self.stop.wait(POLL_S if self._serving else STARTING_POLL_S):
            self._tend()
            self._watch_api()
            if not self._serving and self.url is not None:
                if all(engine.check_up() for engine in self.engines):
                    self._serving = True
                    serving(self.url)
                else:
                    self._check_start_deadlines()
            if self._serve_file_due:
                self._write_serve_file()

    def _tend(self) -> None:
        """Restart the children that died, each when its backoff is over (never waiting)."""
        now = time.monotonic()
        for child in (*self.engines, self.api):
            restarting = child.due is not None
            try:
                running = child.tend(now, may_start=not self.stop.is_set())
            except NoRestart as exc:
                raise _GiveUp(self._no_restart(child, exc.code), exc.code) from None
            if running and restarting and self.url is not None:
                self._serve_file_due = True  # the old pid is dead: never leave it there
            elif running:
                child.check_up()

    def _no_restart(self, child: _Child, code: int) -> str:
        if code == exits.WAL_DAMAGED:
            again = hints.again(Path(child.env.get("TIFFANY_DATA_DIR") or ".tiffany"))
            return (
                f"the {child.name} exited with code {code}: it refused a damaged WAL (see its "
                f"message above), which no restart mends: run `tiffany wal verify{again}`, then "
                f"`tiffany wal repair --salvage{again}`"
            )
        return (
            f"the {child.name} exited with code {code}: a bad option or setting (see its "
            "message above), which no restart mends"
        )

    def _watch_api(self) -> None:
        """Note the API's address once it listens (a restart listens on the same socket)."""
        ready = self.api.up()
        if ready is None or ready.get("url") == self.url:
            return
        first = self.url is None
        self.url = str(ready["url"])
        self._serve_file_due = True
        if first and self.standby:
            _say(
                f"tiffany: API at {self.url}; each engine takes its journal stream's lease, "
                "or waits while another engine holds it"
            )

    def _check_start_deadlines(self) -> None:
        """A child alive but not up ``START_TIMEOUT_S`` after its start, before the first up."""
        now = time.monotonic()
        waiting = [self.api] if self.standby else [*self.engines, self.api]
        for child in waiting:
            late = now - child.started_at > START_TIMEOUT_S
            if child.due is None and late and not child.check_up():
                raise _GiveUp(
                    f"{child.name} did not start within {START_TIMEOUT_S:g}s", exits.FAILED
                )

    def _write_serve_file(self) -> None:
        """Write ``serve.json`` atomically; on a full disk, say so and try again later."""
        pids = [c.proc.pid if c.proc else None for c in self.engines]
        doc = {
            "url": self.url,
            "engine_pid": pids[0],
            "engine_pids": pids,
            "api_pid": self.api.proc.pid if self.api.proc else None,
        }
        tmp = self.serve_file.with_suffix(".tmp")
        try:  # atomically: readers (tests, scripts) never see half a file
            tmp.write_text(json.dumps(doc))
            tmp.replace(self.serve_file)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if not self._serve_file_told:
                self._serve_file_told = True
                _say(
                    f"tiffany: cannot write {self.serve_file} ({exc.strerror}); "
                    "serving on, it is written again once it can be",
                    err=True,
                )
            return
        self._serve_file_due = False
        if self._serve_file_told:
            self._serve_file_told = False
            _say(f"tiffany: {self.serve_file} written again")


def bind_api_sockets(host: str, port: int) -> list[socket.socket]:
    """Bind the API's listening sockets on ``host:port`` (serve keeps them); exit 2 if it cannot.

    Bound before any engine starts: an address the API could not listen on
    is told at once, saying what to do, not after an engine recovered its
    WAL and the API failed on it. Bound as asyncio's ``create_server``
    binds for uvicorn: one socket per address ``host`` names (``localhost``
    may name ``127.0.0.1`` and ``::1``), ``SO_REUSEADDR`` (a port in
    ``TIME_WAIT`` counts as free), IPv6 sockets IPv6 only; port 0 becomes
    one free port, the same on every address. Not listening yet: the API
    child listens on them once its engines are up (``tiffany api --fd``),
    and they stay listening in serve across its restarts.
    """
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        _refuse(f"cannot listen on {host!r}: {exc.strerror}; pass an address with --host")
    bound: list[socket.socket] = []
    for family, kind, proto, _name, address in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        bound.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if port == 0 and len(bound) > 1:  # the port the first address got
            address = (address[0], bound[0].getsockname()[1], *address[2:])
        try:
            sock.bind(address)
        except OSError as exc:
            for done in bound:
                done.close()
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if exc.errno == errno.EADDRINUSE:
                why = "is in use (another server is listening there); pick another with --port"
            elif exc.errno == errno.EACCES:
                why = "needs privileges (ports below 1024); pick one above with --port"
            else:
                why = f"cannot be listened on ({exc.strerror}); check --host and --port"
            _refuse(f"the API's address {shown} {why}")
    return bound


def _no_model(settings: Any) -> bool:
    """True if the engines would have no model for llm steps (``tools/llm.py``)."""
    from tiffany.agents.tools.llm import LlmNotConfigured, provider_for
    from tiffany.engine import tool_settings

    try:
        provider_for(tool_settings(settings, server=True), None)
    except LlmNotConfigured:
        return not settings.llm_base_url  # an endpoint without a model: the operator's to fix
    return False


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
    from tiffany.ports.journals import journals_for

    settings = _settings(ctx)
    # Imported here first, so a broken module is told before anything starts;
    # the engines import them again (TIFFANY_TOOL_MODULES), from this directory.
    modules = import_tool_modules(tool_modules(settings.tool_modules, imports))
    home = Path(settings.data_dir)
    home.mkdir(parents=True, exist_ok=True)
    env = _serve_env(settings, home, modules, host, port, enable_tool, demo=demo)
    listeners = bind_api_sockets(env["TIFFANY_HOST"], int(env["TIFFANY_PORT"]))
    engine_homes = _engine_homes(home, engines if engines is not None else settings.engines)
    env["TIFFANY_ENGINES"] = str(len(engine_homes))
    for stale in (
        home / "api.json",
        home / "serve.json",
        *(h / "engine.json" for h in engine_homes),
    ):
        stale.unlink(missing_ok=True)
    children = _engine_children(settings, env, engine_homes)
    # An API started with the engines listens once they are up (see _Supervisor);
    # where an engine may wait for its journal's lease, the API listens at once.
    standby = journals_for(settings).leased
    api = _api_child(env, home / "api.json", listeners, [] if standby else children)
    stop = threading.Event()
    supervisor = _Supervisor(
        children, api, standby=standby, serve_file=home / "serve.json", stop=stop
    )
    serving = _announcer(home, len(engine_homes), stop, demo=demo)
    _supervise(supervisor, listeners, serving)


def _serve_env(
    settings: Any,
    data_dir: Path,
    modules: list[str],
    host: str | None,
    port: int | None,
    enable_tool: list[str] | None,
    *,
    demo: bool,
) -> dict[str, str]:
    """The environment serve's children start from (each then drops the secrets it does not use)."""
    env = dict(os.environ)
    if modules:
        env["TIFFANY_TOOL_MODULES"] = ",".join(modules)
    env["TIFFANY_DATA_DIR"] = str(data_dir)
    env["TIFFANY_LOG_FORMAT"] = settings.log_format
    env["TIFFANY_LOG_LEVEL"] = settings.log_level
    env["TIFFANY_HOST"] = host if host is not None else settings.host
    env["TIFFANY_PORT"] = str(port if port is not None else settings.port)
    if enable_tool:
        tools = list(dict.fromkeys([*settings.enabled_tools, *enable_tool]))
        env["TIFFANY_ENABLED_TOOLS"] = ",".join(tools)
    if demo and _no_model(settings):
        # The demo plan has llm steps: offline, it asks for the scripted provider.
        env["TIFFANY_LLM_MODEL"] = "scripted"
        typer.echo(
            "the demo's llm steps use the offline scripted provider (TIFFANY_LLM_MODEL=scripted); "
            "set TIFFANY_LLM_BASE_URL and TIFFANY_LLM_MODEL for a real model"
        )
    return env


def _engine_homes(data_dir: Path, count: int) -> list[Path]:
    """The engines' homes: ``count``, or more if the data dir holds more journals (told)."""
    engine_homes = homes(data_dir, count)
    if len(engine_homes) > count:
        typer.echo(
            f"tiffany: {data_dir} holds the journals of {len(engine_homes)} engines "
            f"(an earlier --engines {len(engine_homes)}); starting them all, so that "
            "their runs resume"
        )
    return engine_homes


def _engine_children(settings: Any, env: dict[str, str], engine_homes: list[Path]) -> list[_Child]:
    """One child per engine home, each with the LLM key but not the API token."""
    engine_env = scrub_secrets(env, keep=("TIFFANY_LLM_API_KEY",))
    children = []
    for i, home in enumerate(engine_homes):
        # Engine i lives in its home (its WAL, sockets, workspaces), writes
        # seqs of its own (tiffany/wire/shards.py) and projects into the one store.
        home.mkdir(parents=True, exist_ok=True)
        env_i = {
            **engine_env,
            "TIFFANY_DATA_DIR": str(home),
            "TIFFANY_DATABASE_URL": settings.database_url,
            "TIFFANY_ENGINE": str(i),
        }
        name = "engine" if len(engine_homes) == 1 else f"engine {i}"
        children.append(_Child(name, [*_EXE, "engine"], env_i, home / "engine.json"))
    return children


def _api_child(
    env: dict[str, str], ready_file: Path, listeners: list[socket.socket], after: list[_Child]
) -> _Child:
    """The API child: on serve's sockets (the same port across restarts), after ``after`` are up."""
    fds = [sock.fileno() for sock in listeners]
    argv = [*_EXE, "api", *(a for fd in fds for a in ("--fd", str(fd)))]
    argv += [a for c in after for a in ("--after", str(c.ready_file))]
    api_env = scrub_secrets(env, keep=("TIFFANY_API_TOKEN",))
    return _Child("api", argv, api_env, ready_file, pass_fds=tuple(fds))


def _announcer(
    data_dir: Path, engines: int, stop: threading.Event, *, demo: bool
) -> Callable[[str], None]:
    """What serve does once everything is up: say where, and submit the demo if asked."""
    from tiffany.wire.control import ControlError, ControlUnavailable, call

    def serving(url: str) -> None:
        _say(f"Tiffany is serving the dashboard at {url}  (data dir {data_dir}; Ctrl-C stops)")
        if demo and not stop.is_set():
            try:
                run_id, created = submit_demo(data_dir, call, engines)
                if created:
                    _say(f"submitted the demo plan: run {run_id}  ({url}#/run/{run_id})")
                else:  # `make run` again on the same data dir: the same run
                    _say(f"the demo plan ran here already: run {run_id}  ({url}#/run/{run_id})")
            except (ControlError, ControlUnavailable, OSError) as exc:
                _say(f"tiffany: could not submit the demo plan: {exc}", err=True)
        with contextlib.suppress(OSError):
            sys.stdout.flush()

    return serving


def _supervise(
    supervisor: _Supervisor, listeners: list[socket.socket], serving: Callable[[str], None]
) -> None:
    """Run ``supervisor`` until a signal or a give-up; stop every child on every way out.

    Raises:
        typer.Exit: The give-up's code, or 1 if a child did not exit cleanly.
    """

    def on_signal(signum: int, frame: object) -> None:
        supervisor.stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    failure: _GiveUp | None = None
    ended = False
    try:
        supervisor.run(serving)
        ended = True
    except _GiveUp as exc:
        failure = exc
    finally:
        # Every way out stops the children, a bug of serve's own included
        # (its traceback follows); a kill -9 is their lifeline's.
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if failure is not None:
            _say(f"tiffany: {failure}", err=True)
        elif ended:
            _say("tiffany: stopping (API first, then the engine flushes the WAL)")
        else:
            _say("tiffany: serve failed; stopping its children", err=True)
        codes = _stop_children(supervisor, listeners)
    if failure is not None:
        raise typer.Exit(failure.code)
    bad = [(n, c) for n, c in codes if c not in (0, None)]
    if bad:
        _say(f"tiffany: {', '.join(f'{n} exited {c}' for n, c in bad)}", err=True)
        raise typer.Exit(1)
    _say("tiffany: stopped cleanly")


def _stop_children(
    supervisor: _Supervisor, listeners: list[socket.socket]
) -> list[tuple[str, int | None]]:
    """Close the port, stop the API, then the engines together; return each one's code."""
    for sock in listeners:  # the API's stop closes the port: no connection waits on
        sock.close()
    api, engines = supervisor.api, supervisor.engines
    codes = [(api.name, api.stop(STOP_TIMEOUT_S))]
    codes += zip([c.name for c in engines], stop_all(engines, STOP_TIMEOUT_S), strict=True)
    with contextlib.suppress(OSError):
        supervisor.serve_file.unlink(missing_ok=True)
    return codes


def register(app: typer.Typer) -> None:
    """Add ``serve``, and the hidden commands of the processes it starts, to ``app``."""
    app.command("serve")(serve)
    app.command("engine", hidden=True)(engine_cmd)
    app.command("api", hidden=True)(api_cmd)
    app.command("projector", hidden=True)(projector_cmd)
