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

Which steps are reused is read from the store (their status, the DAG);
*what* each reuses is read from the journal (:func:`journal_reuse`): the
output the record that settled the step holds (the worker's TASK_EXIT, at
the seq the store names), exactly as the earlier run's planner had it. The
store's JSON projection of an output is lossy (NUL characters, bytes,
non-finite floats, tuples, sets and nesting past ``MAX_JSON_DEPTH`` come
back as text or lists), and a re-run that reused it would run its steps on
other values than a fresh run. The outputs go into RUN_START packed as the
journal packs values (``tiffany/wire/values.py``), and the planner unpacks them
(:func:`reused_output`): live or replayed, it sees the same values.

Invariants:
    - A reused output is the journal's value, or, when the journal no
      longer holds the record (``TIFFANY_WAL_RETAIN=delete`` released it),
      the store's, marked so: the step's ``reused`` origin says
      ``projected: true``. Never silently the projection.
    - A re-run of a run before version 3 reuses what its workers' records
      hold (old layout: see docs/wal-format.md, compatibility).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tiffany.agents.plan import PlanError
from tiffany.wire.documents import did_you_mean
from tiffany.wire.records import TaskExit
from tiffany.wire.values import pack_value, unpack_value

__all__ = [
    "journal_reuse",
    "rerun_reuse",
    "reused_origin",
    "reused_output",
    "settled_output",
]


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
            msg = f"run {run_id} has no step {from_step!r}{did_you_mean(from_step, after)}"
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


def settled_output(record: Any) -> tuple[bool, Any]:
    """The output of a step the record settled: ``(True, output)``, else ``(False, None)``.

    ``record``: the worker's TASK_EXIT (its value the step's outcome, a map
    with ``ok`` and ``output``), decoded from the journal.
    """
    if record.__class__ is not TaskExit or record.state != "done":
        return False, None
    value = record.value
    if not isinstance(value, Mapping) or value.get("ok") is not True or "output" not in value:
        return False, None
    return True, value["output"]


def journal_reuse(
    reuse: Mapping[str, Mapping[str, Any]], records: Mapping[int, Any]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Return ``reuse`` as the new run's RUN_START holds it, and the steps only the store had.

    Args:
        reuse: :func:`rerun_reuse`'s (the store's outputs).
        records: The journal records at the reused steps' seqs, by seq (a
            seq the journal no longer holds is missing).

    Each output becomes the one its record holds, packed (:func:`~tiffany.wire.values.pack_value`);
    a step whose record is missing keeps the store's output and says so
    (``projected: true``), and is named in the list returned.
    """
    out: dict[str, dict[str, Any]] = {}
    projected: list[str] = []
    for sid, given in reuse.items():
        entry = dict(given)
        seq = entry.get("seq")
        found, output = settled_output(records.get(seq) if isinstance(seq, int) else None)
        if found:
            entry["output"] = output
        else:
            entry["projected"] = True
            projected.append(sid)
        entry["output"] = pack_value(entry.get("output"))
        out[sid] = entry
    return out, projected


def reused_output(given: Mapping[str, Any]) -> Any:
    """A reused step's output, from its RUN_START entry (packed live, decoded on replay)."""
    return unpack_value(given.get("output"))


def reused_origin(given: Mapping[str, Any]) -> dict[str, Any]:
    """Where a reused step's output was recorded: its one attempt's ``reused``."""
    origin = {"run_id": given.get("run_id"), "seq": given.get("seq")}
    if given.get("projected"):
        origin["projected"] = True
    return origin
