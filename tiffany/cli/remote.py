"""The CLI against a server's HTTP API: ``--url`` and ``--token``.

``submit``, ``status``, ``runs``, ``tail``, ``cancel``, ``signal``,
``rerun``, ``schedule ...`` and ``memory ...`` take ``--url`` and ``--token`` (``TIFFANY_URL``,
``TIFFANY_API_TOKEN``); given a URL, they go through the
Python SDK (:class:`tiffany.Client`) to that server instead of the local
engine's control socket. Their output is the same either way, and so are
their exit codes (``tiffany/cli/exits.py``: an HTTP 404 is 3, a 422 is 2, an
unreachable server 5).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Annotated, Any, Final

import typer

from tiffany.cli import exits

__all__ = ["TokenOption", "UrlOption", "printable", "remote", "show_event"]

#: Control characters (C0, DEL, C1) as ``printable`` writes them: ``\x1b``.
_CONTROL: Final = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}

#: ``--url``: the server to talk to, instead of the engine on the data dir.
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="TIFFANY_URL",
        help="A Tiffany server's URL (http://host:port): talk to its HTTP API instead of "
        "the engine serving the data dir [env: TIFFANY_URL].",
        show_envvar=False,
        show_default=False,
    ),
]
#: ``--token``: the server's API token (``Authorization: Bearer``).
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="TIFFANY_API_TOKEN",
        help="The server's API token, with --url [env: TIFFANY_API_TOKEN].",
        show_envvar=False,
        show_default=False,
    ),
]


@contextlib.contextmanager
def remote(url: str, token: str | None, ctx: typer.Context | None = None) -> Iterator[Any]:
    """A :class:`tiffany.Client` for ``url``; its errors: one line and the table's exit code.

    ``ctx``: the command's, so that an error names its options as given
    (``--url`` or ``TIFFANY_URL``, ``-i`` or ``--input``).
    """
    from tiffany.cli.flags import typed_flag
    from tiffany.sdk import Client
    from tiffany.sdk.errors import ApiError, ClientError, ConnectionFailed

    try:
        client = Client(url, token)
    except ValueError as exc:
        why = str(exc).removeprefix("url: ")
        typer.echo(f"tiffany: {typed_flag(ctx, 'url')}: {why}", err=True)
        raise typer.Exit(exits.USAGE) from None
    try:
        with client:
            yield client
    except ApiError as exc:
        message = exc.message
        if exc.status == 401:  # the server's words name the header; a CLI user gives an option
            message += " (the CLI sends --token, or TIFFANY_API_TOKEN)"
        print_problem(message, [(e.path, e.msg) for e in exc.errors], ctx)
        raise typer.Exit(exits.for_status(exc.status)) from None
    except ConnectionFailed as exc:
        typer.echo(f"tiffany: {exc.message}", err=True)
        raise typer.Exit(exits.UNAVAILABLE) from None
    except ClientError as exc:
        typer.echo(f"tiffany: {exc}", err=True)
        raise typer.Exit(exits.FAILED) from None


def control_problems(detail: Any) -> list[tuple[str, str]]:
    """The ``(loc, msg)`` pairs of a control error's ``detail`` (none unless a list).

    A ``loc`` given as a list (``["body", "by"]``) is written as the SDK's
    ``path`` (``body.by``): ``--url`` or not, a field reads the same.
    """
    from tiffany.sdk.errors import FieldError

    items = detail if isinstance(detail, list) else []
    out = []
    for e in items:
        if not isinstance(e, dict):
            continue
        loc = e.get("loc") or ""
        if isinstance(loc, list | tuple):
            loc = FieldError(tuple(loc), "").path
        out.append((str(loc), str(e.get("msg"))))
    return out


def printable(text: object) -> str:
    r"""``text`` for a terminal, its control characters written out (``\x1b``, ``\x0a``).

    Plan names, task labels and error messages come from whoever submitted
    the plan: an ESC in one must not drive the reader's terminal (colours,
    its title, the cursor), nor a newline split a one-line row.
    """
    return str(text).translate(_CONTROL)


def print_problem(
    message: str, fields: list[tuple[str, str]], ctx: typer.Context | None = None
) -> None:
    """An error answer on standard error: its message, then one line per field it names.

    A message that already lists those fields (``invalid plan: a: x; b: y``)
    keeps only its head, so each problem is printed once, as ``tiffany run``
    and ``tiffany plan validate`` print them. A field an option of the
    command filled is named as the option was typed (``inputs.nope`` is
    ``-i nope``; ``tiffany/cli/flags.py``), and when every field is one,
    each is a ``tiffany: --input nope: ...`` line of its own: the plan was
    not at fault.
    """
    from tiffany.cli.flags import flag_loc

    flags = [flag_loc(ctx, loc) if loc else None for loc, _ in fields]
    if fields and all(flags):
        for flag, (_, msg) in zip(flags, fields, strict=True):
            typer.echo(f"tiffany: {printable(flag)}: {printable(msg)}", err=True)
        return
    if fields and all(msg in message for _, msg in fields):
        typer.echo(f"tiffany: {printable(message.split(': ', 1)[0])}:", err=True)
    else:
        typer.echo(f"tiffany: {printable(message)}", err=True)
    for flag, (loc, msg) in zip(flags, fields, strict=True):
        typer.echo(f"  {printable(flag or loc or '(plan)')}: {printable(msg)}", err=True)


def show_event(frame: dict[str, Any], as_json: bool) -> None:
    """One feed event as ``tail`` prints it: local time, run, task, kind, label."""
    if as_json:
        sys.stdout.write(json.dumps(frame) + "\n")
    elif "seq" in frame:
        ts = frame.get("ts")
        when = (
            time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"
            if isinstance(ts, int | float) and ts > 0
            else "-"
        )
        run, task = printable(frame.get("run_id") or "-"), printable(frame.get("task") or "")
        sys.stdout.write(
            f"{when}  {run:<18} {task:<24} "
            f"{printable(frame['kind']):<13} {printable(frame.get('label') or '')}\n"
        )
    else:
        sys.stdout.write(f"-- {printable(frame)}\n")
    sys.stdout.flush()
