"""The row fold: what each journal record means as rows of runs, tasks and steps.

The projector (``projector.py``) owns the transactions: batches, the mark,
quarantine. For each record of a batch it asks :meth:`RowFold.apply` to
add the record's changes to the batch's :class:`~tiffany.projector.rows.Batch`
(new rows and updates, merged per row); the fold keeps what it needs of
each run between records (:class:`_RunCtx`), and reloads it from the rows
when memory does not hold it (after a restart, an eviction, or another
projector's write). It reads the store, never writes it: the batch's flush
does.

What a run's start, a worker's outcome, a run's end and a task's end mean
is read by :mod:`tiffany.wire.runstate`, the reading the run index, the
spans, the feed and the CLI's live view share; this module makes rows of it.

What the journal says, and what the projection makes of it:

* ``RUN_START``: a ``running`` run; for a plan run, a ``pending`` step per
  declared step.
* ``SPAWN``: a ``ready`` task whose kind, step and tool are the record's
  ``role``, ``step_id`` and ``tool`` (the plan run's root is the
  ``planner``); a worker's spawn marks its step ``running``.
* ``DISPATCH``: the run's dispatch count; a call that blocks (``sleep``,
  ``wait_task``, ``step``...) makes the task ``blocked_*`` with what it
  waits on, anything else ``running``. A ``SPAWN``, ``OUTCOME``,
  ``STEP_START`` or ``TASK_EXIT`` whose ``n`` is above the run's dispatch
  count stands for the DISPATCH the journal did not write (``NewTask``,
  ``Now()``/``Random()``, ``Step``, a task's final ``return``;
  ``tiffany.wire.records.carried``) and is applied as that dispatch too, so
  the rows are the same either way.
* ``WAKE``: the task is ``ready`` again. ``OUTCOME`` of ``Now()``: the run's
  clock moves (task and step start and end times are read from it); so does
  a worker's exit, to its last attempt's end (a python step's attempt reads
  no ``Now()``: its times come with the step's result).
* ``TASK_EXIT``: ``done``, ``crashed`` or ``cancelled`` with the result or
  error. A worker's result (its ``StepOutcome``, a dict in the journal)
  settles its step; a tool task's result is the step's latest output.
* ``STEP_START`` with an attempt above 1 (a step started again after a
  crash): the plan step's attempt it belongs to is marked
  ``rerun_after_crash`` (``RowFold._rerun``).
* ``HOLD``: the engine held the task's step back (its tool is disabled
  there): the task is blocked on ``waiting: REASON`` and its step's
  ``waiting`` column holds the reason, until the task's STEP_START (a later
  engine started the step), the step's end or the run's.
* Who waits for a person (:class:`~tiffany.store.waits.RunWaits`, fed
  every record): a run whose live steps all wait for a client's signal or
  an operator (a HOLD) is ``waiting``, ``running`` again once one goes
  on; ``runs.waiting_for`` lists what its tasks wait for.
* ``RUN_END``: the run's status, outputs or error; for a plan run, the
  root's step summary (in its result, or in the ``PlanFailed`` error's
  fields) is final: status, error and attempts of every step. Steps a
  cancelled run never finished are ``skipped``.

Run identity: records name their run by ``run_no``, which an old WAL may
reuse (old layout: see docs/wal-format.md, compatibility). A record belongs
to the latest RUN_START with its number (as ``tiffany/durable/history.py``
reads it); ``runs.start_seq`` keeps the runs apart and orders them.

Discussion: a task's state between records is a guess the journal cannot
settle: a wake-up from inside the run (a joined task ending, a queue put)
is not journaled, so a ``blocked_join`` task shows as blocked until its
next dispatch. That next dispatch usually follows in the same group
commit, so the store is at most one batch behind the truth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import Connection, select

from tiffany.projector.rows import Batch
from tiffany.store.models import DeadLetter, Run, Step, Task, TaskKind
from tiffany.store.records import BLOCKING_KINDS, attempt_times, error_dict, jsonable, text
from tiffany.store.waits import RunWaits
from tiffany.wire.entries import EntryKind
from tiffany.wire.records import (
    MAX_ARG_CHARS,
    SLOT_SIGNAL,
    Dispatch,
    Hold,
    Outcome,
    Record,
    RecordType,
    RunEnd,
    RunStart,
    Spawn,
    StepStart,
    TaskExit,
    Unknown,
    Wake,
    carried,
)
from tiffany.wire.runstate import (
    UNSETTLED_STEPS,
    StepReport,
    run_end_status,
    run_ending,
    run_opening,
    skipped_error,
    step_report,
    task_end_status,
)
from tiffany.wire.shards import seq_base, seq_last
from tiffany.wire.status import RunStatus, StepStatus, TaskState

__all__ = ["MAX_CACHED_FINISHED_RUNS", "RowFold"]

#: Finished runs whose context is kept in memory (more are reloaded on demand).
MAX_CACHED_FINISHED_RUNS: Final = 256

#: The statuses the waits decide between (a pending run waits for its slot first).
_LIVE_RUN: Final = (RunStatus.RUNNING.value, RunStatus.WAITING.value)
_PENDING: Final = StepStatus.PENDING.value
_SUCCEEDED: Final = StepStatus.SUCCEEDED.value
_RUNNING: Final = StepStatus.RUNNING.value
_STEP_STATUSES: Final = frozenset(s.value for s in StepStatus)
_ROLES: Final = frozenset(k.value for k in TaskKind)

#: ``steps.waiting`` (why a step waits) exists in this schema (revision 0003 on).
_HAS_WAITING: Final = "waiting" in Step.__table__.c
_HAS_USAGE: Final = "usage" in Run.__table__.c


def _add_usage(ctx: _RunCtx, output: Any) -> bool:
    """Add a step's model usage to its run's; True if any.

    ``output``: an ``llm`` or ``agent`` output, or a failed attempt's error.

    The same sums as the run's budget (``tiffany/agents/budget.py``:
    ``usage.total_tokens`` and ``cost_usd``), for every run: a run with a
    budget also reports its total in its RUN_END, which then stands.
    """
    if not isinstance(output, Mapping):
        return False
    used = output.get("usage")
    tokens = used.get("total_tokens") if isinstance(used, Mapping) else None
    cost = output.get("cost_usd")
    if isinstance(tokens, bool) or not isinstance(tokens, int | float):
        tokens = None
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        cost = None
    if tokens is None and cost is None:
        return False
    usage = ctx.usage if ctx.usage is not None else {"tokens": 0, "usd": 0.0}
    if tokens is not None:
        usage["tokens"] += tokens
    if cost is not None:
        usage["usd"] = round(usage["usd"] + cost, 8)
    ctx.usage = usage
    return True


@dataclass(slots=True)
class _StepInfo:
    status: str
    tool: str | None
    #: The step's attempts (numbers) that started again after a crash
    #: (``rerun_after_crash`` on them: :meth:`RowFold._rerun`).
    reruns: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _RunCtx:
    """What the projector keeps of a run between records (reloadable from the rows)."""

    run_id: str
    plan: bool
    root: str  # the root task's role (records.root_role): for SPAWNs that lack one
    clock: float | None
    dispatches: int
    finished: bool
    tasks: dict[int, tuple[str, str | None]] = field(default_factory=dict)  # ltid -> kind, step
    held: set[int] = field(default_factory=set)  # ltids whose step a HOLD record held back
    receiving: set[int] = field(default_factory=set)  # ltids whose step waits for a signal
    steps: dict[str, _StepInfo] = field(default_factory=dict)
    #: The model usage of its steps so far (``{"tokens", "usd"}``), or None
    #: before a step reported any: the run's row shows it (``runs.usage``).
    usage: dict[str, float] | None = None
    #: The run's status as its row has it (``runs.status``).
    status: str = RunStatus.RUNNING.value
    #: Who in the run waits for a person (``runs.waiting_for``; ``waits.py``).
    waits: RunWaits = field(default_factory=lambda: RunWaits(False))
    #: A workflow run (entry kind ``workflow``): its result's ``outputs`` are its outputs.
    workflow: bool = False


def _marked(attempts: Any, reruns: set[int]) -> Any:
    """``attempts`` (JSON-able records) with ``rerun_after_crash`` on those in ``reruns``."""
    if not reruns or not isinstance(attempts, list):
        return attempts
    return [
        {**a, "rerun_after_crash": True}
        if isinstance(a, dict) and a.get("attempt") in reruns
        else a
        for a in attempts
    ]


def _reruns_in(attempts: Any) -> set[int]:
    """The attempts a step's row marks ``rerun_after_crash`` (a reloaded context's)."""
    if not isinstance(attempts, list):
        return set()
    marked = (a for a in attempts if isinstance(a, Mapping) and a.get("rerun_after_crash"))
    return {a["attempt"] for a in marked if isinstance(a.get("attempt"), int)}


class RowFold:
    """Fold one engine's journal records into row changes (the module docstring).

    Args:
        shard: The engine whose records these are (``tiffany/wire/shards.py``):
            its runs are those whose RUN_START is in its seqs.

    Memory: the contexts of unfinished runs, and of the last
    :data:`MAX_CACHED_FINISHED_RUNS` finished ones (:meth:`evict`); any
    other is reloaded from the rows on its next record.
    """

    def __init__(self, shard: int = 0) -> None:
        self.shard = shard
        self._base, self._last = seq_base(shard), seq_last(shard)
        #: The run id of each run number (its latest start; see :meth:`load_run_ids`).
        self.run_ids: dict[int, str] = {}
        #: True when :attr:`run_ids` must be read again before the next record.
        self.run_ids_stale = False
        self._ctx: dict[int, _RunCtx] = {}
        #: Runs that finished in memory since the last eviction (:meth:`evict`).
        self._finished = 0

    def apply(
        self,
        conn: Connection,
        b: Batch,
        seq: int,
        run_no: int,
        rec: Record | Unknown,
    ) -> bool:
        """Add record ``seq`` of run ``run_no`` to ``b``; False if its run is not in the store.

        ``conn`` reads the run's context from the rows when memory does not
        hold it. A record whose run's RUN_START was never projected (or was
        quarantined) is an orphan: it shows in the journal rows only.
        """
        cls = rec.__class__
        # Its journal row (just made) holds its fields made JSON-able already:
        # a value is walked once, not once for the row and again for each
        # column that shows it (a step's output was walked three times).
        row = b.records[-1] if b.records and b.records[-1]["seq"] == seq else None
        if cls is RunStart:
            self._run_start(b, seq, run_no, rec, row)  # type: ignore[arg-type]
            return True
        ctx = self._context(conn, run_no)
        if ctx is None:
            return False
        b.runs.update((ctx.run_id,), last_seq=seq)
        if cls is Unknown:
            return True  # a record type this code does not know shows in the journal only
        implied = carried(rec, ctx.dispatches)  # type: ignore[arg-type]
        if implied is not None:
            self._dispatch(b, ctx, implied)
        if cls is Dispatch:
            self._dispatch(b, ctx, rec)  # type: ignore[arg-type]
        elif cls is Spawn:
            self._spawn(b, ctx, rec)  # type: ignore[arg-type]
        elif cls is Wake:
            if rec.ltid in ctx.tasks:  # type: ignore[union-attr]
                key = (ctx.run_id, rec.ltid)  # type: ignore[union-attr]
                b.tasks.update(key, state=TaskState.READY.value, blocked_on=None)
            elif _is_slot(rec) and not ctx.finished:  # a queued run got its slot
                ctx.status = RunStatus.RUNNING.value
                b.runs.update((ctx.run_id,), status=ctx.status)
        elif cls is Outcome:
            self._outcome(b, ctx, rec)  # type: ignore[arg-type]
        elif cls is TaskExit:
            self._task_exit(b, ctx, rec, _made(row, "value", rec))  # type: ignore[arg-type]
        elif cls is RunEnd:
            self._run_end(b, ctx, rec, _made(row, "value", rec))  # type: ignore[arg-type]
        elif cls is StepStart:
            if ctx.held:
                self._step_held(b, ctx, rec.ltid, None, rec.name)  # type: ignore[union-attr]
            if rec.attempt > 1:  # type: ignore[union-attr]
                self._rerun(b, ctx, rec)  # type: ignore[arg-type]
        elif cls is Hold:
            self._step_held(b, ctx, rec.ltid, text(rec.reason), rec.name)  # type: ignore[union-attr]
        waits = ctx.waits
        waits.apply(rec, implied)
        if waits.changed:
            self._waits(b, ctx)
        return True

    def _waits(self, b: Batch, ctx: _RunCtx) -> None:
        """Who waits changed: the run's ``waiting_for``, and ``waiting`` or ``running``."""
        waits = ctx.waits
        waits.changed = False
        values: dict[str, Any] = {"waiting_for": waits.waiting_for() or None}
        if not ctx.finished and ctx.status in _LIVE_RUN:
            status = (RunStatus.WAITING if waits.waiting() else RunStatus.RUNNING).value
            if status != ctx.status:
                ctx.status = values["status"] = status
        b.runs.update((ctx.run_id,), **values)

    def _outcome(self, b: Batch, ctx: _RunCtx, rec: Outcome) -> None:
        value = rec.value
        if rec.kind == "now" and isinstance(value, int | float) and not isinstance(value, bool):
            self._tick(b, ctx, float(value))

    def _run_start(
        self, b: Batch, seq: int, run_no: int, rec: RunStart, row: dict[str, Any] | None
    ) -> None:
        run_id, name, entry, ts = rec.run_id, rec.name, rec.entry, rec.ts
        opening = run_opening(entry)
        entry = entry if isinstance(entry, Mapping) else {}
        data = row["data"] if row is not None else None
        entry_json = (
            data["entry"] if isinstance(data, dict) and "entry" in data else jsonable(entry)
        )
        plan = opening.plan
        clock = float(ts) if isinstance(ts, int | float) else None
        ctx = _RunCtx(text(run_id), plan, opening.root, clock, 0, False)
        ctx.workflow = opening.kind is EntryKind.WORKFLOW
        ctx.waits = RunWaits(plan, ctx.root)
        ctx.status = opening.status.value  # pending: queued for a concurrency slot
        self.run_ids[run_no] = ctx.run_id
        self._ctx[run_no] = ctx
        b.runs.insert(
            (ctx.run_id,),
            {
                "run_no": run_no,
                "name": text(name),
                "status": ctx.status,
                "entry": entry_json,
                "inputs": jsonable(opening.inputs),
                "created_at": clock if clock is not None else 0.0,
                "started_at": clock,
                "updated_at": clock,
                "dispatches": 0,
                "last_seq": seq,
                "start_seq": seq,
            },
        )
        if plan:
            # A re-run's steps settled from an earlier run (tiffany/agents/rerun.py),
            # made JSON-able already: each row is made settled, not made and changed.
            reuse = entry_json.get("reuse") if isinstance(entry_json, Mapping) else None
            reused = _reused(reuse, ctx.clock) if isinstance(reuse, Mapping) else {}
            for declared, tool in opening.steps:
                step_id = text(declared)
                self._new_step(
                    b, ctx, step_id, None if tool is None else text(tool), reused.get(step_id)
                )
            for step_id, settled in reused.items():  # a dynamic step's children
                if step_id not in ctx.steps:
                    self._new_step(b, ctx, step_id, None, settled)

    def _spawn(self, b: Batch, ctx: _RunCtx, rec: Spawn) -> None:
        ltid, parent, name = rec.ltid, rec.parent_ltid, text(rec.name)
        role = rec.role if rec.role is not None else ctx.root
        kind = TaskKind(role) if role in _ROLES else TaskKind.TASK
        step_id = text(rec.step_id) if ctx.plan and rec.step_id is not None else None
        ctx.tasks[ltid] = (kind.value, step_id)
        b.tasks.insert(
            (ctx.run_id, ltid),
            {
                "parent_ltid": parent or None,
                "name": name,
                "kind": kind.value,
                "step_id": step_id,
                "state": TaskState.READY.value,
                "started_at": ctx.clock,
            },
        )
        if step_id is None:
            return
        step = ctx.steps.get(step_id)
        if step is None:
            step = self._new_step(b, ctx, step_id, None)
        if kind is TaskKind.WORKER and step.status == _PENDING:
            step.status = _RUNNING
            b.steps.update((ctx.run_id, step_id), status=step.status, started_at=ctx.clock)
        elif kind is TaskKind.TOOL and step.tool is None and rec.tool is not None:
            step.tool = text(rec.tool)
            b.steps.update((ctx.run_id, step_id), tool=step.tool)

    def _dispatch(self, b: Batch, ctx: _RunCtx, rec: Dispatch) -> None:
        n, ltid, kind, arg = rec.n, rec.ltid, rec.kind, rec.arg
        if n > ctx.dispatches:
            ctx.dispatches = n
            b.runs.update((ctx.run_id,), dispatches=n)
        if ltid not in ctx.tasks:
            return
        blocked = BLOCKING_KINDS.get(kind)
        if blocked is None:
            b.tasks.update((ctx.run_id, ltid), state=TaskState.RUNNING.value, blocked_on=None)
        else:
            on = text(kind if arg is None else f"{kind} {arg}")
            b.tasks.update((ctx.run_id, ltid), state=blocked.value, blocked_on=on)
        if kind == "receive":
            self._step_waits(b, ctx, ltid, text(f"signal {arg}"))
        elif ctx.receiving and ltid in ctx.receiving:
            self._step_waits(b, ctx, ltid, None)

    def _step_waits(self, b: Batch, ctx: _RunCtx, ltid: int, waiting: str | None) -> None:
        """A worker's step waits for a signal (``signal NAME``), or no longer (None)."""
        if waiting is None:
            ctx.receiving.discard(ltid)
        else:
            ctx.receiving.add(ltid)
        step_id = ctx.tasks[ltid][1]
        if _HAS_WAITING and step_id is not None and step_id in ctx.steps:
            b.steps.update((ctx.run_id, step_id), waiting=waiting)

    def _step_held(self, b: Batch, ctx: _RunCtx, ltid: Any, reason: str | None, name: Any) -> None:
        """A HOLD (``reason``): the task waits, and so does its step; a STEP_START ends it."""
        known = ctx.tasks.get(ltid)
        if known is None or (reason is None and ltid not in ctx.held):
            return
        if reason is None:
            ctx.held.discard(ltid)
            on = text(f"step {str(name)[:MAX_ARG_CHARS]}")
        else:
            ctx.held.add(ltid)
            on = f"waiting: {reason}"
        b.tasks.update((ctx.run_id, ltid), blocked_on=on)
        step_id = known[1]
        if _HAS_WAITING and step_id is not None and step_id in ctx.steps:
            b.steps.update((ctx.run_id, step_id), waiting=reason)

    def _rerun(self, b: Batch, ctx: _RunCtx, rec: StepStart) -> None:
        """A durable step started again after a crash (its STEP_START's attempt above 1).

        Which attempt of the plan step it belongs to: a worker runs a step
        itself (python) one durable step an attempt, so its ordinal is the
        attempt; a tool task runs one attempt each, in order. The mark goes on
        the step's row at once, as the attempt it is (so a projector restarted
        before the step ends reads it back: :meth:`_context`), and on that
        attempt's record when the step settles (:func:`_marked`).

        Discussion: the worker's own record of its attempts cannot say so: it
        is rebuilt by replay, which knows nothing of the crash. Only the
        journal's STEP_START does (``tiffany/durable/journal.py``).
        """
        kind, step_id = ctx.tasks.get(rec.ltid, ("", None))
        if step_id is None or step_id not in ctx.steps:
            return
        if kind == TaskKind.WORKER.value:
            attempt = rec.ordinal
        elif kind == TaskKind.TOOL.value:
            tools = sorted(
                ltid
                for ltid, (k, step) in ctx.tasks.items()
                if step == step_id and k == TaskKind.TOOL.value
            )
            attempt = tools.index(rec.ltid) + 1
        else:
            return
        step = ctx.steps[step_id]
        step.reruns.add(attempt)
        if step.status not in UNSETTLED_STEPS:
            return
        running = {"attempt": attempt, "rerun_after_crash": True, "started_at": ctx.clock}
        b.steps.update((ctx.run_id, step_id), attempts=[running])

    def _task_exit(self, b: Batch, ctx: _RunCtx, rec: TaskExit, made: Any) -> None:
        """A task's exit; ``made`` is ``jsonable(rec.value)`` (its journal row's)."""
        ltid, state, value = rec.ltid, rec.state, rec.value
        known = ctx.tasks.get(ltid)
        if known is None or task_end_status(state) is None:
            return
        final = TaskState(state)
        report = step_report(value, objects=False) if known[0] == TaskKind.WORKER.value else None
        if report is not None:
            # A python step's attempt reads no Now(): its end time, journaled in
            # the worker's outcome, moves the run's clock instead.
            ended = report.ended_at
            if ended is not None:
                self._tick(b, ctx, ended)
        key = (ctx.run_id, ltid)
        if final is TaskState.DONE:
            b.tasks.update(key, state=final.value, blocked_on=None, ended_at=ctx.clock, result=made)
        else:
            b.tasks.update(
                key, state=final.value, blocked_on=None, ended_at=ctx.clock, error=error_dict(value)
            )
        kind, step_id = known
        if step_id is None or step_id not in ctx.steps or final is not TaskState.DONE:
            return
        if report is not None:
            self._settle_step(b, ctx, step_id, report, made)
        elif kind == TaskKind.TOOL.value:
            b.steps.update((ctx.run_id, step_id), output=made)

    def _settle_step(
        self, b: Batch, ctx: _RunCtx, step_id: str, outcome: StepReport, made: Any
    ) -> None:
        """A worker's StepOutcome (its journaled dict, read by :func:`step_report`).

        ``made``: the outcome's dict made JSON-able (its parts are taken from it).
        """
        step = ctx.steps[step_id]
        step.status = outcome.status.value
        output = outcome.output
        values: dict[str, Any] = {
            "status": step.status,
            "output": _part(made, "output", output),
            "error": _part(made, "error", outcome.error),
        }
        if _HAS_WAITING:
            values["waiting"] = None
        attempts = outcome.attempts
        values.update(
            attempt_times(attempts, _marked(_part(made, "attempts", attempts), step.reruns))
        )
        b.steps.update((ctx.run_id, step_id), **values)
        self._tool_ends(b, ctx, step_id, attempts)
        if not _HAS_USAGE:
            return
        counted = bool(outcome.ok) and _add_usage(ctx, output)
        for attempt in attempts if isinstance(attempts, list) else ():
            # A failed attempt's model usage (its error's, budget.py) was paid for too.
            error = attempt.get("error") if isinstance(attempt, Mapping) else None
            if error is not None and _add_usage(ctx, error):
                counted = True
        if counted:
            b.runs.update((ctx.run_id,), usage=dict(ctx.usage or {}))

    def _tool_ends(self, b: Batch, ctx: _RunCtx, step_id: str, attempts: Any) -> None:
        """Each tool task of a step ends when its attempt did (the worker's record says when).

        A tool task's exit comes with no time of its own (its step reads no
        ``Now()``), so its row ended on the run's clock, where it started:
        0 ms on the timeline for a shell step that ran for seconds. One tool
        task runs each attempt, in order; a step run in its worker (python,
        sleep) has none, and a count that does not match is left alone.
        """
        if not isinstance(attempts, list):
            return
        tools = sorted(
            ltid
            for ltid, (kind, step) in ctx.tasks.items()
            if step == step_id and kind == TaskKind.TOOL.value
        )
        if not tools or len(tools) != len(attempts):
            return
        for ltid, attempt in zip(tools, attempts, strict=True):
            ended = attempt.get("ended_at") if isinstance(attempt, Mapping) else None
            if isinstance(ended, int | float) and not isinstance(ended, bool):
                b.tasks.update((ctx.run_id, ltid), ended_at=float(ended))

    def _run_end(self, b: Batch, ctx: _RunCtx, rec: RunEnd, made: Any) -> None:
        """The run's end; ``made`` is ``jsonable(rec.value)`` (its journal row's)."""
        value, ts = rec.value, rec.ts
        ending = run_ending(rec.status, value, plan=ctx.plan, workflow=ctx.workflow)
        if ending is None:
            return
        final = ending.status
        if isinstance(ts, int | float):
            self._tick(b, ctx, float(ts))
        ctx.finished = True
        ctx.status = final.value
        self._finished += 1
        if 1 in ctx.tasks:  # the root's exit came just before, on the previous clock
            b.tasks.update((ctx.run_id, 1), ended_at=ctx.clock)
        summary, usage = ending.steps, ending.usage  # a plan with a budget reports its usage
        if final is RunStatus.SUCCEEDED:
            outputs = made
            if (ctx.plan or ctx.workflow) and isinstance(value, Mapping):
                outputs = _part(made, "outputs", ending.outputs)
            b.runs.update((ctx.run_id,), status=final.value, ended_at=ctx.clock, outputs=outputs)
        else:
            b.runs.update(
                (ctx.run_id,), status=final.value, ended_at=ctx.clock, error=error_dict(value)
            )
        if _HAS_USAGE and usage is not None:
            b.runs.update((ctx.run_id,), usage=jsonable(usage))
        if not ctx.plan:
            return
        for step_id, info in summary.items() if summary is not None else ():
            # ``dict`` first: a thousand ABC checks were a third of this loop.
            if not (info.__class__ is dict or isinstance(info, Mapping)):
                continue
            if info.get("status") not in _STEP_STATUSES:
                continue
            step_id = text(step_id)
            step = ctx.steps.get(step_id)
            if step is not None and step.status == info["status"] != _RUNNING:
                # Settled already, from the same outcome: its worker's exit (or a
                # re-run's RUN_START). Rewriting every row cost a 1,000-step plan
                # 1,000 UPDATEs at its end.
                continue
            step = step or self._new_step(b, ctx, step_id, None)
            step.status = str(info["status"])
            attempts = _marked(jsonable(info.get("attempts") or []), step.reruns)
            values: dict[str, Any] = {
                "status": step.status,
                "error": jsonable(info.get("error")),
                "attempts": attempts,
            }
            if _HAS_WAITING:
                values["waiting"] = None
            values.update(attempt_times(info.get("attempts"), attempts))
            b.steps.update((ctx.run_id, step_id), **values)
        for step_id, step in ctx.steps.items():
            if step.status in UNSETTLED_STEPS:
                step.status = StepStatus.SKIPPED.value
                b.steps.update(
                    (ctx.run_id, step_id),
                    status=step.status,
                    error=skipped_error(final.value),
                    ended_at=ctx.clock,
                    **({"waiting": None} if _HAS_WAITING else {}),
                )

    # -- helpers ---------------------------------------------------------------

    def _new_step(
        self,
        b: Batch,
        ctx: _RunCtx,
        step_id: str,
        tool: str | None,
        settled: dict[str, Any] | None = None,
    ) -> _StepInfo:
        """A step's row: pending, or ``settled`` (a re-run's reused step: :func:`_reused`)."""
        row: dict[str, Any] = {"position": len(ctx.steps), "tool": tool}
        if settled is None:
            info = _StepInfo(_PENDING, tool)
            row["status"], row["attempts"] = _PENDING, []
        else:
            info = _StepInfo(_SUCCEEDED, tool)
            row.update(settled)
        b.steps.insert((ctx.run_id, step_id), row)
        ctx.steps[step_id] = info
        return info

    def _tick(self, b: Batch, ctx: _RunCtx, ts: float) -> None:
        if math.isfinite(ts) and (ctx.clock is None or ts > ctx.clock):
            ctx.clock = ts
            b.runs.update((ctx.run_id,), updated_at=ts)

    def _context(self, conn: Connection, run_no: int) -> _RunCtx | None:
        ctx = self._ctx.get(run_no)
        if ctx is not None:
            return ctx
        run_id = self.run_ids.get(run_no)
        if run_id is None:
            return None  # its RUN_START was never projected
        columns = [
            Run.run_id,
            Run.entry,
            Run.updated_at,
            Run.dispatches,
            Run.status,
            Run.waiting_for,
        ]
        if _HAS_USAGE:
            columns.append(Run.usage)
        run = conn.execute(select(*columns).where(Run.run_id == run_id)).one_or_none()
        if run is None:
            return None
        opening = run_opening(run.entry)
        finished = run_end_status(run.status) is not None
        ctx = _RunCtx(
            run.run_id, opening.plan, opening.root, run.updated_at, run.dispatches, finished
        )
        ctx.workflow = opening.kind is EntryKind.WORKFLOW
        ctx.status = run.status
        unfinished = []
        used = run.usage if _HAS_USAGE else None
        if isinstance(used, Mapping):
            ctx.usage = {"tokens": used.get("tokens", 0), "usd": used.get("usd", 0.0)}
        for ltid, kind, step_id, on, state in conn.execute(
            select(Task.ltid, Task.kind, Task.step_id, Task.blocked_on, Task.state).where(
                Task.run_id == run.run_id
            )
        ):
            ctx.tasks[ltid] = (kind, step_id)
            if not finished and task_end_status(state) is None:
                unfinished.append((ltid, kind, step_id, state, on))
            if on is not None:  # what _dispatch and _step_held wrote
                if on.startswith("receive "):
                    ctx.receiving.add(ltid)
                elif on.startswith("waiting: "):
                    ctx.held.add(ltid)
        for step_id, status, tool, attempts in conn.execute(
            select(Step.step_id, Step.status, Step.tool, Step.attempts)
            .where(Step.run_id == run.run_id)
            .order_by(Step.position)
        ):
            ctx.steps[step_id] = _StepInfo(status, tool, _reruns_in(attempts))
        ctx.waits = RunWaits.reloaded(opening.plan, ctx.root, unfinished, run.waiting_for)
        self._ctx[run_no] = ctx
        self._finished += finished
        return ctx

    def load_run_ids(self, conn: Connection) -> None:
        """Map each run number to its latest start (a quarantined start maps to nothing)."""
        starts: list[tuple[int, int, str | None]] = [
            (int(seq or 0), int(no), str(rid))
            for no, rid, seq in conn.execute(
                select(Run.run_no, Run.run_id, Run.start_seq).where(self.own_runs())
            )
        ]
        starts += [
            (int(seq), int(no), None)
            for seq, no in conn.execute(
                select(DeadLetter.seq, DeadLetter.run_no).where(
                    DeadLetter.rtype == RecordType.RUN_START.name,
                    DeadLetter.seq > self._base,
                    DeadLetter.seq <= self._last,
                )
            )
        ]
        run_ids: dict[int, str] = {}
        for _seq, no, rid in sorted(starts, key=lambda s: s[0]):
            if rid is None:
                run_ids.pop(no, None)
            else:
                run_ids[no] = rid
        self.run_ids = run_ids
        self.run_ids_stale = False

    def own_runs(self) -> Any:
        """The SQL condition of this engine's runs (their RUN_START is in its seqs).

        Run numbers are per journal: another engine's run may have the same.
        """
        mine = (Run.start_seq > self._base) & (Run.start_seq <= self._last)
        return mine | Run.start_seq.is_(None) if self.shard == 0 else mine

    def forget(self) -> None:
        """Drop what memory holds of the rows (reloaded in the next transaction)."""
        self._ctx.clear()
        self._finished = 0
        self.run_ids.clear()
        self.run_ids_stale = True

    def evict(self) -> None:
        """Drop the contexts of the oldest finished runs beyond :data:`MAX_CACHED_FINISHED_RUNS`.

        A pass walks every context, so it runs once a quarter of that many
        runs have finished, not after each batch (a walk of hundreds of
        contexts was a tenth of a small batch's time).
        """
        if self._finished < MAX_CACHED_FINISHED_RUNS // 4:
            return
        self._finished = 0
        finished = [no for no, ctx in self._ctx.items() if ctx.finished]
        for no in finished[: max(0, len(finished) - MAX_CACHED_FINISHED_RUNS)]:
            del self._ctx[no]


