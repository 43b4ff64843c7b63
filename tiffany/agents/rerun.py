"""Re-run from failure: which steps of a finished run a new run reuses.

``POST /api/runs/{id}/rerun`` (``tiffany rerun RUN [--from STEP]``) starts a
new run of the same plan that **reuses** the recorded output of every step
not downstream of the restart point, and runs the rest. The restart point
is ``from_step`` or, by default, every step that failed. A step is reused
when it succeeded in the earlier run and neither is, nor depends on (through
``after``, transitively), a restart step. The reused outputs, with the run
and WAL seq they were recorded at, go into the new run's RUN_START entry
(``reuse``): the planner settles those steps from it without a worker, so
the new run's journal stands alone (it replays and verifies without the old
one) and its tools are never called again for them.

A dynamic step's children are part of the DAG the earlier run built: their
specs come from the parent's (reused) output, and they are reused or re-run
by the same rule. That DAG is the store's one reading of it
(``tiffany/store/graph.py``, ``plan_graph``), which the caller passes in:
the dashboard's graph and this choice draw the same edges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tiffany.agents.plan import PlanError

__all__ = ["rerun_reuse"]


def rerun_reuse(
    after: Mapping[str, Sequence[str]],
    steps: Mapping[str, Mapping[str, Any]],
    from_step: str | None,
    run_id: str,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Return ``(reuse, restart)`` for re-running run ``run_id``.

    Args:
        after: The earlier run's DAG: each step's ``after`` list, its plan's
            steps and those its dynamic steps added (``plan_graph``).
        steps: Its steps by id: ``{"status", "output", "run_id", "seq"}``
            (where the output was recorded: the run, itself or the one it
            reused the step from, and the WAL seq of the record that settled it).
        from_step: Restart there (and downstream); None: at every failed step.
        run_id: The earlier run (named in each reused step's entry).

    Returns:
        ``reuse``: step id -> ``{"output", "run_id", "seq"}``; ``restart``:
        the restart steps.

    Raises:
        PlanError: ``from_step`` names no step of the run, or the run has no
            failed step to restart from (``loc`` names ``from_step``).
    """
    if from_step is not None:
        if from_step not in after:
            msg = f"run {run_id} has no step {from_step!r}"
            raise PlanError([{"loc": "from_step", "msg": msg}])
        restart = [from_step]
    else:
        restart = sorted(sid for sid in after if (steps.get(sid) or {}).get("status") == "failed")
        if not restart:
            msg = f"run {run_id} has no failed step; name the step to restart from"
            raise PlanError([{"loc": "from_step", "msg": msg}])
    dependents: dict[str, list[str]] = {}
    for sid, deps in after.items():
        for dep in deps:
            dependents.setdefault(dep, []).append(sid)
    downstream = set(restart)
    todo = list(restart)
    while todo:
        for dep in dependents.get(todo.pop(), ()):
            if dep not in downstream:
                downstream.add(dep)
                todo.append(dep)
    reuse: dict[str, dict[str, Any]] = {}
    for sid in after:
        row = steps.get(sid) or {}
        if sid not in downstream and row.get("status") == "succeeded":
            origin = row.get("run_id") or run_id
            reuse[sid] = {"output": row.get("output"), "run_id": origin, "seq": row.get("seq")}
    return reuse, restart
