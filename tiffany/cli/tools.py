"""``tiffany tools [NAME] [--json]``: the tools a server runs, with their args and outputs.

Where the list comes from: the engine serving this data dir, over its
control socket (op ``tools``: what ``GET /api/tools`` answers), when one is
up; otherwise the tools a server started with these settings would enable
(``TIFFANY_ENABLED_TOOLS``, default: all but ``shell``), said so on stderr.
``--enable-tool NAME`` counts a tool as enabled in that offline listing, as
``tiffany serve --enable-tool NAME`` would.

Exit codes: 0 listed; 1 ``NAME`` is not an enabled tool (disabled: the
message gives the fix; unknown: the known names).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tiffany.cli import DataDirOption, exits

__all__ = ["register"]


def _listing(ctx: typer.Context, enable_tool: list[str]) -> tuple[dict[str, Any], str | None]:
    """The engine's answer, or the local one and a note saying where it comes from."""
    from tiffany.cli import _settings
    from tiffany.wire.control import ControlError, ControlUnavailable, call

    settings = _settings(ctx)
    if not enable_tool:
        try:
            return call(settings.data_dir, "tools", timeout=10.0), None
        except (ControlUnavailable, ControlError):
            pass  # no engine here (or an older one without the op): list locally
    from tiffany.agents.registry import ToolRegistry

    every = ToolRegistry.default().all_names()
    enabled = [n for n in dict.fromkeys([*settings.enabled_tools, *enable_tool]) if n in every]
    note = (
        f"no engine serving {settings.data_dir}: listing the tools a server started "
        "with these settings enables"
    )
    return ToolRegistry.default(enabled=enabled).describe(), note


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " | ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"list[{_type(schema.get('items', {}))}]"
    return str(kind) if kind else "any"


def _fields(title: str, schema: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("type")
    table.add_column("required")
    table.add_column("default")
    table.add_column("description")
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        default = json.dumps(prop["default"]) if "default" in prop else ""
        table.add_row(
            name,
            _type(prop),
            "yes" if name in required else "",
            default,
            prop.get("description", ""),
        )
    return table


def tools(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Show this tool's args and output.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The JSON Schemas, as JSON.")] = False,
    enable_tool: Annotated[
        list[str] | None,
        typer.Option(
            "--enable-tool",
            metavar="TOOL",
            help="Offline listing: count this tool as enabled too.",
        ),
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """List the enabled tools (or one tool's args and output), from the engine if one runs."""
    from rich.console import Console
    from rich.table import Table

    listing, note = _listing(ctx, enable_tool or [])
    if note:
        typer.echo(f"tiffany: {note}", err=True)
    enabled = {t["name"]: t for t in listing.get("tools", [])}
    disabled = list(listing.get("disabled", []))
    if name is not None:
        tool = enabled.get(name)
        if tool is None:
            if name in disabled:
                msg = (
                    f"tool {name!r} is disabled on this server: start it with "
                    f"--enable-tool {name} (or add {name} to TIFFANY_ENABLED_TOOLS)"
                )
                code = exits.FAILED
            else:
                from tiffany.agents.plan import unknown_tool_message

                msg = unknown_tool_message(name, [*enabled, *disabled])
                code = exits.NOT_FOUND
            typer.echo(f"tiffany: {msg}", err=True)
            raise typer.Exit(code)
        if as_json:
            typer.echo(json.dumps(tool, indent=2))
            return
        console = Console()
        durable = "durable step" if tool["durable"] else "runs in the worker task"
        console.print(f"[bold]{name}[/bold]: {tool['description']} ({durable})")
        console.print(_fields("args", tool["args"]))
        output = tool["output"]
        if output.get("type") == "object":
            console.print(_fields("output", output))
        else:
            console.print(f"output: {output.get('description', 'free-form')}")
        return
    if as_json:
        typer.echo(json.dumps(listing, indent=2))
        return
    table = Table(title="enabled tools", title_justify="left")
    table.add_column("tool", style="bold")
    table.add_column("args (* required)")
    table.add_column("description")
    for tool in listing.get("tools", []):
        required = set(tool["args"].get("required", []))
        args = ", ".join(
            f"{field}*" if field in required else field for field in tool["args"]["properties"]
        )
        table.add_row(tool["name"], args, tool["description"])
    console = Console()
    console.print(table)
    if disabled:
        console.print(
            f"disabled: {', '.join(disabled)} (enable one with --enable-tool NAME "
            "on serve, or TIFFANY_ENABLED_TOOLS)"
        )
    functions = listing.get("python_functions") or []
    if functions:
        console.print(f"python functions: {', '.join(functions)}")


def register(app: typer.Typer) -> None:
    """Add ``tools`` to the root app."""
    app.command("tools")(tools)
