"""An agent step's conversation, read back from what its journal recorded.

An ``agent`` step (``tiffany/agents/tools/agent.py``) runs each model call
and each tool call as a child task of its worker, labelled at its SPAWN
(``role`` ``tool``, the step, and the tool: ``llm`` for a model call), and
running one durable step whose result is the task's exit value: the
model's reply (``content``, ``tool_calls`` with their ``arguments``,
``usage``, ``cost_usd``, ``model``) or the tool's output. The store keeps
those tasks (``tasks``: state, result, error) and the SPAWN records
(``journal_records``): :func:`agent_conversation` puts them back in order
as turns, each the model's text and the tool calls it asked for, with
their arguments and what they returned. Nothing is re-derived from a task's
name: the label is the record's.

Invariants:
    * Tasks are read in ``ltid`` order, the order they were spawned: a
      turn is a model call and the tool tasks spawned after it, up to the
      next model call.
    * A tool call is matched to the next tool task of its turn with the
      same tool, in order. A call with no task (the step did not list the
      tool, its arguments were refused, or the tool runs inside the worker)
      has none: its ``ok`` is the step's output's word for it once the
      step has one (its ``calls``, in order), else null.
    * Attempts: a retried step runs the loop again from turn 1. A task
      belongs to the last attempt that started at or before it (both times
      are the run's journaled clock).

Discussion: the messages sent to the model (the goal, each tool result as
the model read it) are not journaled: they are a pure function of the
step's arguments and the results above, rebuilt by the loop on replay.
The goal is given as the step's declared ``args`` (a template the page
resolves as it does a step's arguments).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from tiffany.store.graph import plan_graph
from tiffany.store.journal import records_span
from tiffany.store.models import JournalRecord, Run, Step, Task, TaskKind
from tiffany.store.queries import TASK_STATUS
from tiffany.wire.entries import reading
from tiffany.wire.records import RecordType

__all__ = ["AGENT_TOOL", "MODEL_TOOL", "NotAgentStep", "agent_conversation"]

#: The tool whose steps hold a conversation.
AGENT_TOOL: Final = "agent"
#: The tool label of a model call's task (``TaskLabel("tool", step, "llm")``).
MODEL_TOOL: Final = "llm"


class NotAgentStep(Exception):
    """The step exists but is not an ``agent`` step: it holds no conversation."""

    def __init__(self, tool: str | None) -> None:
        super().__init__(tool)
        self.tool = tool


def agent_conversation(session: Session, run_id: str, step_id: str) -> dict[str, Any] | None:
    """The conversation of agent step ``step_id`` of run ``run_id``; None: no such run or step.

    Returns:
        ``{"run_id", "step_id", "status", "args", "answer", "usage",
        "cost_usd", "turns": [{"attempt", "turn", "ltid", "status", "model",
        "text", "usage", "cost_usd", "error", "tool_calls": [{"id", "tool",
        "arguments", "ltid", "status", "ok", "result", "error"}]}]}``.
        ``answer``, ``usage`` and ``cost_usd`` are the step's output's (null
        until it has one); a turn's ``text`` is null until its call returned.

    Raises:
        NotAgentStep: The step's tool is not ``agent``.
    """
    conn = session.connection()
    run = conn.execute(
        select(Run.entry, Run.run_no, Run.start_seq).where(Run.run_id == run_id)
    ).one_or_none()
    if run is None:
        return None
    step = conn.execute(
        select(Step.tool, Step.status, Step.output, Step.attempts).where(
            Step.run_id == run_id, Step.step_id == step_id
        )
    ).one_or_none()
    if step is None:
        return None
    if step.tool != AGENT_TOOL:
        raise NotAgentStep(step.tool)
    tasks = conn.execute(
        select(
            Task.ltid,
            Task.kind,
            Task.state,
            Task.started_at,
            Task.result,
            Task.error,
        )
        .where(Task.run_id == run_id, Task.step_id == step_id, Task.kind == TaskKind.TOOL.value)
        .order_by(Task.ltid)
    ).all()
    labels = _labels(session, run_id, [t.ltid for t in tasks])
    output = step.output if isinstance(step.output, Mapping) else {}
    turns = _turns(tasks, labels, _attempt_starts(step.attempts))
    _settle_unmatched(turns, output.get("calls") if step.status == "succeeded" else None)
    return {
        "run_id": run_id,
        "step_id": step_id,
        "status": step.status,
        "args": _declared_args(session, run_id, run.entry, step_id),
        "answer": output.get("answer"),
        "usage": output.get("usage"),
        "cost_usd": output.get("cost_usd"),
        "turns": turns,
    }


def _labels(session: Session, run_id: str, ltids: list[int]) -> dict[int, str | None]:
    """The tool each task's SPAWN record names (``llm`` for a model call)."""
    if not ltids:
        return {}
    span = records_span(session, run_id)
    if span is None:
        return {}
    run_no, start, end = span
    rows = session.execute(
        select(JournalRecord.ltid, JournalRecord.data).where(
            JournalRecord.run_no == run_no,
            JournalRecord.seq >= start,
            JournalRecord.seq < end,
            JournalRecord.rtype == RecordType.SPAWN.name,
            JournalRecord.ltid.in_(ltids),
        )
    )
    out: dict[int, str | None] = {}
    for ltid, data in rows:
        tool = data.get("tool") if isinstance(data, Mapping) else None
        out[int(ltid)] = tool if isinstance(tool, str) else None
    return out


