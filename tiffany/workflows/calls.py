"""The run-level calls a workflow yields: ``tool``, ``signal``, ``child``, ``patched``.

Each is called in the workflow's code and yielded at once::

    summary = yield tool("llm", prompt="...")
    ok = yield signal("approve", schema={...}, timeout_s=3600)
    out = yield child("triage", {"repo": "x"})
    if (yield patched("retry-v2")): ...

``tool``, ``signal`` and ``child`` return a nested coroutine (the kernel
trampolines it) built from the machinery plans use, so a workflow's tool
call, signal wait and child run are journaled and replayed exactly as a
plan step's are:

* ``tool``: the plan worker's attempts (``agents.worker.tool_call``): the
  arguments checked against the tool's model, the tool run as a tool task
  or a ready-made step, its result journaled. A failure raises
  :class:`ToolFailed` at the yield (the workflow may catch it).
* ``signal``: the ``signal.wait`` tool's wait (a journaled ``Receive``), so
  ``POST /api/runs/{id}/signals/{name}`` and the run's ``waiting`` status
  work as for plans. A schema is told to the engine when the wait is
  reached (a payload sent later is refused with a 422 naming the field);
  a payload kept from before the wait is checked when taken
  (:class:`SignalPayloadInvalid` at the yield).
* ``child``: ``plan.run``'s child runs (``engine/children.py``): started by
  an inline durable step, its end received as the engine's own signal;
  cancelled with its parent.
* ``patched``: the kernel's :class:`~tiffany.kernel.Patched` marker.

How a call finds its run: the workflow's root task carries a
:class:`WorkflowContext` in ``Task.context``, which the tasks it spawns
inherit; a call reads it from :func:`~tiffany.kernel.current_task` when
the workflow's code calls it (no dispatch, no record).

Each coroutine is named after the call and a digest of its arguments
(``tool:llm#1a2b3c4d``): the journal records that name with the dispatch,
so a replay whose code calls another tool, or the same with other
arguments, diverges at that yield, naming it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tiffany.agents.budget import Ledger
from tiffany.agents.tools.base import ToolContext
from tiffany.agents.tools.signal import RunSignals, SignalWaitArgs, SignalWaitTool
from tiffany.agents.tools.subplan import ChildRefused, SubPlanFailed, child_run_id
from tiffany.agents.worker import AgentEnv, tool_call
from tiffany.errors import TiffanyError
from tiffany.kernel import Coroutine, Patched, Receive, Step, current_task
from tiffany.wire.plan import StepSpec
from tiffany.wire.records import CHILD_SIGNAL_PREFIX
from tiffany.wire.values import ENCODE_ERRORS, canonical

__all__ = [
    "ChildFailed",
    "SignalPayloadInvalid",
    "ToolFailed",
    "WorkflowCallError",
    "WorkflowContext",
    "child",
    "patched",
    "signal",
    "tool",
]


class WorkflowCallError(TiffanyError):
    """A run-level call made wrongly: outside a workflow, or with bad arguments."""

    code = "workflow.call"


class ToolFailed(TiffanyError):
    """A workflow's ``tool(...)`` call failed; ``error`` holds the tool's error."""

    code = "workflow.tool_failed"
    outcome = True


class SignalPayloadInvalid(TiffanyError):
    """A signal kept from before its wait does not satisfy the wait's schema."""

    code = "signal.payload_invalid"
    outcome = True


class ChildFailed(SubPlanFailed):
    """A workflow's child run failed or was cancelled, or could not start."""

    code = "workflow.child_failed"


