"""The options as the user gave them, so that an error names what they typed.

A refusal names the field at fault as the request has it (``inputs.nope``,
``from_step``, ``Idempotency-Key``, ``payload``), and a check of an option
names one spelling of it (``--input`` for ``-i nope``, ``--url`` for a
``TIFFANY_URL`` in the environment). Neither is what the user typed. Here:

* :class:`ArgvGroup`, the root command's class, keeps the command line in
  the context's ``meta`` (shared by every sub-command's context);
* :func:`typed_flag` names an option as given: the spelling found on the
  command line (``-i`` or ``--input``), or the environment variable it
  came from;
* :func:`flag_loc` names a refusal's field as the option that filled it
  (``inputs.nope`` is ``--input nope``), for
  :func:`tiffany.cli.remote.print_problem`.

Discussion: click records which parameter an argument filled, not the
spelling it was given under; the command line is read again here, token by
token, as click's parser reads it (``-iVALUE``, ``--input=VALUE``). A
spelling that is not found (a test calling a command's function) is named
by the option's first name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import typer
from typer.core import TyperGroup

__all__ = ["ArgvGroup", "flag_loc", "typed_flag"]

#: Where :class:`ArgvGroup` keeps the command line in ``ctx.meta``.
_ARGV: Final = "tiffany.argv"

#: A request's fields that a command's options fill: field -> option (parameter name).
_FIELD_OPTIONS: Final = {
    "inputs": "inputs",
    "from_step": "from_step",
    "payload": "data",
    "signal_id": "signal_id",
    "Idempotency-Key": "key",
    "idempotency_key": "key",
    "url": "url",
}


class ArgvGroup(TyperGroup):
    """The root group: keeps the command line for :func:`typed_flag`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Keep ``args`` in ``ctx.meta``, then parse them as usual."""
        ctx.meta[_ARGV] = tuple(args)
        return list(super().parse_args(ctx, args))


def _param(ctx: typer.Context, name: str) -> Any:
    return next((p for p in ctx.command.params if p.name == name), None)


def typed_flag(
    ctx: typer.Context | None, name: str, value: Callable[[str], bool] | None = None
) -> str:
    """The option ``name`` (a parameter name) as the user gave it.

    Args:
        ctx: The command's context (None: the option's first spelling is named).
        name: The parameter's name (``inputs`` for ``--input/-i``).
        value: Which of a repeatable option's values is at fault: the
            spelling it was given with is named.

    Returns:
        ``-i`` or ``--input`` (as typed), or the environment variable the
        value came from (``TIFFANY_URL``).
    """
    param = _param(ctx, name) if ctx is not None else None
    if param is None:
        return f"--{name.replace('_', '-')}"
    source = ctx.get_parameter_source(name) if ctx is not None else None
    if source is not None and source.name == "ENVIRONMENT" and isinstance(param.envvar, str):
        return str(param.envvar)
    spellings: list[str] = sorted(param.opts, key=len, reverse=True)  # --input before -i
    argv: Sequence[str] = ctx.meta.get(_ARGV, ()) if ctx is not None else ()
    found: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            break
        for opt in spellings:
            given = _given(token, opt, argv[i + 1] if i + 1 < len(argv) else None)
            if given is not None and (value is None or value(given)):
                return opt
            if given is not None:
                found.append(opt)
                break
    return found[0] if found else str(param.opts[0])


def _given(token: str, opt: str, following: str | None) -> str | None:
    """The value ``token`` gives the option spelt ``opt`` (None: it does not name it)."""
    if token == opt:
        return following if following is not None else ""
    if opt.startswith("--"):
        return token[len(opt) + 1 :] if token.startswith(opt + "=") else None
    return token[len(opt) :] if token.startswith(opt) and not token.startswith("--") else None


def flag_loc(ctx: typer.Context | None, loc: str) -> str | None:
    """A refusal's field path as the command line gave it, or None (not an option's).

    ``inputs.nope`` is ``--input nope`` (``-i nope`` if so typed),
    ``from_step`` is ``--from``, ``payload.a`` is ``--data a``; a path under
    ``body.`` or ``header.`` (the HTTP API's) is read without it.
    """
    if ctx is None:
        return None
    head, _, rest = loc.removeprefix("body.").removeprefix("header.").partition(".")
    option = _FIELD_OPTIONS.get(head)
    if option is None or _param(ctx, option) is None:
        return None
    if option == "inputs" and rest:  # the --input that named it
        key = rest.split(".", 1)[0].split("[", 1)[0]
        flag = typed_flag(ctx, option, lambda v: v.partition("=")[0] == key)
    else:
        flag = typed_flag(ctx, option)
    return f"{flag} {rest}" if rest else flag
