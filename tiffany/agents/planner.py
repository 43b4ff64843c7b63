"""The planner task (the seed's Task_Main): runs a plan's DAG.

The planner validates the plan, then repeatedly starts a worker task for
every step whose ``after`` steps are done, and waits for workers to report
through a queue (so independent steps run concurrently). A failed step
fails its dependents (skipped, with the reason) and the run, unless it says
``continue_on_error``. A step marked ``dynamic`` whose tool returns
``{"steps": [...]}`` extends the DAG while the run goes on; since the tool's
result is journaled, a replay adds the same steps without calling the tool.

Cancelling the run kills the planner: it then kills its workers (which kill
their tool tasks, which kill their subprocesses) before it ends.

The planner is deterministic: it reads time, randomness and the world only
through its workers' steps, so it replays exactly.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from tiffany.agents.plan import PlanError, StepSpec, check_steps, parse_plan
from tiffany.agents.refs import RefError, resolve
from tiffany.agents.worker import AgentEnv, StepOutcome, worker
from tiffany.errors import TaskCancelled, TiffanyError
from tiffany.kernel import KillTask, NewTask, Queue

__all__ = ["PlanFailed", "run_plan"]

Co = Generator[Any, Any, Any]

PENDING, RUNNING, SUCCEEDED, FAILED, SKIPPED = (
    "pending",
    "running",
    "succeeded",
    "failed",
    "skipped",
)


class PlanFailed(TiffanyError):
    """A step failed (without ``continue_on_error``): the run fails."""

    code = "plan.failed"


def run_plan(env: AgentEnv, run_id: str, doc: Mapping[str, Any], inputs: Mapping[str, Any]) -> Co:
    """The root task of a plan run; returns ``{"outputs": ..., "steps": ...}``."""
    plan = parse_plan(doc, env.registry.names())
    unknown = sorted(set(inputs) - set(plan.inputs))
    if unknown:
        raise PlanError(
            [{"loc": f"inputs.{k}", "msg": "not an input of this plan"} for k in unknown]
        )
    values = {**plan.inputs, **inputs}
    specs: dict[str, StepSpec] = {s.id: s for s in plan.steps}
    status: dict[str, str] = dict.fromkeys(specs, PENDING)
    reasons: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    attempts: dict[str, list[dict[str, Any]]] = {}
    running: dict[str, int] = {}
    results: Queue[StepOutcome] = Queue(name=f"{run_id}.results")
    try:
        while True:
            _schedule_ready(specs, status, reasons)
            for sid, spec in specs.items():
                if status[sid] == PENDING and _deps_done(spec, specs, status):
                    status[sid] = RUNNING
                    running[sid] = yield NewTask(
                        worker(env, run_id, spec, values, dict(outputs), results),
                        name=f"worker:{sid}",
                    )
            if not running:
                break
            outcome: StepOutcome = yield results.get()
            sid = outcome.step_id
            running.pop(sid, None)
            attempts[sid] = outcome.attempts
            if outcome.ok:
                status[sid] = SUCCEEDED
                outputs[sid] = outcome.output
                if specs[sid].dynamic:
                    _extend(specs, status, reasons, sid, outcome.output, values, env)
            else:
                status[sid] = FAILED
                reasons[sid] = outcome.error
    except TaskCancelled:
        for tid in running.values():
            yield KillTask(tid)
        raise
    failed = [
        sid for sid, st in status.items() if st == FAILED and not specs[sid].continue_on_error
    ]
    summary = {
        sid: {"status": st, "error": reasons.get(sid), "attempts": attempts.get(sid, [])}
        for sid, st in status.items()
    }
    if failed:
        raise PlanFailed(
            f"plan {plan.name}: step(s) {', '.join(failed)} failed",
            failed=failed,
            steps=summary,
        )
    try:
        final = resolve(plan.outputs, values, outputs)
    except RefError as exc:
        raise PlanFailed(f"plan {plan.name}: outputs: {exc}", steps=summary) from exc
    return {"outputs": final, "steps": summary}


def _deps_done(spec: StepSpec, specs: Mapping[str, StepSpec], status: Mapping[str, str]) -> bool:
    for dep in spec.after:
        st = status[dep]
        if st == SUCCEEDED:
            continue
        if st == FAILED and specs[dep].continue_on_error:
            continue
        return False
    return True


def _schedule_ready(
    specs: Mapping[str, StepSpec], status: dict[str, str], reasons: dict[str, Any]
) -> None:
    """Skip the pending steps that can never run (an upstream step failed)."""
    changed = True
    while changed:
        changed = False
        for sid, spec in specs.items():
            if status[sid] != PENDING:
                continue
            for dep in spec.after:
                st = status[dep]
                if st == SKIPPED or (st == FAILED and not specs[dep].continue_on_error):
                    status[sid] = SKIPPED
                    reasons[sid] = {
                        "message": f"skipped: upstream step {dep!r} {st}",
                        "upstream": dep,
                    }
                    changed = True
                    break


def _extend(
    specs: dict[str, StepSpec],
    status: dict[str, str],
    reasons: dict[str, Any],
    parent: str,
    output: Any,
    values: Mapping[str, Any],
    env: AgentEnv,
) -> None:
    """Add the steps a dynamic step returned (each runs after it)."""
    raw = output.get("steps") if isinstance(output, Mapping) else None
    if not raw:
        return
    try:
        new = [
            StepSpec.model_validate({**s, "after": sorted({*s.get("after", ()), parent})})
            for s in raw
        ]
    except (TypeError, ValueError) as exc:
        status[parent] = FAILED
        reasons[parent] = {"code": "plan.dynamic", "message": f"returned steps are invalid: {exc}"}
        return
    errors = check_steps(
        new, values, env.registry.names(), known_steps=specs.keys(), loc_prefix=f"{parent}.output."
    )
    if errors:
        status[parent] = FAILED
        reasons[parent] = {"code": "plan.dynamic", "message": PlanError(errors).message}
        return
    for s in new:
        specs[s.id] = s
        status[s.id] = PENDING
