"""Re-run a workflow run from a failed call: where its journal is forked.

A plan run is re-run by reusing its succeeded steps' outputs
(``tiffany/agents/rerun.py``). A workflow has no DAG to cut: its code is
the plan. So its re-run forks the earlier run's journal
(``tiffany/durable/fork.py``) just before the dispatch of the call to
restart from: the new run's code runs again from the top, every call whose
result the journal recorded before that point is answered from the copy
(never called again), and that call and everything after it run live.

The restart point (``from_step``) names a call of the run, as its tool and
child calls are numbered (``tool_2``, ``child_3``: the ids their tool
contexts, spans and errors carry, ``calls.py``). By default it is the call
the run failed at, as its error names it (``ToolFailed``'s ``call``,
``ChildFailed``'s child run); a run that failed at a plain ``Step`` of its
own restarts at the last step whose attempt raised.

How a call id is found in the journal: a ``tool(...)`` or ``child(...)``
call is a nested coroutine named ``tool:NAME#digest`` or
``child:NAME#digest``, and its dispatch is an explicit DISPATCH record of
kind ``call`` with that name. Calls are numbered in the order they are
made, which is their dispatch order (a call is yielded at once, and no
other task runs between the call and its yield), so the k-th such record
is call k.

The engine (``engine/stored_runs.py``, ``engine/requests.py``) reads the
earlier run's records, cuts them here, replays the copy against the code as
it is now (a divergence refuses the re-run, naming the line) and starts the
new run with it; the new run keeps the earlier one's inputs (the copied
calls were made with them).

Invariants:
    - The cut is a record boundary of the earlier run: what the copy holds
      is a state a crash could have left (``fork.py``).
    - Pure: reads decoded records, no I/O.
    - No fork leaves a child run in flight: its end is the engine's signal
      to the earlier run, which the new run would wait for forever; such a
      cut is refused, naming the call that started the child.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from tiffany.errors import TiffanyError
from tiffany.wire.documents import did_you_mean
from tiffany.wire.records import (
    CHILD_SIGNAL_PREFIX,
    WORKFLOW_CALL_PREFIXES,
    Dispatch,
    RunEnd,
    StepStart,
    Wake,
)

__all__ = [
    "CALL_PREFIXES",
    "RerunRefused",
    "call_dispatches",
    "children_in_flight",
    "fork_point",
]

#: The names of the nested coroutines a workflow's numbered calls are (``calls.py``).
CALL_PREFIXES: Final = tuple(p for p in WORKFLOW_CALL_PREFIXES if p != "signal:")


class RerunRefused(TiffanyError):
    """A workflow run cannot be re-run as asked; ``errors`` are its 422 items."""

    code = "workflow.rerun"

    def __init__(self, loc: str, msg: str) -> None:
        self.errors = [{"loc": loc, "msg": msg}]
        super().__init__(msg, field=loc)


def call_dispatches(records: Sequence[Any]) -> dict[str, int]:
    """The run's numbered calls: call id (``tool_1``, ``child_2``) -> its dispatch's index."""
    calls: dict[str, int] = {}
    k = 0
    for i, rec in enumerate(records):
        if rec.__class__ is not Dispatch or rec.kind != "call" or not isinstance(rec.arg, str):
            continue
        what = next((p for p in CALL_PREFIXES if rec.arg.startswith(p)), None)
        if what is not None:
            k += 1
            calls[f"{what[:-1]}_{k}"] = i
    return calls


def failed_call(run_id: str, records: Sequence[Any]) -> str | None:
    """The call the run's error names (its RUN_END's), or None."""
    end = next((r for r in reversed(records) if r.__class__ is RunEnd), None)
    value = getattr(end, "value", None)
    if not isinstance(value, list | tuple) or len(value) < 4 or not isinstance(value[3], Mapping):
        return None
    fields = value[3]
    call = fields.get("call")
    if isinstance(call, str) and call:
        return call
    child = fields.get("child")
    if isinstance(child, str) and child.startswith(f"{run_id}."):
        return child[len(run_id) + 1 :].rsplit(".", 1)[0]  # child_run_id: RUN.child_3.1
    return None


def failed_step(records: Sequence[Any]) -> int | None:
    """The index of the STEP_START of the last plain step whose attempt raised, or None."""
    for i in range(len(records) - 1, -1, -1):
        wake = records[i]
        if wake.__class__ is not Wake or wake.cause != "step" or wake.ok:
            continue
        for j in range(i - 1, -1, -1):
            start = records[j]
            if start.__class__ is StepStart and start.ltid == wake.ltid:
                return j
        return None
    return None


def children_in_flight(records: Sequence[Any]) -> list[str]:
    """The child runs whose start ``records`` hold and whose end they do not.

    A ``child(...)`` call starts its run in an inline step named ``child``
    (its result ``{"run_id"}``), and the run's end comes back as the
    engine's own signal ``child:<id>`` (``calls.py``).
    """
    started: list[str] = []
    ended: set[str] = set()
    last_step: dict[int, str] = {}
    for rec in records:
        cls = rec.__class__
        if cls is StepStart:
            last_step[rec.ltid] = rec.name
        elif cls is not Wake:
            continue
        elif rec.cause == "step" and rec.ok and last_step.get(rec.ltid) == "child":
            value = rec.value
            if isinstance(value, Mapping) and isinstance(value.get("run_id"), str):
                started.append(value["run_id"])
        elif rec.ltid == 0 and rec.cause == "signal" and isinstance(rec.value, list | tuple):
            name = str(rec.value[0]) if rec.value else ""
            if name.startswith(CHILD_SIGNAL_PREFIX):
                ended.add(name[len(CHILD_SIGNAL_PREFIX) :])
    return [c for c in started if c not in ended]


def fork_point(run_id: str, records: Sequence[Any], from_step: str | None) -> tuple[int, str]:
    """Where to fork run ``run_id``'s journal: ``(index of the first record not copied, call)``.

    Args:
        run_id: The earlier run.
        records: Its records after its RUN_START, decoded, in WAL order.
        from_step: The call to restart from (``tool_2``), or None: the one
            the run failed at.

    Raises:
        RerunRefused: ``from_step`` names no call of the run (``loc``
            ``from_step``, with the calls it has), or none is named and the
            run did not fail at a call or a step.
    """
    cut, call = _restart(run_id, records, from_step)
    running = children_in_flight(records[:cut])
    if running:
        kid = running[0]
        started = kid[len(run_id) + 1 :].rsplit(".", 1)[0] if kid.startswith(f"{run_id}.") else kid
        msg = (
            f"child run {kid} was still running where run {run_id} would be forked ({call}): "
            f"its end would never reach the new run; restart from the call that started it "
            f"({started}) or from a call after its end"
        )
        raise RerunRefused("from_step", msg)
    return cut, call


def _restart(run_id: str, records: Sequence[Any], from_step: str | None) -> tuple[int, str]:
    """:func:`fork_point`'s cut and call, before the check of child runs in flight."""
    calls = call_dispatches(records)
    if from_step is not None:
        if from_step not in calls:
            known = ", ".join(calls) or "none"
            msg = (
                f"run {run_id} has no call {from_step!r}{did_you_mean(from_step, calls)} "
                f"(its calls: {known})"
            )
            raise RerunRefused("from_step", msg)
        return calls[from_step], from_step
    call = failed_call(run_id, records)
    if call is not None and call in calls:
        return calls[call], call
    step = failed_step(records)
    if step is not None:
        return step, f"step:{records[step].name}"
    msg = (
        f"run {run_id} did not fail at a call or a step; name the call to restart from "
        f"(from_step: {', '.join(calls) or 'it has none'})"
    )
    raise RerunRefused("from_step", msg)
