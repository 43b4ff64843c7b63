"""Parse a ``tiffany`` command line as the CLI would, without running it.

``python tests/docs/parse_cli.py serve --demo --port 8000`` exits 0 when
the CLI's parser (typer's click) accepts every option, argument and value
of the command (and of each group on the way to it), and 2 with its
message otherwise. The
documented commands that do not end by themselves (``serve``, ``tail``
without ``--run``) are checked this way (tests/docs/doc_commands.py).
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup


def parse(argv: list[str]) -> None:
    """Make the contexts ``tiffany ARGV`` makes, down to its command; raise on a usage error."""
    from tiffany.cli import app

    command: Any = typer.main.get_command(app)
    ctx = command.make_context("tiffany", list(argv))
    while isinstance(command, TyperGroup):
        # A group keeps the rest of the line for its command (as its own invoke reads it).
        rest = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        if not rest:
            raise typer.BadParameter("no command given")
        name, sub, args = command.resolve_command(ctx, rest)
        command, ctx = sub, sub.make_context(name, args, parent=ctx)


def main() -> int:
    """Parse ``sys.argv[1:]``: 0 if the CLI accepts it, 2 (click's message on stderr) if not."""
    try:
        parse(sys.argv[1:])
    except typer.Exit as exc:  # an eager option (--version, --help) answered: accepted
        return int(exc.exit_code)
    except typer.TyperException as exc:  # typer's click: a usage error, a bad value
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        print(f"tiffany: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
