"""The ``tiffany`` command line.

The CLI is an entry point: it builds :class:`~tiffany.config.Settings` once
(from ``TIFFANY_*`` variables and the global options), configures logging, and
passes the settings down. It sits at the top of the layer table and may import
anything, but it imports heavy layers (kernel, engine, API) lazily, inside the
command that needs them, so ``tiffany version`` stays fast.

Commands that exist:

* ``tiffany demo``: run the kernel demo (:mod:`tiffany.cli.demo`).
* ``tiffany config``: print the effective settings, secrets masked.
* ``tiffany version``: print the version.

Help texts: a command's docstring is written for the code's readers
(reST); :func:`plain_help` turns it into the plain text ``--help`` prints.
An error names an option as the user gave it (``-i`` or ``--input``,
``--url`` or ``TIFFANY_URL``): ``tiffany/cli/flags.py``.

Credentials in URLs never reach the terminal: whatever the CLI writes to
standard error (its errors and hints, log lines, tracebacks) passes through
:func:`tiffany.wire.redaction.redact_url_credentials` (:class:`RedactingStream`),
so ``--url http://user:password@host`` or a ``?token=`` in a message shows as
``[REDACTED]``. Standard output (run ids, tables, JSON) is the commands'
data and is written as it is.

Commands to come, each added together with its implementation (see
docs/architecture.md; nothing is stubbed here): ``serve`` (engine + API processes),
``run PLAN`` (in-process engine with a live view), ``replay RUN_ID
[--verify]``, ``wal dump|verify|repair``, ``db upgrade|rebuild``, and ``plan``
(validate a plan file). Command groups are ``typer.Typer()`` sub-apps added
with ``app.add_typer(wal_app, name="wal")``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

import tiffany
from tiffany.cli.flags import ArgvGroup
from tiffany.wire.redaction import redact_url_credentials

if TYPE_CHECKING:
    from tiffany.config import Settings
    from tiffany.engine import Engine

app = typer.Typer(
    name="tiffany",
    help="Tiffany: durable agent-task orchestration on a generator kernel.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=ArgvGroup,  # keeps the command line: an error names an option as typed (flags.py)
    # Plain click help: rich markup read "[default: 127.0.0.1]" in a help text
    # as a tag and dropped it ("binds to ."), and showed flags as "--help <bool>".
    rich_markup_mode=None,
)

#: Exit status for bad configuration or usage (as click uses for usage errors).
EXIT_USAGE = 2


@dataclass
class _Options:
    """Global options, turned into :class:`Settings` by :func:`_settings`."""

    data_dir: Path | None = None
    log_format: str | None = None
    log_level: str | None = None
    settings: Settings | None = None


#: The ``--data-dir`` option of a command (same meaning as the global one).
DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data directory (WAL, SQLite store) [default: ./.tiffany; env: TIFFANY_DATA_DIR].",
        show_default=False,
    ),
]


EngineOption = Annotated[
    int,
    typer.Option(
        "--engine",
        min=0,
        help="Which engine's journal, when `serve --engines N` ran on the data dir.",
    ),
]


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tiffany {tiffany.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Data directory (WAL, SQLite store). [env: TIFFANY_DATA_DIR]",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            help="auto, console or json. [env: TIFFANY_LOG_FORMAT]",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help="debug, info, warning, error. [env: TIFFANY_LOG_LEVEL]",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Tiffany: durable agent-task orchestration on a generator kernel."""
    ctx.obj = _Options(data_dir=data_dir, log_format=log_format, log_level=log_level)


def _build_engine(settings: Settings, **kwargs: Any) -> Engine:
    """``engine.build``, with a journal another engine holds (or cannot open) said plainly.

    A held WAL lock or PostgreSQL stream lease, a failed or corrupt journal:
    one ``tiffany: ...`` line and exit 1, not a traceback.
    """
    from tiffany.engine import build
    from tiffany.errors import WalError

    try:
        return build(settings, **kwargs)
    except WalError as exc:
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(1) from None


