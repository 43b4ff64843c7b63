"""The planner task (the seed's Task_Main): runs a plan's DAG.

The planner validates the plan, then repeatedly starts a worker task for
every step whose ``after`` steps are done, and waits for workers to report
through a queue (so independent steps run concurrently). A failed step
fails its dependents (skipped, with the reason) and the run, unless it says
``continue_on_error``. A step marked ``dynamic`` whose tool returns
``{"steps": [...]}`` extends the DAG while the run goes on; since the tool's
result is journaled, a replay adds the same steps without calling the tool.
The run's steps, static and dynamic, are bounded (``max_steps``, from the
run's entry: the bound it started under, so its replay decides alike): a
dynamic step whose steps would pass it fails (``limit.max_steps``), before
any of them is looked at.

Cancelling the run kills the planner: it then kills its workers (which kill
their tool tasks, which kill their subprocesses) before it ends.

The planner is deterministic: it reads time, randomness and the world only
through its workers' steps, so it replays exactly. (It drains the results
queue with plain method calls after each wait: what is queued when it runs
follows from the dispatch order, which a replay reproduces.)
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from tiffany.agents.budget import BUDGET_COMPAT, Ledger, legacy_spend
from tiffany.agents.plan import MAX_STEPS, Plan, PlanError, StepSpec, check_steps, parse_plan
from tiffany.agents.refs import RefError, resolve
from tiffany.agents.rerun import reused_origin, reused_output
from tiffany.agents.worker import AgentEnv, StepOutcome, error_info, worker
from tiffany.errors import LimitExceeded, TaskCancelled, TiffanyError
from tiffany.kernel import KillTask, NewTask, Queue, Receive, Step
from tiffany.wire.records import JOURNAL_COMPAT, SLOT_SIGNAL, TaskLabel
from tiffany.wire.status import StepStatus

__all__ = ["PlanFailed", "run_plan"]

Co = Generator[Any, Any, Any]

# Plain strings (``.value``): a step's status goes into the journal as it is.
PENDING, RUNNING, SUCCEEDED, FAILED, SKIPPED = (
    StepStatus.PENDING.value,
    StepStatus.RUNNING.value,
    StepStatus.SUCCEEDED.value,
    StepStatus.FAILED.value,
    StepStatus.SKIPPED.value,
)


class PlanFailed(TiffanyError):
    """A step failed (without ``continue_on_error``): the run fails."""

    code = "plan.failed"
    outcome = True


def run_plan(
    env: AgentEnv,
    run_id: str,
    doc: Mapping[str, Any],
    inputs: Mapping[str, Any],
    compat: int = JOURNAL_COMPAT,
    reuse: Mapping[str, Mapping[str, Any]] | None = None,
    rerun_of: str | None = None,
    limited: bool = False,
    max_steps: int = MAX_STEPS,
) -> Co:
    """The root task of a plan run; returns ``{"outputs": ..., "steps": ...}``.

    ``compat``: the journal version the run started under (its workers get it).
    ``reuse``: a re-run's steps settled from an earlier run (``rerun.py``):
    step id -> ``{"output", "run_id", "seq"}``; they succeed with that output
    as soon as they are ready, with no worker (their attempt says where from).
    ``rerun_of``: the run a re-run starts from: its workspace is copied into
    this run's first (a durable step: the files the reused steps wrote).
    ``limited``: the plan has a ``concurrency`` limit: the run waits for its
    slot (the signal :data:`SLOT_SIGNAL`) before anything else.
    ``max_steps``: the most steps the run may have, dynamic ones included
    (its entry's ``limits``; runs journaled before it was written there
    had the static bound, :data:`MAX_STEPS`).
    """
    plan, values = _plan_and_values(env, doc, inputs)
    if limited:
        yield Receive(SLOT_SIGNAL)  # queued until the engine gives the run its slot
    if rerun_of is not None:
        yield Step(env.copy_workspace, rerun_of, run_id, name="workspace.copy")
    run = _PlanRun(env, run_id, plan, values, compat, reuse or {}, max_steps)
    try:
        while True:
            for sid in run.take_ready():
                run.running[sid] = yield run.start(sid)
            if not run.running:
                break
            # One wait, then every report already queued: workers that ended
            # in the same pass cost the planner one dispatch, not one each.
            outcome: StepOutcome = yield run.results.get()
            run.report(outcome)
            while not run.results.empty():
                run.report(run.results.get_nowait())
    except TaskCancelled:
        for tid in run.running.values():
            yield KillTask(tid)
        raise
    return run.result()


def _plan_and_values(
    env: AgentEnv, doc: Mapping[str, Any], inputs: Mapping[str, Any]
) -> tuple[Plan, dict[str, Any]]:
    """The run's plan, and its inputs' values (the plan's defaults, then ``inputs``)."""
    # Validated once at submission; a replay or recovery parses it again,
    # against every tool (the engine holds a disabled tool's steps: registry.py).
    plan = env.validated_plan(doc) or parse_plan(doc, env.registry.all_names())
    unknown = sorted(set(inputs) - set(plan.inputs))
    if unknown:
        raise PlanError(
            [{"loc": f"inputs.{k}", "msg": "not an input of this plan"} for k in unknown]
        )
    return plan, {**plan.inputs, **inputs}


class _PlanRun:
    """What the planner knows of its run: the DAG, the steps' outcomes, the workers.

    The planner task (:func:`run_plan`) yields; this holds the state between
    its yields and decides, without yielding, what each report changes.
    """

    def __init__(
        self,
        env: AgentEnv,
        run_id: str,
        plan: Plan,
        values: dict[str, Any],
        compat: int,
        reuse: Mapping[str, Mapping[str, Any]],
        max_steps: int,
    ) -> None:
        self.env = env
        self.run_id = run_id
        self.plan = plan
        self.values = values
        self.compat = compat
        self.reuse = reuse
        self.dag = _Dag(max_steps)
        for spec in plan.steps:
            self.dag.add(spec)
        self.reasons: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.attempts: dict[str, list[dict[str, Any]]] = {}
        #: Step id -> the task id of its worker, while it runs.
        self.running: dict[str, int] = {}
        self.results: Queue[StepOutcome] = Queue(name=f"{run_id}.results")
        self.workspace = env.workspace_root / run_id  # made by the first tool needing it
        # A budget (plan.budget) counts the model tokens and dollars of the run's
        # steps (their outputs' "usage" and "cost_usd": llm, agent); only then is
        # "usage" part of the run's result. From version 3 on, a ledger the workers
        # share (budget.py) checks each model call before it starts and counts every
        # attempt, failed or not (old layout: see docs/wal-format.md, compatibility).
        budget = plan.budget
        self.ledger = Ledger(budget) if budget is not None and compat >= BUDGET_COMPAT else None
        self.usage: dict[str, float] | None = None
        if budget is not None and self.ledger is None:
            self.usage = {"tokens": 0, "usd": 0.0}

    def take_ready(self) -> list[str]:
        """The steps to start now; reused steps settle at once (no worker), readying others."""
        ready = self.dag.take_ready()
        if not self.reuse:
            return ready
        todo, ready = ready, []
        while todo:
            for sid in todo:
                if sid in self.reuse:
                    self._settle_reused(sid)
                else:
                    ready.append(sid)
            todo = self.dag.take_ready()
        return ready

    def _settle_reused(self, sid: str) -> None:
        given = self.reuse[sid]
        self.outputs[sid] = reused_output(given)
        self.attempts[sid] = [{"attempt": 1, "reused": reused_origin(given)}]
        self.dag.status[sid] = RUNNING
        if self.dag.specs[sid].dynamic:
            self._extend(sid, self.outputs[sid])
        self.dag.finish(sid, self.dag.status[sid] != FAILED, self.reasons)

    def start(self, sid: str) -> NewTask:
        """Mark ``sid`` running; return the call that starts its worker."""
        self.dag.status[sid] = RUNNING
        # A daemon: nobody joins a worker (it reports through the queue), so
        # its record goes as soon as it ends.
        return NewTask(
            worker(
                self.env,
                self.run_id,
                self.dag.specs[sid],
                self.values,
                self.outputs,
                self.results,
                self.compat,
                self.workspace,
                self.ledger,
            ),
            name=f"worker:{sid}",
            daemon=True,
            meta=TaskLabel("worker", sid),
        )

    def report(self, outcome: StepOutcome) -> None:
        """A worker reported its step's outcome: settle the step, ready or skip the next."""
        sid = outcome.step_id
        self.running.pop(sid, None)
        self.attempts[sid] = outcome.attempts
        error = self._legacy_budget_error(outcome) if outcome.ok else None
        if error is not None:
            outcome.ok = False
            outcome.error = error
        if outcome.ok:
            self.outputs[sid] = outcome.output
            if self.dag.specs[sid].dynamic:
                self._extend(sid, outcome.output)
        else:
            self.reasons[sid] = outcome.error
        self.dag.finish(sid, outcome.ok and self.dag.status[sid] != FAILED, self.reasons)

    def _legacy_budget_error(self, outcome: StepOutcome) -> dict[str, Any] | None:
        """Version 2: count a succeeded step's model use; its error if it crossed the budget."""
        usage, budget = self.usage, self.plan.budget
        if usage is None or budget is None or not legacy_spend(usage, outcome.output, budget):
            return None
        return _over_budget(usage, budget)

    def _extend(self, parent: str, output: Any) -> None:
        _extend(self.dag, self.reasons, parent, output, self.values, self.env, self.run_id)

    def result(self) -> dict[str, Any]:
        """The run's result once no worker is left, or :class:`PlanFailed`."""
        status, specs, reasons = self.dag.status, self.dag.specs, self.reasons
        failed = [
            sid for sid, st in status.items() if st == FAILED and not specs[sid].continue_on_error
        ]
        summary = {
            sid: {"status": st, "error": reasons.get(sid), "attempts": self.attempts.get(sid, [])}
            for sid, st in status.items()
        }
        usage = self.ledger.totals() if self.ledger is not None else self.usage
        name = self.plan.name
        if failed:
            extra = {"usage": usage} if usage is not None else {}
            raise PlanFailed(
                f"plan {name}: step(s) {', '.join(failed)} failed",
                failed=failed,
                steps=summary,
                **extra,
            )
        try:
            final = resolve(self.plan.outputs, self.values, self.outputs)
        except RefError as exc:
            raise PlanFailed(f"plan {name}: outputs: {exc}", steps=summary) from exc
        if usage is not None:
            return {"outputs": final, "steps": summary, "usage": usage}
        return {"outputs": final, "steps": summary}


def _over_budget(usage: dict[str, float], budget: Any) -> dict[str, Any]:
    """Version 2's error of the step whose usage crossed the budget (as journaled then)."""
    return {
        "code": "budget.exceeded",
        "message": (
            f"the run's model usage ({usage['tokens']:g} tokens, ${usage['usd']:g}) is over its "
            f"budget ({budget.tokens} tokens, ${budget.usd})"
        ),
        "tokens": usage["tokens"],
        "usd": usage["usd"],
    }


class _Dag:
    """The plan's steps, their states, and which are ready: all O(1) per event.

    ``waiting[sid]`` counts the ``after`` steps of ``sid`` not yet settled;
    a step becomes ready when it drops to zero. A settled step is one that
    succeeded, or failed with ``continue_on_error``; a step that failed
    otherwise (or was skipped) skips its dependents, transitively.
    """

    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = max_steps
        self.specs: dict[str, StepSpec] = {}
        self.status: dict[str, str] = {}
        self.waiting: dict[str, int] = {}
        self.dependents: dict[str, list[str]] = {}
        self.ready: list[str] = []

    def add(self, spec: StepSpec) -> None:
        sid = spec.id
        self.specs[sid] = spec
        self.status[sid] = PENDING
        left = 0
        for dep in spec.after:
            st = self.status.get(dep, PENDING)
            if st == SUCCEEDED or (st == FAILED and self.specs[dep].continue_on_error):
                continue
            left += 1
            self.dependents.setdefault(dep, []).append(sid)
        self.waiting[sid] = left
        if left == 0:
            self.ready.append(sid)

    def take_ready(self) -> list[str]:
        ready, self.ready = self.ready, []
        return [sid for sid in ready if self.status[sid] == PENDING]

    def finish(self, sid: str, ok: bool, reasons: dict[str, Any]) -> None:
        self.status[sid] = SUCCEEDED if ok else FAILED
        if ok or self.specs[sid].continue_on_error:
            for dep in self.dependents.get(sid, ()):
                self.waiting[dep] -= 1
                if self.waiting[dep] == 0 and self.status[dep] == PENDING:
                    self.ready.append(dep)
        else:
            self._skip_dependents(sid, reasons)

    def _skip_dependents(self, sid: str, reasons: dict[str, Any]) -> None:
        todo = [(sid, d) for d in self.dependents.get(sid, ())]
        while todo:
            cause, dep = todo.pop(0)
            if self.status[dep] != PENDING:
                continue
            self.status[dep] = SKIPPED
            reasons[dep] = {
                "message": f"skipped: upstream step {cause!r} {self.status[cause]}",
                "upstream": cause,
            }
            todo.extend((dep, d) for d in self.dependents.get(dep, ()))


def _extend(
    dag: _Dag,
    reasons: dict[str, Any],
    parent: str,
    output: Any,
    values: Mapping[str, Any],
    env: AgentEnv,
    run_id: str,
) -> None:
    """Add the steps a dynamic step returned (each runs after it); the engine is told."""
    raw = output.get("steps") if isinstance(output, Mapping) else None
    if not raw:
        return
    total = len(dag.specs) + (len(raw) if isinstance(raw, list) else 0)
    if total > dag.max_steps:  # counted before any returned step is read
        dag.status[parent] = FAILED
        reasons[parent] = error_info(
            LimitExceeded(
                "max_steps",
                dag.max_steps,
                f"returned {len(raw)} steps: the run would have {total}, more than "
                f"TIFFANY_MAX_STEPS ({dag.max_steps})",
                steps=len(raw),
            )
        )
        return
    try:
        new = [
            StepSpec.model_validate({**s, "after": sorted({*s.get("after", ()), parent})})
            for s in raw
        ]
    except (TypeError, ValueError, AttributeError) as exc:
        dag.status[parent] = FAILED
        reasons[parent] = {"code": "plan.dynamic", "message": f"returned steps are invalid: {exc}"}
        return
    errors = check_steps(
        new,
        values,
        env.registry.all_names(),
        known_steps=dag.specs.keys(),
        loc_prefix=f"{parent}.output.",
    )
    if errors:
        dag.status[parent] = FAILED
        reasons[parent] = {"code": "plan.dynamic", "message": PlanError(errors).message}
        return
    for s in new:
        dag.add(s)
    env.steps_added(run_id, new)
