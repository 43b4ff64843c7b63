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
from tiffany.agents.plan import MAX_STEPS, PlanError, StepSpec, check_steps, parse_plan
from tiffany.agents.refs import RefError, resolve
from tiffany.agents.rerun import reused_origin, reused_output
from tiffany.agents.worker import AgentEnv, StepOutcome, error_info, worker
from tiffany.errors import LimitExceeded, TaskCancelled, TiffanyError
from tiffany.kernel import KillTask, NewTask, Queue, Receive, Step
from tiffany.records import JOURNAL_COMPAT, SLOT_SIGNAL, TaskLabel
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
    # Validated once at submission; a replay or recovery parses it again,
    # against every tool (the engine holds a disabled tool's steps: registry.py).
    plan = env.validated_plan(doc) or parse_plan(doc, env.registry.all_names())
    unknown = sorted(set(inputs) - set(plan.inputs))
    if unknown:
        raise PlanError(
            [{"loc": f"inputs.{k}", "msg": "not an input of this plan"} for k in unknown]
        )
    values = {**plan.inputs, **inputs}
    if limited:
        yield Receive(SLOT_SIGNAL)  # queued until the engine gives the run its slot
    if rerun_of is not None:
        yield Step(env.copy_workspace, rerun_of, run_id, name="workspace.copy")
    dag = _Dag(max_steps)
    for spec in plan.steps:
        dag.add(spec)
    reasons: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    attempts: dict[str, list[dict[str, Any]]] = {}
    running: dict[str, int] = {}
    results: Queue[StepOutcome] = Queue(name=f"{run_id}.results")
    workspace = env.workspace_root / run_id  # the steps' (made by the first tool needing it)
    reuse = reuse or {}
    # A budget (plan.budget) counts the model tokens and dollars of the run's
    # steps (their outputs' "usage" and "cost_usd": llm, agent); only then is
    # "usage" part of the run's result. From version 3 on, a ledger the workers
    # share (budget.py) checks each model call before it starts and counts every
    # attempt, failed or not (old layout: see docs/wal-format.md, compatibility).
    budget = plan.budget
    ledger = Ledger(budget) if budget is not None and compat >= BUDGET_COMPAT else None
    usage: dict[str, float] | None = None
    if budget is not None and ledger is None:
        usage = {"tokens": 0, "usd": 0.0}
    try:
        while True:
            ready = dag.take_ready()
            if reuse:  # reused steps settle at once (no worker), readying others
                todo, ready = ready, []
                while todo:
                    for sid in todo:
                        if sid not in reuse:
                            ready.append(sid)
                            continue
                        given = reuse[sid]
                        outputs[sid] = reused_output(given)
                        attempts[sid] = [{"attempt": 1, "reused": reused_origin(given)}]
                        dag.status[sid] = RUNNING
                        if dag.specs[sid].dynamic:
                            _extend(dag, reasons, sid, outputs[sid], values, env, run_id)
                        dag.finish(sid, dag.status[sid] != FAILED, reasons)
                    todo = dag.take_ready()
            for sid in ready:
                dag.status[sid] = RUNNING
                # A daemon: nobody joins a worker (it reports through the
                # queue), so its record goes as soon as it ends.
                running[sid] = yield NewTask(
                    worker(
                        env,
                        run_id,
                        dag.specs[sid],
                        values,
                        outputs,
                        results,
                        compat,
                        workspace,
                        ledger,
                    ),
                    name=f"worker:{sid}",
                    daemon=True,
                    meta=TaskLabel("worker", sid),
                )
            if not running:
                break
            # One wait, then every report already queued: workers that ended
            # in the same pass cost the planner one dispatch, not one each.
            outcome: StepOutcome = yield results.get()
            while True:
                sid = outcome.step_id
                running.pop(sid, None)
                attempts[sid] = outcome.attempts
                if (
                    outcome.ok
                    and usage is not None
                    and budget is not None
                    and legacy_spend(usage, outcome.output, budget)
                ):  # version 2: this step's model calls crossed the run's budget
                    outcome.ok = False
                    outcome.error = _over_budget(usage, budget)
                if outcome.ok:
                    outputs[sid] = outcome.output
                    if dag.specs[sid].dynamic:
                        _extend(dag, reasons, sid, outcome.output, values, env, run_id)
                else:
                    reasons[sid] = outcome.error
                dag.finish(sid, outcome.ok and dag.status[sid] != FAILED, reasons)
                if results.empty():
                    break
                outcome = results.get_nowait()
    except TaskCancelled:
        for tid in running.values():
            yield KillTask(tid)
        raise
    status, specs = dag.status, dag.specs
    failed = [
        sid for sid, st in status.items() if st == FAILED and not specs[sid].continue_on_error
    ]
    summary = {
        sid: {"status": st, "error": reasons.get(sid), "attempts": attempts.get(sid, [])}
        for sid, st in status.items()
    }
    if ledger is not None:
        usage = ledger.totals()
    if failed:
        extra = {"usage": usage} if usage is not None else {}
        raise PlanFailed(
            f"plan {plan.name}: step(s) {', '.join(failed)} failed",
            failed=failed,
            steps=summary,
            **extra,
        )
    try:
        final = resolve(plan.outputs, values, outputs)
    except RefError as exc:
        raise PlanFailed(f"plan {plan.name}: outputs: {exc}", steps=summary) from exc
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
