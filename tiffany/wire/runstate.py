"""What the journal says of a run and its steps: one reading, every reader's.

Five readers turn a run's journal (or the kernel events it is written from)
into run and step state, each in its own form: the projector's fold into
rows (``tiffany/projector/fold.py``), the run index (``durable/history.py``),
the spans (``observe/otel.py``), the activity feed (``feed/activity.py``)
and the CLI's live view (``cli/live.py``). What a record means is read here,
once, and each of them folds with it:

* a run's start (:func:`run_opening`, from its RUN_START entry): a plan run
  or a callable's, the root task's role, its declared steps and their tools,
  its inputs (the plan's defaults under the caller's), and its first status
  (``pending`` while it waits for a concurrency slot, else ``running``);
* a worker's outcome (:func:`step_report`, its TASK_EXIT value or the live
  task's result): the step's ``ok``, status, output, error and attempts, and
  when its last attempt ended;
* a run's end (:func:`run_ending`, its RUN_END): its status, outputs or
  error, and for a plan run the root's step summary and model usage;
* a task's end in the run's words (:func:`task_end_status`), and what
  becomes of the steps a run left unsettled (:data:`UNSETTLED_STEPS`,
  :func:`skipped_error`).

The values come as the journal holds them (plain dicts and lists; a live
worker's result may still be its ``StepOutcome`` object, read by its
attributes). Nothing here is made JSON-able or cut: the store's reader does
that for its columns.

Invariants: pure functions of their arguments, of the wire's records and
statuses only; every reader of a run's end or a step's outcome calls them,
so a rule changes in one place.

Rejected: one stateful fold object shared by the five. The projector's fold
keeps its run contexts reloadable from rows and writes per-row updates in
batches; the instruments see live tasks, not records, and must do O(1) work
on the scheduler thread; the run index reads only RUN_START and RUN_END. What
they share is the meaning of each record, not the bookkeeping around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tiffany.wire.entries import Entry, EntryKind, MalformedEntry, read_entry
from tiffany.wire.records import root_role
from tiffany.wire.status import TASK_STATUS, TERMINAL_TASK, RunStatus, StepStatus

__all__ = [
    "UNSETTLED_STEPS",
    "RunEnding",
    "RunOpening",
    "StepReport",
    "run_end_status",
    "run_ending",
    "run_opening",
    "skipped_error",
    "step_report",
    "task_end_status",
]

#: The step statuses a run's end settles as ``skipped`` (the step never finished).
UNSETTLED_STEPS: Final[frozenset[str]] = frozenset(
    {StepStatus.PENDING.value, StepStatus.RUNNING.value}
)

#: A RUN_END's status in the run's words (anything else is no run's end).
_RUN_END: Final[dict[str, RunStatus]] = {
    s.value: s for s in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
}


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a number (a bool is not)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


# -- a run's start ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunOpening:
    """What a RUN_START's entry says of the run.

    Attributes:
        plan: A plan run (an entry of kind ``plan`` with a plan document).
        root: The root task's role: ``planner`` for a plan run, else ``task``.
        status: ``pending`` when it waits for a concurrency slot first,
            else ``running``.
        steps: The plan's declared steps, in order: ``(id, tool)``, the tool
            None when the step names none (or names it with no string).
        inputs: A plan's inputs (its defaults under the caller's), or a
            callable's ``{"args", "kwargs"}``.
        kind: The entry's kind, None for a malformed entry.
    """

    plan: bool
    root: str
    status: RunStatus
    steps: tuple[tuple[str, str | None], ...]
    inputs: Any
    kind: EntryKind | None = None


def run_opening(entry: Any) -> RunOpening:
    """Read a run's entry (its RUN_START's ``entry``): see :class:`RunOpening`.

    A malformed entry reads as a run of no plan, no inputs (the fold and the
    spans list every run; the runtime refuses to run it).
    """
    try:
        typed: Entry | None = read_entry(entry)
    except MalformedEntry:
        typed = None
    if typed is None:
        return RunOpening(False, "task", RunStatus.RUNNING, (), {}, None)
    plan_doc = typed.plan_doc
    steps: list[tuple[str, str | None]] = []
    inputs: Any = typed.run_inputs
    if plan_doc is not None:
        defaults = plan_doc.get("inputs")
        inputs = {**(defaults if isinstance(defaults, Mapping) else {}), **inputs}
        declared = plan_doc.get("steps")
        for spec in declared if isinstance(declared, list) else ():
            if isinstance(spec, Mapping) and isinstance(spec.get("id"), str):
                tool = spec.get("tool")
                steps.append((spec["id"], tool if isinstance(tool, str) else None))
    # Queued behind a concurrency limit until its slot's signal.
    status = RunStatus.PENDING if typed.concurrency_key is not None else RunStatus.RUNNING
    root = root_role(typed)
    return RunOpening(plan_doc is not None, root, status, tuple(steps), inputs, typed.kind)


# -- a step's outcome ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepReport:
    """A worker's outcome: how its step ended.

    Attributes:
        ok: The step's ``ok`` as reported (a bool in every journal).
        output: Its output (the last attempt's, when it succeeded).
        error: Its error (None when it succeeded).
        attempts: Its attempt records as reported (a list of dicts:
            ``attempt``, ``started_at``, ``ended_at``, ``ok``, ``error``...),
            or None when the outcome holds none.
    """

    ok: Any
    output: Any
    error: Any
    attempts: Any

    @property
    def status(self) -> StepStatus:
        """``succeeded`` or ``failed``."""
        return StepStatus.SUCCEEDED if self.ok else StepStatus.FAILED

    @property
    def ended_at(self) -> float | None:
        """When its last attempt ended (the run's clock), if it says."""
        attempts = self.attempts
        last = attempts[-1] if isinstance(attempts, list) and attempts else None
        return _number(last.get("ended_at")) if isinstance(last, Mapping) else None


def step_report(result: Any, *, objects: bool = True) -> StepReport | None:
    """Read a worker's result (its step's ``StepOutcome``) as a :class:`StepReport`.

    ``result`` is the dict the journal holds (version 3 on), or, read from a
    live task (``objects``), the ``StepOutcome`` object itself. None when it
    is neither (a worker that crashed or was cancelled has no report).
    """
    if isinstance(result, Mapping):
        get = result.get
        return StepReport(get("ok"), get("output"), get("error"), get("attempts"))
    if not objects or result is None or not hasattr(result, "ok"):
        return None
    return StepReport(
        result.ok,
        getattr(result, "output", None),
        getattr(result, "error", None),
        getattr(result, "attempts", None),
    )


# -- a run's end -----------------------------------------------------------------------


def run_end_status(status: Any) -> RunStatus | None:
    """A RUN_END's ``status`` as a :class:`RunStatus`; None for a word no run ends with."""
    return _RUN_END.get(status) if isinstance(status, str) else None


@dataclass(frozen=True, slots=True)
class RunEnding:
    """What a RUN_END says of the run.

    Attributes:
        status: How it ended: ``succeeded``, ``failed`` or ``cancelled``.
        value: The record's value as journaled: a callable's result, a
            plan's ``{"outputs", "steps", "usage"}``, or the error.
        outputs: What the run answers as its outputs (a plan's ``outputs``,
            a callable's value); None when it did not succeed.
        steps: A plan run's step summary (step id -> ``{"status",
            "error", "attempts"}``), final; None when it holds none.
        usage: A plan with a budget: its model usage, as reported.
    """

    status: RunStatus
    value: Any
    outputs: Any
    steps: Mapping[Any, Any] | None
    usage: Mapping[str, Any] | None


def run_ending(status: Any, value: Any, *, plan: bool, workflow: bool = False) -> RunEnding | None:
    """Read a RUN_END (its ``status`` and ``value``) of a plan run or not; None: no end.

    A workflow's value is ``{"outputs": the dict its function returned}``.

    A plan that succeeded reports its steps in its value; one that failed
    in its error's fields (the ``PlanFailed`` error, packed as ``[type,
    message, traceback, fields]``).
    """
    final = run_end_status(status)
    if final is None:
        return None
    outputs: Any = None
    summary: Any = None
    usage: Any = None
    if final is RunStatus.SUCCEEDED:
        outputs = value
        if plan and isinstance(value, Mapping):
            outputs, summary, usage = value.get("outputs"), value.get("steps"), value.get("usage")
        elif workflow and isinstance(value, Mapping):
            outputs = value.get("outputs")
    elif plan and isinstance(value, list | tuple) and len(value) > 3:
        fields = value[3]
        if isinstance(fields, Mapping):
            summary, usage = fields.get("steps"), fields.get("usage")
    return RunEnding(
        final,
        value,
        outputs,
        summary if isinstance(summary, Mapping) else None,
        usage if isinstance(usage, Mapping) else None,
    )


def skipped_error(status: str) -> dict[str, str]:
    """The error of a step its run left unsettled when it ended ``status``."""
    return {"message": f"skipped: the run {status}"}


# -- a task's end ----------------------------------------------------------------------


def task_end_status(state: Any) -> RunStatus | None:
    """A task's final state (``done``, ``crashed``, ``cancelled``) in the run's words.

    None for a state that is no end (``ready``, ``blocked_*``...).
    """
    return TASK_STATUS[state] if state in TERMINAL_TASK else None