@dataclass(slots=True)
class WorkflowContext:
    """What a workflow run's calls need: the engine's env, the run, a call counter."""

    env: AgentEnv
    run_id: str
    workflow: str
    #: ``tool`` and ``child`` calls so far (in dispatch order: deterministic).
    calls: int = 0
    #: The waits (name and schema digest) told to the engine already: a wait
    #: in a loop is told once, not once per turn.
    told: set[str] = field(default_factory=set)
    #: The run's budget ledger (``tiffany/agents/budget.py``), or None: no budget.
    ledger: Ledger | None = None

    def next_call(self, what: str) -> str:
        """The id of the run's next tool or child call (``tool_3``, ``child_4``)."""
        self.calls += 1
        return f"{what}_{self.calls}"

    def tool_context(self, step_id: str) -> ToolContext:
        """A tool's view of where it runs (the run's workspace, the engine's registry)."""
        env = self.env
        return ToolContext(
            self.run_id,
            step_id,
            1,
            env.workspace_root / self.run_id,
            env.settings,
            lambda kind, data: env.emit(self.run_id, kind, {"step": step_id, **data}),
            env.runs,
            env.registry,
            memory=env.memory,
        )


def context(what: str) -> WorkflowContext:
    """The calling workflow task's context.

    Raises:
        WorkflowCallError: Not called from a workflow's task (or a task it spawned).
    """
    task = current_task()
    ctx = task.context if task is not None else None
    if not isinstance(ctx, WorkflowContext):
        raise WorkflowCallError(
            f"{what} is a workflow's call: call it in a @workflow function (or a task it "
            "spawned) and yield it at once (x = yield {what})".replace("{what}", what)
        )
    return ctx


def _digest(value: Any) -> str:
    """8 hex digits of ``value``'s journaled bytes (its type's name if it has none)."""
    try:
        data = canonical(value)
    except ENCODE_ERRORS:
        data = type(value).__name__.encode()
    return hashlib.sha256(data).hexdigest()[:8]


def _named(gen: Coroutine, name: str) -> Coroutine:
    gen.__qualname__ = name  # type: ignore[attr-defined]  # the journal records it (docstring)
    return gen


def tool(name: str, /, **args: Any) -> Coroutine:
    """Call tool ``name`` with ``args``; yield it to get its output.

    Any tool the server has (``GET /api/tools``); a tool the server does not
    enable is held until an engine that enables it runs the run, as a plan's
    step is. Raises :class:`ToolFailed` at the yield when the tool fails
    (bad arguments included: their fields are named).
    """
    ctx = context("tool()")
    if not isinstance(name, str) or not name:
        raise WorkflowCallError(f"tool(): the tool's name must be a string, got {name!r}")
    step_id = ctx.next_call("tool")
    spec = StepSpec(id=step_id, tool=name, args=args)
    return _named(_tool(ctx, spec), f"tool:{name}#{_digest(args)}")


def _tool(ctx: WorkflowContext, spec: StepSpec) -> Coroutine:
    outcome = yield tool_call(ctx.env, ctx.run_id, spec, ledger=ctx.ledger)
    ctx.env.call_ended(ctx.run_id, spec.id, spec.tool, outcome)  # its spans (observe/otel.py)
    if outcome.ok:
        return outcome.output
    error = outcome.error or {}
    raise ToolFailed(
        f"tool {spec.tool} ({spec.id} of run {ctx.run_id}) failed: {error.get('message')}",
        tool=spec.tool,
        call=spec.id,
        error_code=str(error.get("code") or error.get("type") or ""),
    )


def signal(
    name: str, schema: Mapping[str, Any] | None = None, timeout_s: float | None = None
) -> Coroutine:
    """Wait for signal ``name`` sent to the run; yield it to get its payload.

    ``schema``: a JSON Schema the payload must satisfy. ``timeout_s``: raise
    ``SignalTimeout`` (code ``signal.timeout``) at the yield if none came by
    then (a durable timer: it counts across restarts).
    """
    ctx = context("signal()")
    raw = {"name": name, "schema": None if schema is None else dict(schema), "timeout_s": timeout_s}
    try:
        args = SignalWaitArgs.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or "name"
        raise WorkflowCallError(f"signal(): {field}: {first['msg']}", field=field) from None
    waits: RunSignals | None = None
    digest = _digest(raw)
    if schema is not None:
        wait = {"id": f"signal:{name}", "tool": SignalWaitTool.name, "args": raw}
        waits = RunSignals.of_steps([wait], {})
        if digest not in ctx.told:  # the engine refuses a payload sent from now on
            ctx.told.add(digest)
            ctx.env.steps_added(ctx.run_id, [wait])
    return _named(_signal(ctx, args, waits), f"signal:{name}#{digest}")