def _attempt_starts(attempts: Any) -> list[tuple[int, float]]:
    """``(attempt, started_at)`` of each attempt that says when it started."""
    out: list[tuple[int, float]] = []
    for i, a in enumerate(attempts if isinstance(attempts, list) else (), 1):
        if not isinstance(a, Mapping):
            continue
        at = a.get("started_at")
        if isinstance(at, int | float) and not isinstance(at, bool):
            n = a.get("attempt")
            out.append((n if isinstance(n, int) else i, float(at)))
    return out


def _attempt_of(started_at: Any, starts: list[tuple[int, float]]) -> int:
    found = 1
    if not isinstance(started_at, int | float):
        return starts[-1][0] if starts else found
    for n, at in starts:
        if at <= started_at:
            found = n
    return found


def _status(state: Any) -> str:
    return str(TASK_STATUS.get(state, state))


def _turns(
    tasks: Iterable[Any], labels: Mapping[int, str | None], starts: list[tuple[int, float]]
) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    attempt, number = 0, 0
    for t in tasks:
        tool = labels.get(t.ltid)
        if tool == MODEL_TOOL:
            at = _attempt_of(t.started_at, starts)
            if at != attempt:
                attempt, number = at, 0
            number += 1
            turns.append(_turn(t, attempt, number))
        elif turns:
            _match_call(turns[-1], t, tool)
    return turns


def _turn(task: Any, attempt: int, number: int) -> dict[str, Any]:
    reply = task.result if isinstance(task.result, Mapping) else {}
    asked = reply.get("tool_calls")
    calls: list[Any] = asked if isinstance(asked, list) else []
    return {
        "attempt": attempt,
        "turn": number,
        "ltid": task.ltid,
        "status": _status(task.state),
        "model": reply.get("model"),
        "text": reply.get("content") if reply else None,
        "usage": reply.get("usage"),
        "cost_usd": reply.get("cost_usd"),
        "error": task.error,
        "tool_calls": [
            {
                "id": c.get("id"),
                "tool": c.get("name"),
                "arguments": c.get("arguments"),
                "ltid": None,
                "status": None,
                "ok": None,
                "result": None,
                # arguments that were not JSON: what the model was told (agent.py)
                "error": {"message": c["invalid"]} if c.get("invalid") else None,
            }
            for c in calls
            if isinstance(c, Mapping)
        ],
    }


def _match_call(turn: dict[str, Any], task: Any, tool: str | None) -> None:
    """Give ``task`` (a tool task of ``turn``) to the turn's next unmatched call of its tool."""
    for call in turn["tool_calls"]:
        if call["ltid"] is None and call["tool"] == tool:
            status = _status(task.state)
            call.update(
                ltid=task.ltid,
                status=status,
                ok=True if status == "succeeded" else False if status == "failed" else None,
                result=task.result,
                error=task.error,
            )
            return


def _settle_unmatched(turns: list[dict[str, Any]], calls: Any) -> None:
    """Calls of the last attempt with no task: ``ok`` from the step's output's ``calls``."""
    if not isinstance(calls, list) or not turns:
        return
    last = turns[-1]["attempt"]
    made = [c for t in turns if t["attempt"] == last for c in t["tool_calls"]]
    for call, said in zip(made, calls, strict=False):
        if call["ltid"] is None and isinstance(said, Mapping) and said.get("tool") == call["tool"]:
            ok = said.get("ok")
            call["ok"] = ok if isinstance(ok, bool) else None
            call["status"] = "succeeded" if ok is True else "failed" if ok is False else None


def _declared_args(session: Session, run_id: str, entry: Any, step_id: str) -> Any:
    """The step's ``args`` as declared: in the plan, or in its dynamic parent's output."""
    typed = reading(entry)
    plan = typed.plan_doc if typed is not None else None
    node = plan_graph(plan, {}).get(step_id)
    if node is None:  # added by a dynamic step: the graph needs the outputs
        rows = session.execute(select(Step.step_id, Step.output).where(Step.run_id == run_id))
        outputs: dict[str, Any] = {str(sid): out for sid, out in rows}
        node = plan_graph(plan, outputs).get(step_id)
    return node.spec.get("args") if node is not None else None
