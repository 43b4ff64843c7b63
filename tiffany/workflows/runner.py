"""A workflow run: its entry (RUN_START), its resolver, and its root task.

The entry is ``{"kind": "workflow", "workflow": NAME, "inputs": {...}}``;
the durable runtime rebuilds the run's root from it with
:func:`workflow_resolver`, whether it starts the run, resumes it at engine
start or replays it (``tiffany replay RUN --verify --import MOD``).

One runtime: a plan run is the built-in workflow ``plan`` (:data:`PLAN`),
whose root is the planner (``tiffany/agents/planner.py``) given the plan
document and its inputs. Its entry stays ``{"kind": "plan", "plan", "inputs",
...}`` (``tiffany/wire/entries.py`` reads it as workflow ``plan``), so the
journals of every release replay byte for byte, and one resolver, this
module's, rebuilds the root of every plan and workflow run. The planner is
its root as it always was (no wrapper task, no dispatch of its own): a plan
run's dispatch sequence is unchanged.

The root task (:func:`run_workflow`) gives itself the run's
:class:`~tiffany.workflows.calls.WorkflowContext` (its children inherit
it), calls the user's function with the inputs and delegates to its
generator (``yield from``: no dispatch of its own, so renaming the function
changes nothing in the journal; the user's frames are the task's, and a
divergence names the user's line). Its result is ``{"outputs": <the returned dict>}``,
the shape a plan run's result has, so the store, the API and a parent's
``child(...)`` read a workflow run's outputs as they read a plan's.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, cast

from tiffany.agents.budget import Ledger
from tiffany.agents.plan import MAX_STEPS
from tiffany.agents.planner import run_plan
from tiffany.agents.worker import AgentEnv
from tiffany.errors import TiffanyError
from tiffany.kernel import Coroutine, Receive, current_task
from tiffany.wire.documents import DocumentError, check
from tiffany.wire.entries import PLAN_WORKFLOW, Entry, PlanEntry, WorkflowEntry, read_entry
from tiffany.wire.plan import BudgetSpec
from tiffany.wire.records import SLOT_SIGNAL
from tiffany.workflows.calls import WorkflowContext
from tiffany.workflows.registry import UnknownWorkflow, Workflow, builtin, input_problems, lookup

__all__ = [
    "PLAN",
    "WorkflowInputError",
    "WorkflowResultError",
    "prepare_workflow",
    "run_workflow",
    "workflow_entry",
    "workflow_resolver",
]


class WorkflowInputError(TiffanyError):
    """A submission's workflow or inputs are refused; ``errors`` are its 422 items."""

    code = "workflow.inputs"

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" for e in errors), count=len(errors))


class WorkflowResultError(TiffanyError):
    """A workflow returned something that cannot be a run's outputs (the run fails)."""

    code = "workflow.result"
    outcome = True