def _signal(ctx: WorkflowContext, args: SignalWaitArgs, waits: RunSignals | None) -> Coroutine:
    payload = yield from SignalWaitTool().run(args, ctx.tool_context(f"signal:{args.name}"))
    if waits is not None:
        refused = waits.refusal(args.name, payload)
        if refused is not None:
            raise SignalPayloadInvalid(refused[0], signal=args.name)
    return payload


def child(target: str | Mapping[str, Any], inputs: Mapping[str, Any] | None = None) -> Coroutine:
    """Start a child run and wait for it to end; yield it to get the child's outputs.

    ``target``: a registered workflow's name, or a plan (a dict). The child
    is cancelled with its parent. Raises :class:`ChildFailed` at the yield
    when the child fails or is cancelled, or the engine refuses it (a
    bound on child runs: the code names the setting).
    """
    ctx = context("child()")
    if isinstance(target, str):
        what = target
    elif isinstance(target, Mapping):
        what = str(target.get("name") or "plan")
        target = dict(target)
    else:
        raise WorkflowCallError(
            f"child(): the child must be a workflow's name or a plan (a dict), got {target!r}"
        )
    if inputs is not None and not isinstance(inputs, Mapping):
        raise WorkflowCallError(f"child(): inputs must be a dict, got {inputs!r}")
    given = dict(inputs or {})
    step = ctx.next_call("child")
    gen = _child(ctx, step, child_run_id(ctx.run_id, step, 1), target, given)
    return _named(gen, f"child:{what}#{_digest([target, given])}")


def _start(runs: Any, parent: str, step: str, child_id: str, target: Any, inputs: Any) -> Any:
    """Start the child (an inline step: on the loop, once its record is durable)."""
    if runs is None:
        raise ChildFailed("this engine cannot start child runs")
    return runs.start_child(parent, step, child_id, target, inputs)


def _child(
    ctx: WorkflowContext, step: str, child_id: str, target: Any, inputs: dict[str, Any]
) -> Coroutine:
    # The engine is reached inside the step only: a replay does not start the child again.
    started = yield Step(
        _start, ctx.env.runs, ctx.run_id, step, child_id, target, inputs, name="child", inline=True
    )
    if isinstance(started, Mapping) and started.get("error") is not None:
        raise ChildFailed(f"child run {child_id}: {started['error']}", child=child_id)
    if isinstance(started, Mapping) and isinstance(started.get("refused"), Mapping):
        raise ChildRefused(started["refused"], child=child_id)
    ctx.env.emit(ctx.run_id, "tool.output", {"step": step, "child_run": child_id})
    end = yield Receive(CHILD_SIGNAL_PREFIX + child_id)
    end = end if isinstance(end, Mapping) else {}
    status = end.get("status")
    if status != "succeeded":
        raise ChildFailed(
            f"child run {child_id} {status}: {end.get('error')}", child=child_id, status=str(status)
        )
    return end.get("outputs")


def patched(patch_id: str) -> Patched:
    """A version marker: yield it for True in new runs, False in runs recorded before it.

    ``if (yield patched("fix-1")): new code else: old code``: a run that
    started before the deploy replays the old path; a new run, or a run that
    recorded the marker, takes the new one. The marker is journaled.
    """
    if not isinstance(patch_id, str) or not patch_id:
        raise WorkflowCallError(f"patched(): the id must be a non-empty string, got {patch_id!r}")
    return Patched(patch_id)