def _reused(reuse: Mapping[Any, Any], clock: float | None) -> dict[str, dict[str, Any]]:
    """The rows' settled columns of a re-run's reused steps, by step id, in ``reuse``'s order.

    They succeed at the run's start, as its planner settles them there, with
    the earlier output; their one attempt names the run and seq it was
    recorded at.
    """
    out: dict[str, dict[str, Any]] = {}
    for sid, given in reuse.items():
        if isinstance(given, Mapping):
            origin = {"run_id": given.get("run_id"), "seq": given.get("seq")}
            if given.get("projected"):  # the journal no longer held it (rerun.py)
                origin["projected"] = True
            out[text(sid)] = {
                "status": _SUCCEEDED,
                "output": given.get("output"),
                "attempts": [{"attempt": 1, "reused": origin}],
                "started_at": clock,
                "ended_at": clock,
            }
    return out


def _made(row: dict[str, Any] | None, name: str, rec: Any) -> Any:
    """``jsonable(rec.<name>)``: the record's journal row made it already (else made now)."""
    data = row["data"] if row is not None else None
    if data.__class__ is dict and name in data:
        return data[name]
    return jsonable(getattr(rec, name))


def _part(made: Any, key: str, raw: Any) -> Any:
    """``jsonable(raw)``, taken from ``made`` (its parent made JSON-able) when it holds ``key``.

    The part was made one level down its parent, so a value nested exactly
    ``MAX_JSON_DEPTH`` deep is cut one level sooner than on its own: the
    same way every time, in a rebuild as in the live projection.
    """
    if made.__class__ is dict and key in made:
        return made[key]
    return jsonable(raw)


def _is_slot(rec: Any) -> bool:
    """True for the WAKE that gives a limited run its slot (``SLOT_SIGNAL``)."""
    value = rec.value
    return (
        rec.ltid == 0
        and rec.cause == "signal"
        and isinstance(value, list | tuple)
        and len(value) > 0
        and value[0] == SLOT_SIGNAL
    )
