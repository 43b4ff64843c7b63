"""``plan.run``: run another plan as a child run of this one; output its outputs.

``{"tool": "plan.run", "args": {"plan": {...}, "inputs": {...}}}`` starts a
child run (its own run, journal and store rows, linked both ways: the
child's entry names its ``parent`` run and step, and its id is
``<parent run>.<step>.<attempt>``), waits for it to end, and outputs the
child's ``outputs``; a child that fails or is cancelled fails the step (its
``retries`` start a new child). ``plan`` may also be a path to a JSON or
YAML file in the run's workspace (written by an earlier step).

How it stays durable: the child is started by an inline durable step (its
record says the child started, so neither a replay nor a recovery starts
it twice), and its end reaches the parent as a journaled signal
(``child:<child run id>``) that the parent's step receives. A parent that
ends (cancelled, or failed by another step) has the engine cancel its
children still running (``tiffany/engine/__init__.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Protocol

from pydantic import Field

from tiffany.agents.tools.base import FreeFormOutput, ToolArgs, ToolContext, ToolError
from tiffany.agents.tools.workspace import open_in_workspace
from tiffany.documents import DocumentError, load
from tiffany.kernel import Coroutine, Receive, Step

__all__ = [
    "CHILD_SIGNAL_PREFIX",
    "ChildRuns",
    "PlanRunArgs",
    "PlanRunOutput",
    "PlanRunTool",
    "SubPlanFailed",
    "child_run_id",
]

#: A child run's end reaches its parent as the signal ``child:<child run id>``.
CHILD_SIGNAL_PREFIX: Final = "child:"
#: Largest plan file ``plan.run`` reads from the workspace.
MAX_PLAN_FILE_BYTES: Final = 1 << 20


class SubPlanFailed(ToolError):
    """The child run did not succeed (failed or cancelled), or its plan is invalid."""

    code = "plan.child_failed"


class ChildRuns(Protocol):
    """What the engine offers ``plan.run`` (``tiffany.engine``): both run on the loop."""

    def start_child(
        self, parent: str, step: str, child: str, plan: Any, inputs: Any
    ) -> dict[str, Any]:
        """Start run ``child`` of ``plan`` (no-op if it exists); ``{"run_id"}`` or ``{"error"}``."""
        ...


class PlanRunArgs(ToolArgs):
    """Arguments of ``plan.run``: the child's ``plan`` (or a workspace path) and ``inputs``."""

    plan: dict[str, Any] | str = Field(description="A plan, or a plan file in the workspace.")
    inputs: dict[str, Any] = Field(default_factory=dict, description="The child run's inputs.")


class PlanRunOutput(FreeFormOutput):
    """Free-form: the child run's outputs, shaped by the child plan's ``outputs``."""


def child_run_id(parent: str, step: str, attempt: int) -> str:
    """The id of the child run a ``plan.run`` step's attempt starts."""
    return f"{parent}.{step}.{attempt}"


def _read_plan(ctx: ToolContext, path: str) -> Any:
    """A plan file from the run's workspace (a thread step: blocking I/O)."""
    fd = open_in_workspace(ctx.workspace, path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_PLAN_FILE_BYTES + 1)
    if len(data) > MAX_PLAN_FILE_BYTES:
        raise SubPlanFailed(f"plan file {path} is over {MAX_PLAN_FILE_BYTES} bytes", path=path)
    yaml = path.endswith((".yaml", ".yml"))
    try:
        return load(data, "application/yaml" if yaml else "application/json", loc=["plan"])
    except DocumentError as exc:
        raise SubPlanFailed(f"plan file {path}: {exc.msg}", path=path) from None


def _runs(ctx: ToolContext) -> ChildRuns:
    if ctx.runs is None:
        raise SubPlanFailed("this engine cannot start child runs")
    runs: ChildRuns = ctx.runs
    return runs


def _start(ctx: ToolContext, child: str, plan: Any, inputs: Any) -> dict[str, Any]:
    """Start the child run (an inline step: on the loop, once its record is durable)."""
    return _runs(ctx).start_child(ctx.run_id, ctx.step_id, child, plan, inputs)


class PlanRunTool:
    """Run a child plan; output its outputs."""

    name: ClassVar[str] = "plan.run"
    Args: ClassVar[type[ToolArgs]] = PlanRunArgs
    Output: ClassVar[type[FreeFormOutput]] = PlanRunOutput
    durable: ClassVar[bool] = False

    def run(self, args: PlanRunArgs, ctx: ToolContext) -> Coroutine:
        """Start the child (a durable inline step), then receive its end (a signal)."""
        plan = args.plan
        if isinstance(plan, str):
            plan = yield Step(_read_plan, ctx, plan, name="plan.read")
        child = child_run_id(ctx.run_id, ctx.step_id, ctx.attempt)
        # The engine is reached inside the steps only: a replay calls neither.
        started = yield Step(_start, ctx, child, plan, args.inputs, name="plan.run", inline=True)
        if isinstance(started, Mapping) and started.get("error") is not None:
            raise SubPlanFailed(f"the child plan is invalid: {started['error']}", child=child)
        ctx.emit("tool.output", {"child_run": child})
        end = yield Receive(CHILD_SIGNAL_PREFIX + child)
        end = end if isinstance(end, Mapping) else {}
        status = end.get("status")
        if status != "succeeded":
            raise SubPlanFailed(
                f"child run {child} {status}: {end.get('error')}",
                child=child,
                status=str(status),
            )
        return end.get("outputs")
