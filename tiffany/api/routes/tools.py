"""``/api/tools``: the tools the engine runs, with the JSON Schemas of their args and outputs.

Where the answer comes from: the engine, over the control channel (op
``tools``). The API process never imports the tools (the layering rule:
``tiffany.api`` imports no ``tiffany.agents``), and only the engine knows
which tools it enabled: ``tiffany serve --enable-tool NAME`` passes the list
to its engines through ``TIFFANY_ENABLED_TOOLS``, but an engine started on
its own (``tiffany engine --enable-tool shell``) may differ from the API's
settings. With several engines (``serve --engines N``, one environment) the
first that answers speaks for all; with none reachable the answer is a 503.

The schemas are the tools' pydantic models (``Args``, ``Output``): plan
validation at submission checks a step's arguments against the same models,
so what this lists is what a 422 is judged by.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from tiffany.api.deps import State
from tiffany.api.schemas import ErrorBody
from tiffany.errors import TiffanyError

__all__ = ["ToolInfo", "ToolList", "router"]

#: How long the engine may take to answer, in seconds.
TOOLS_TIMEOUT_S: Final = 5.0

router = APIRouter(prefix="/api/tools", tags=["tools"])


class ToolInfo(BaseModel):
    """One enabled tool: what a plan step may call."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="What a step's ``tool`` names.")
    description: str = Field(description="The first line of the tool's documentation.")
    durable: bool = Field(
        description=(
            "True: its result is journaled as one durable step (a replay never calls it "
            "again); False: it runs inside the step's worker task, journaled call by call."
        )
    )
    args: dict[str, Any] = Field(description="JSON Schema of the step's ``args``.")
    output: dict[str, Any] = Field(description="JSON Schema of the step's output.")


class ToolList(BaseModel):
    """The engine's tools: enabled ones with their schemas, disabled ones by name."""

    model_config = ConfigDict(extra="allow")

    tools: list[ToolInfo]
    disabled: list[str] = Field(
        description="Tools this server has but does not run (``--enable-tool NAME`` enables one)."
    )
    python_functions: list[str] = Field(
        default_factory=list,
        description="Functions the ``python`` tool may call (registered on the engine).",
    )


class ToolNotFound(TiffanyError):
    """No tool of this name on the engine (HTTP 404)."""

    code = "tool.not_found"
    http_status = 404


async def _ask(state: State) -> dict[str, Any]:
    return await state.engines.commands.tools(TOOLS_TIMEOUT_S)


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
    503: {"model": ErrorBody, "description": "No engine is reachable."},
}


@router.get("", response_model=ToolList, responses=_ERRORS)
async def list_tools(state: State) -> dict[str, Any]:
    """The enabled tools with the JSON Schemas of their args and outputs; the disabled names."""
    return await _ask(state)


@router.get(
    "/{name}",
    response_model=ToolInfo,
    responses={404: {"model": ErrorBody, "description": "No such tool, or disabled."}, **_ERRORS},
)
async def get_tool(name: str, state: State) -> dict[str, Any]:
    """One enabled tool; a disabled one is a 404 that says how to enable it."""
    answer = await _ask(state)
    for tool in answer.get("tools", []):
        if tool.get("name") == name:
            return dict(tool)
    if name in answer.get("disabled", []):
        raise ToolNotFound(
            f"tool {name!r} is disabled on this server: start it with --enable-tool {name} "
            f"(or add {name} to TIFFANY_ENABLED_TOOLS)",
            tool=name,
            disabled=True,
        )
    known = sorted([t.get("name") for t in answer.get("tools", [])] + answer.get("disabled", []))
    raise ToolNotFound(f"unknown tool {name!r} (known: {', '.join(known)})", tool=name)