def _settings(ctx: typer.Context) -> Settings:
    """Build the settings once per invocation and configure logging.

    Commands that need configuration call this; commands that do not
    (``version``) never read the environment, so a bad variable cannot break
    them.
    """
    from pydantic import ValidationError

    from tiffany.config import Settings
    from tiffany.log import configure_logging

    options = ctx.find_object(_Options) or _Options()
    # A command's own ``--data-dir`` (``tiffany run PLAN --data-dir DIR``)
    # wins over the global one (``tiffany --data-dir DIR run PLAN``).
    own = (ctx.params or {}).get("data_dir")
    if own is not None and own != options.data_dir:
        options.data_dir = own
        options.settings = None
    if options.settings is None:
        overrides: dict[str, Any] = {
            name: value
            for name, value in (
                ("data_dir", options.data_dir),
                ("log_format", options.log_format),
                ("log_level", options.log_level),
            )
            if value is not None
        }
        try:
            options.settings = Settings(**overrides)
        except ValidationError as exc:
            typer.echo(f"tiffany: invalid configuration:\n{exc}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        configure_logging(options.settings)
    return options.settings


@app.command()
def version() -> None:
    """Print the version of Tiffany and of the Python running it."""
    py = ".".join(str(part) for part in sys.version_info[:3])
    typer.echo(f"tiffany {tiffany.__version__} (Python {py})")


@app.command("config")
def show_config(ctx: typer.Context) -> None:
    """Print the effective settings as JSON (API token and passwords masked)."""
    settings = _settings(ctx)
    typer.echo(json.dumps(settings.public_dict(), indent=2))


@app.command()
def demo(ctx: typer.Context) -> None:
    """Run the kernel demo: a few tasks sleeping, spawning and joining."""
    _settings(ctx)
    from tiffany.cli.demo import main as demo_main

    raise typer.Exit(demo_main())


class RedactingStream(io.TextIOBase):
    """A text stream that writes to ``target`` with credentials in URLs masked.

    Discussion: one place instead of a call at each of the CLI's hundred and
    more messages: the ones that name a URL are the SDK's and httpx's words
    about the server (``cannot reach http://user:pw@host``), a database's
    driver's, a traceback's, and new ones come with every command. Each
    ``write`` is masked whole: ``typer.echo`` writes a message and its
    newline at once, and log handlers a line at once.
    """

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self.target = target

    def write(self, text: str) -> int:
        """Write ``text``, masked; the length of ``text`` (as a stream answers)."""
        self.target.write(redact_url_credentials(text) if isinstance(text, str) else text)
        return len(text)

    def flush(self) -> None:
        """Flush the target."""
        self.target.flush()

    def isatty(self) -> bool:
        """Whether the target is a terminal (colours, the live view)."""
        return self.target.isatty()

    def fileno(self) -> int:
        """The target's descriptor (children started by ``serve`` inherit it, unmasked)."""
        return self.target.fileno()

    def writable(self) -> bool:
        """True: a stream to write to."""
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The target's encoding."""
        return str(getattr(self.target, "encoding", None) or "utf-8")

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        """The target's error handler."""
        return getattr(self.target, "errors", None)


@contextlib.contextmanager
def redacted_stderr() -> Iterator[None]:
    """Standard error through :class:`RedactingStream` while the CLI runs."""
    real = sys.stderr
    sys.stderr = RedactingStream(real)
    try:
        yield
    finally:
        sys.stderr = real


def main() -> None:
    """Run the ``tiffany`` command line (the console-script entry point)."""
    with redacted_stderr():
        app(prog_name="tiffany")


def _register_subcommands() -> None:
    # Imported here so each command module can use ``app`` and ``_settings``.
    from tiffany.cli import client, db, durable, export, memory, run, schedule, serve, tools

    durable.register(app)
    export.register(app)
    run.register(app)
    db.register(app)
    serve.register(app)
    client.register(app)
    schedule.register(app)
    memory.register(app)
    tools.register(app)


#: A Sphinx role (``:func:`~tiffany.x.y```, ``:class:`Settings```) in a docstring.
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]+?)(?:\s*<[^>]*>)?`")


def plain_help(text: str) -> str:
    r"""A command's docstring as its help: reST markup turned into plain text.

    The docstrings are written for the code's readers (reST, as every
    docstring of the package); ``--help`` printed them as they are:
    ````tiffany serve````, ``:func:`...```. Here a literal is put in single
    backquotes (as the options' help texts write commands), and a role
    keeps its text (the last part of a dotted name, as Sphinx shows ``~``).
    Click's own ``\b`` (keep the next paragraph's lines) is click's to read.
    """

    def role(match: re.Match[str]) -> str:
        short, name = match.group(1), match.group(2).strip()
        return f"`{name.rsplit('.', 1)[-1] if short else name}`"

    return _ROLE.sub(role, text).replace("``", "`")


def _plain_helps(typer_app: typer.Typer) -> None:
    """Give every command of ``typer_app`` (and of its groups) its help as plain text."""
    import inspect

    for command in typer_app.registered_commands:
        doc = command.help if command.help is not None else inspect.getdoc(command.callback)
        if doc:
            command.help = plain_help(doc)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            help_text = group.typer_instance.info.help
            if isinstance(help_text, str):
                group.typer_instance.info.help = plain_help(help_text)
            _plain_helps(group.typer_instance)


_register_subcommands()
_plain_helps(app)