def workflow_entry(name: str, inputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return the run entry (journaled in RUN_START) of workflow ``name`` with ``inputs``."""
    return {"kind": "workflow", "workflow": name, "inputs": dict(inputs or {})}


def prepare_workflow(name: Any, inputs: Any) -> tuple[dict[str, Any], str]:
    """Check a submission of workflow ``name``: return its run entry and the run's name.

    Pure (any thread). The inputs' JSON-ness is checked by the caller
    (``tiffany.wire.documents``, as every submission's).

    Raises:
        WorkflowInputError: An unknown workflow (``loc`` ``workflow``: the
            registered names and how to register one), inputs that are not
            an object or that its signature refuses (``inputs.NAME``).
    """
    if not isinstance(name, str):
        raise WorkflowInputError([{"loc": "workflow", "msg": "must be a workflow's name"}])
    if name == PLAN_WORKFLOW:  # one way to submit a plan: its entry records the document
        msg = (
            "the built-in workflow 'plan' is submitted as a plan: send "
            '{"plan": DOCUMENT, "inputs": {...}}, not {"workflow": "plan"}'
        )
        raise WorkflowInputError([{"loc": "workflow", "msg": msg}])
    try:
        wf = lookup(name)
    except UnknownWorkflow as exc:
        raise WorkflowInputError([{"loc": "workflow", "msg": exc.message}]) from None
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, Mapping):
        raise WorkflowInputError([{"loc": "inputs", "msg": "inputs must be a JSON object"}])
    problems = input_problems(wf, inputs)
    if problems:
        raise WorkflowInputError(problems)
    entry = workflow_entry(name, inputs)
    if wf.concurrency is not None:  # resolved now, as a plan's key (engine.prepare_plan)
        from tiffany.agents.concurrency import entry_concurrency
        from tiffany.agents.refs import RefError

        values = {**(wf.defaults or {}), **inputs}
        try:
            entry["concurrency"] = entry_concurrency(wf.concurrency, values)
        except RefError as exc:
            raise WorkflowInputError([{"loc": "concurrency.key", "msg": exc.message}]) from None
    if wf.budget is not None:  # in the entry, as a plan's is in its plan: a replay reads it
        entry["budget"] = wf.budget.model_dump(exclude_none=True)
    return entry, name


def plan_root(env: AgentEnv, run_id: str, entry: Entry, compat: int) -> Coroutine:
    """The built-in workflow ``plan``'s root: the planner, given the entry's plan and inputs.

    Raises:
        UnknownWorkflow: ``entry`` is not a plan run's (a workflow entry
            naming ``plan``: no user's workflow has that name).
    """
    if not isinstance(entry, PlanEntry):
        raise UnknownWorkflow(
            f"workflow {PLAN_WORKFLOW!r} runs plan entries only", workflow=PLAN_WORKFLOW
        )
    return run_plan(
        env,
        run_id,
        entry.plan,
        entry.inputs,
        compat,
        entry.reuse,
        entry.rerun_source,
        entry.concurrency is not None,
        entry.max_steps or MAX_STEPS,
    )


#: The built-in workflow ``plan``: its inputs are the plan document and the plan's inputs.
PLAN: Workflow = builtin(
    Workflow(PLAN_WORKFLOW, run_plan, ("plan", "inputs"), ("plan",), False, root=plan_root)
)


def workflow_resolver(env: AgentEnv) -> Callable[[Entry, str, int], Coroutine]:
    """Return the runtime resolver that rebuilds a plan or workflow run's root task.

    Raises (when resolving) :class:`~tiffany.workflows.registry.UnknownWorkflow`
    for a workflow this process has not registered (its module not imported).
    """

    def resolve(entry: Entry | dict[str, Any], run_id: str, compat: int) -> Coroutine:
        typed = read_entry(entry)
        wf = lookup(str(typed.workflow_name))
        if wf.root is not None:  # a built-in: the planner
            return cast(Coroutine, wf.root(env, run_id, typed, compat))
        if not isinstance(typed, WorkflowEntry):
            raise UnknownWorkflow(f"a {typed.kind} run is no workflow's", workflow=wf.name)
        spend = typed.budget_spec  # a plan's is its document's: the planner reads it
        return run_workflow(
            env,
            run_id,
            wf,
            typed.inputs,
            limited=typed.concurrency is not None,
            budget=BudgetSpec.model_validate(spend) if spend is not None else None,
        )

    return resolve


def run_workflow(
    env: AgentEnv,
    run_id: str,
    wf: Workflow,
    inputs: Mapping[str, Any],
    *,
    limited: bool = False,
    budget: BudgetSpec | None = None,
) -> Generator[Any, Any, dict[str, Any]]:
    """The root task of a workflow run; returns ``{"outputs": <the function's dict>}``.

    ``limited``: the run's entry has a concurrency limit: it waits for its
    slot (the engine's signal :data:`SLOT_SIGNAL`, as a plan run's planner
    does) before the function starts. ``budget``: the entry's; its
    :class:`Ledger` is the run's ``tool(...)`` calls' (``calls.py``), and
    its totals the result's ``usage``, as a plan run's.
    """
    task = current_task()
    assert task is not None  # a root task, dispatched
    if limited:
        yield Receive(SLOT_SIGNAL)  # queued until the engine gives the run its slot
    ledger = Ledger(budget) if budget is not None else None
    task.context = WorkflowContext(env, run_id, wf.name, ledger=ledger)
    result = yield from wf.fn(**inputs)
    if not isinstance(result, dict):
        raise WorkflowResultError(
            f"workflow {wf.name} ({wf.where}) returned {type(result).__name__}: a workflow "
            "returns a dict, the run's outputs",
            workflow=wf.name,
            function=wf.where,
        )
    try:
        check(result, loc=["outputs"])
    except DocumentError as exc:
        raise WorkflowResultError(
            f"workflow {wf.name} ({wf.where}) returned outputs that are not JSON: {exc.message}",
            workflow=wf.name,
            function=wf.where,
            field=".".join(str(p) for p in exc.loc),
        ) from None
    if ledger is not None:
        return {"outputs": result, "usage": ledger.totals()}
    return {"outputs": result}
