"""``plan.run``: run another plan as a child run of this one; output its outputs.

``{"tool": "plan.run", "args": {"plan": {...}, "inputs": {...}}}`` starts a
child run (its own run, journal and store rows, linked both ways: the
child's entry names its ``parent`` run and step, and its id is
``<parent run>.<step>.<attempt>``, or ``<parent run>.<step>.<attempt>.<call>``
for the ``call``-th tool call of an ``agent`` step, so that each call has a
child of its own), waits for it to end, and outputs the child's
``outputs``; a child that fails or is cancelled fails the step (its
``retries`` start a new child). ``plan`` may also be a path to a JSON or
YAML file in the run's workspace (written by an earlier step).

How it stays durable: the child is started by an inline durable step (its
record says the child started, so neither a replay nor a recovery starts
it twice), and its end reaches the parent as a journaled signal
(``child:<child run id>``) that the parent's step receives. That name is in
the engine's reserved namespace (``tiffany.wire.records.RESERVED_SIGNAL_PREFIXES``):
the engine sends it from the child's own end, through a path no client
request reaches; a client's ``child:...`` signal is refused. A parent that
ends (cancelled, or failed by another step) has the engine cancel its
children still running (``tiffany/engine/children.py``).

Bounds: the engine refuses a child past ``max_child_depth``,
``max_children`` or ``max_descendants``, or under a run being cancelled;
the step then fails with the refusal's code (``limit.max_child_depth``...,
``plan.tree_closed``), which names the setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Protocol

from pydantic import Field

from tiffany.agents.tools.base import FreeFormOutput, ToolArgs, ToolContext, ToolError
from tiffany.agents.tools.workspace import open_in_workspace
from tiffany.kernel import Coroutine, Receive, Step
from tiffany.wire.documents import DocumentError, load
from tiffany.wire.records import CHILD_SIGNAL_PREFIX

__all__ = [
    "CHILD_SIGNAL_PREFIX",
    "ChildRefused",
    "ChildRuns",
    "PlanRunArgs",
    "PlanRunOutput",
    "PlanRunTool",
    "SubPlanFailed",
    "child_run_id",
]

#: Largest plan file ``plan.run`` reads from the workspace.
MAX_PLAN_FILE_BYTES: Final = 1 << 20


class SubPlanFailed(ToolError):
    """The child run did not succeed (failed or cancelled), or its plan is invalid."""

    code = "plan.child_failed"


class ChildRefused(ToolError):
    """The engine refused to start the child: a bound on child runs, or a tree being cancelled.

    Its ``code`` is the refusal's (``limit.max_child_depth``, ``limit.max_children``,
    ``limit.max_descendants``, ``plan.tree_closed``); its fields name the setting.
    """

    code = "plan.child_refused"

    def __init__(self, refusal: Mapping[str, Any], **fields: Any) -> None:
        extra = {k: v for k, v in refusal.items() if k not in ("code", "message")}
        super().__init__(str(refusal.get("message")), **extra, **fields)
        self.code = str(refusal.get("code") or self.code)


class ChildRuns(Protocol):
    """What the engine offers ``plan.run`` (``tiffany.engine``): both run on the loop."""

    def start_child(
        self, parent: str, step: str, child: str, plan: Any, inputs: Any
    ) -> dict[str, Any]:
        """Start run ``child`` of ``plan`` (no-op if it exists).

        Returns ``{"run_id"}``, ``{"error"}`` (an invalid plan) or
        ``{"refused": {"code", "message", ...}}`` (a bound, a closed tree).
        """
        ...


class PlanRunArgs(ToolArgs):
    """Arguments of ``plan.run``: the child's ``plan`` (or a workspace path) and ``inputs``."""

    plan: dict[str, Any] | str = Field(description="A plan, or a plan file in the workspace.")
    inputs: dict[str, Any] = Field(default_factory=dict, description="The child run's inputs.")


class PlanRunOutput(FreeFormOutput):
    """Free-form: the child run's outputs, shaped by the child plan's ``outputs``."""


def child_run_id(parent: str, step: str, attempt: int, call: int | None = None) -> str:
    """The id of the child run a ``plan.run`` step's attempt (or its agent's ``call``) starts.

    Unambiguous: a step id starts with a letter or ``_``, an attempt and a
    call are numbers, so ``p.s.1.2`` (call 2) is never ``p.s.1``'s grandchild.
    """
    base = f"{parent}.{step}.{attempt}"
    return base if call is None else f"{base}.{call}"


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
        child = child_run_id(ctx.run_id, ctx.step_id, ctx.attempt, ctx.call)
        # The engine is reached inside the steps only: a replay calls neither.
        started = yield Step(_start, ctx, child, plan, args.inputs, name="plan.run", inline=True)
        if isinstance(started, Mapping) and started.get("error") is not None:
            raise SubPlanFailed(f"the child plan is invalid: {started['error']}", child=child)
        if isinstance(started, Mapping) and isinstance(started.get("refused"), Mapping):
            raise ChildRefused(started["refused"], child=child)
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
