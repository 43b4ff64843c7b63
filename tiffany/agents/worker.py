"""The worker task (the seed's Task_Worker): one plan step, with its retries.

A worker resolves the step's references, validates the arguments against
the tool's model, and runs the tool as a *tool task* (Task_Tool) inside a
durable ``Step``. It waits for the tool task with the step's timeout and
kills it when the time is up; between attempts it sleeps with exponential
backoff through the kernel's (journaled, durable) timers. Every attempt is
recorded (start, end, outcome) in what the worker reports to the planner.

A tool that offers a ready-made step (``step_for``: the python tool for a
plain function) is run by the worker itself when the step has no timeout:
``yield step`` straight from the worker, journaled and replayed exactly as
inside a tool task. The worker asks for it ``timed`` and reporting (see
``_ready_step``): the attempt's ``started_at`` and ``ended_at`` are the
clock readings taken around the function, and a failure comes back as a
value; both are journaled with the step's result, so such an attempt needs
no ``Now()`` at all: one dispatch and one record (its STEP_START) before
the step, one wake-up (WAKE) after it. A tool task exists to be killed when its time is up; with
no timeout there is nothing to kill, and skipping it saves a task, its spawn,
its join and its exit per step (about a third of a trivial step's cost).

Discussion: rejected, a tool task for every step "for uniformity": the
task added nothing a journaled ``Step`` does not already give (the outcome is
journaled, a replay does not call the tool again, a crash re-runs a started
step at most once more), and cost a third of the plan's throughput.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tiffany.agents.budget import BudgetExceeded, Ledger, metered
from tiffany.agents.plan import OPAQUE_ARGS, Plan, StepSpec
from tiffany.agents.refs import RefError, resolve
from tiffany.agents.tools.base import ToolContext, ToolSettings
from tiffany.agents.tools.workspace import ensure_workspace
from tiffany.errors import TaskCrashed, TaskKilled, TiffanyError, WaitTimeout
from tiffany.kernel import KillTask, NewTask, Now, Queue, Sleep, Step, WaitTask
from tiffany.wire.records import JOURNAL_COMPAT, TaskLabel
from tiffany.wire.values import text_of

if TYPE_CHECKING:
    from tiffany.agents.registry import ToolRegistry

__all__ = ["AgentEnv", "StepOutcome", "error_info", "tool_call", "worker"]

Co = Generator[Any, Any, Any]

_NOW = Now()  # a Now() has no fields: one instance serves every yield

#: Validated plans kept for their planners (submissions not yet started).
MAX_VALIDATED_PLANS = 4_096
#: The first journal version whose workers end with their outcome as a dict
#: (:meth:`StepOutcome.record`), which the journal packs exactly.
EXACT_OUTCOME_COMPAT = 3


@dataclass(slots=True)
class AgentEnv:
    """What plan tasks need from the engine (rebuilt, not journaled, on recovery)."""

    registry: ToolRegistry
    workspace_root: Path
    settings: ToolSettings = field(default_factory=ToolSettings)
    emit: Callable[[str, str, Mapping[str, Any]], None] = lambda run_id, kind, data: None
    #: Child runs for ``plan.run`` (the engine's; ``tools/subplan.py``), or None.
    runs: Any = None
    #: Told of the steps a dynamic step added to run ``run_id`` (on the loop,
    #: and again when a replay adds them): the engine holds signals to their
    #: waits' schemas (``tools/signal.py``).
    steps_added: Callable[[str, list[Any]], None] = lambda run_id, steps: None
    #: Told when a workflow's ``tool(...)`` call ends (on the loop, in the calling task):
    #: ``(run_id, step_id, tool, outcome)``. The OTel recorder makes its attempts step
    #: spans, as it does a plan step's (``tiffany/observe/otel.py``).
    call_ended: Callable[[str, str, str, Any], None] = lambda run_id, step_id, tool, outcome: None
    #: The engine's MemoryStore for the ``memory.*`` tools (``tools/memory.py``), or
    #: None: this engine has none (a replay's: it never calls them).
    memory: Any = None

    # Plans validated at submission, keyed by the document's identity (the
    # document itself is held, so its id cannot be reused meanwhile).
    _validated: dict[int, tuple[Mapping[str, Any], Plan]] = field(default_factory=dict)

    def remember_plan(self, doc: Mapping[str, Any], plan: Plan) -> None:
        """Keep ``plan``, just validated from ``doc``, for the planner that will run it."""
        validated = self._validated
        if len(validated) >= MAX_VALIDATED_PLANS:
            # Submissions validate on several threads: a racing eviction is harmless.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del validated[next(iter(validated))]
        validated[id(doc)] = (doc, plan)

    def validated_plan(self, doc: Mapping[str, Any]) -> Plan | None:
        """Return (once) the plan :meth:`remember_plan` kept for this very document."""
        hit = self._validated.pop(id(doc), None)
        return hit[1] if hit is not None and hit[0] is doc else None

    def copy_workspace(self, source_run: str, run_id: str) -> dict[str, Any]:
        """Copy run ``source_run``'s workspace into ``run_id``'s (a re-run's first step).

        Blocking (a durable step runs it in the thread pool). Files already
        there are overwritten (a step re-run after a crash copies again).
        """
        source = self.workspace_root / source_run
        target = self.workspace(run_id)
        if not source.is_dir():
            return {"from": source_run, "files": 0, "missing": True}
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        return {"from": source_run, "files": sum(1 for p in target.rglob("*") if p.is_file())}

    def workspace(self, run_id: str) -> Path:
        """Return the run's workspace directory, made if missing (blocking: a thread's).

        A step's tool gets the path alone (``ToolContext.workspace``): the
        tools that use the directory make it when they do (in their thread),
        so a step that never touches it (``sleep``, ``llm``) costs the
        scheduler thread no ``mkdir``.
        """
        return ensure_workspace(self.workspace_root / run_id)


@dataclass(slots=True)
class StepOutcome:
    """What a worker reports to the planner."""

    step_id: str
    ok: bool
    output: Any = None
    error: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The outcome as the worker's journaled result (version 3 on): a plain dict.

        Its keys are the fields', in order, as the dataclass was journaled
        before; but as a dict its ``output`` is packed exactly
        (``tiffany/wire/values.py``): a dataclass goes through ``to_builtins``,
        which made tuples and sets lists and bytes base64 text.
        """
        return {
            "step_id": self.step_id,
            "ok": self.ok,
            "output": self.output,
            "error": self.error,
            "attempts": self.attempts,
        }


def error_info(exc: BaseException) -> dict[str, Any]:
    """Return a JSON-able description of an error (code, type, message, fields).

    Its text is as the journal keeps text (:func:`~tiffany.wire.values.text_of`):
    a message holding a lone surrogate (a remote server's, a model's) is
    kept escaped, and a ``__str__`` that raises is named, so that a failed
    attempt is journaled with its message instead of failing again as a
    value that cannot be journaled. Besides the scalar fields, it keeps a
    model call's ``usage`` (its token counts: an error raised after the
    model answered carries them, and the run's budget counts them:
    ``budget.py``) and a ``python`` function's ``traceback``: the frames of
    the user's code, taken where it was caught (``tracebacks.py``; the
    fields are journaled with the error, so a replay gives the same).
    """
    info: dict[str, Any] = {"type": type(exc).__name__, "message": text_of(exc)}
    if isinstance(exc, TiffanyError):
        info["code"] = exc.code
        info.update(
            {
                k: text_of(v) if isinstance(v, str) else v
                for k, v in exc.fields.items()
                if isinstance(v, str | int | float | bool)
            }
        )
        frames = exc.fields.get("traceback")
        if isinstance(frames, list) and frames:
            info["traceback"] = [dict(f) for f in frames if isinstance(f, Mapping)]
        used = exc.fields.get("usage")
        if isinstance(used, Mapping):
            info["usage"] = {
                str(k): v
                for k, v in used.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
    return info


def _tool_task(tool: Any, args: Any, ctx: ToolContext, name: str) -> Co:
    """Task_Tool: run the tool inside a durable step.

    A tool may offer ``step_for(args)``: a ready-made step (the python tool
    calls a plain function straight from the thread pool that way; it needs
    no context); otherwise its ``run`` is the step, named after the tool (the
    engine's step gate reads a step's tool from its name: ``registry.py``).
    """
    step_for = getattr(tool, "step_for", None)
    step = step_for(args, ctx.settings) if step_for is not None else None
    if step is None:
        step = Step(tool.run, args, ctx, name=name)
    return (yield step)


def _has_refs(value: Any) -> bool:
    """True if ``value`` may hold a ``${...}`` reference (then ``resolve`` it).

    A plain walk with a substring test: most step arguments have no
    reference, and ``resolve`` (a regex per string, a copy of every
    container) costs more than the validation that follows it. Containers
    other than plain dicts and lists answer True (``resolve`` decides).
    """
    cls = value.__class__
    if cls is str:
        return "${" in value
    if cls is dict:
        value = value.values()
    elif cls is not list:
        return isinstance(value, Mapping | list)
    for v in value:  # a loop, not any(genexpr): this runs for every step
        c = v.__class__
        if c is str:
            if "${" in v:
                return True
        elif c is not int and c is not float and c is not bool and v is not None and _has_refs(v):
            return True
    return False


def _ready_step(tool: Any, args: Any, spec: StepSpec, settings: ToolSettings) -> Step | None:
    """Return the step the worker runs itself (no tool task), or None.

    Only a durable tool's ready-made step (``step_for``), and only without a
    timeout: enforcing one means killing a task, so that case keeps the tool
    task. The step is made to report instead of raise, and timed: its result
    is ``[[ok, value or error info], started, ended]`` (see ``_reporting``).
    A tool that cannot make its step (an unknown function) gets None: the
    tool task reports that as the attempt's failure.
    """
    step_for = getattr(tool, "step_for", None)
    if step_for is None or spec.timeout_s is not None or not tool.durable:
        return None
    try:
        step: Step | None = step_for(args, settings)
    except TiffanyError:
        return None
    if step is not None:
        step.fn, step.args = _reporting, (step.fn, step.args)
        step.timed = True
    return step


def _reporting(fn: Callable[..., Any], args: tuple[Any, ...]) -> list[Any]:
    """Call a ready-made step's function: ``[True, value]``, or ``[False, error info]``.

    Discussion: the outcome of a failed attempt travels as a value, not an
    exception, so that it comes back with the step's clock readings (an
    exception carries none) and the attempt needs no ``Now()`` before or
    after it. It is journaled as the step's result, so a replay rebuilds the
    same attempt record without calling ``fn``. Only ``Exception`` is
    reported; a cancellation still unwinds the worker.
    """
    try:
        return [True, fn(*args)]
    except Exception as exc:  # noqa: BLE001 - the attempt's failure, reported to the worker
        return [False, error_info(exc)]


def _run_tool(tool: Any, args: Any, ctx: ToolContext, spec: StepSpec) -> Co:
    """Run the tool as a tool task (with the step's timeout), or in the worker if not durable."""
    if not tool.durable:
        return (yield tool.run(args, ctx))
    tid = yield NewTask(
        _tool_task(tool, args, ctx, spec.tool),
        name=f"tool:{spec.tool}:{spec.id}",
        meta=TaskLabel("tool", spec.id, spec.tool),
    )
    try:
        return (yield WaitTask(tid, timeout=spec.timeout_s))
    except WaitTimeout:
        yield KillTask(tid)
        raise TiffanyError(
            f"step {spec.id} timed out after {spec.timeout_s} s", timeout_s=spec.timeout_s
        ) from None


def worker(
    env: AgentEnv,
    run_id: str,
    spec: StepSpec,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    results: Queue[StepOutcome],
    compat: int = JOURNAL_COMPAT,
    workspace: Path | None = None,
    ledger: Ledger | None = None,
) -> Co:
    """Run one step to success or to the end of its retries; report to ``results``.

    ``compat`` is the journal version the run started under: a change to
    the calls this function yields bumps ``JOURNAL_COMPAT`` and keeps the
    old sequence for runs of older versions (docs/wal-format.md, "Versions").
    ``workspace`` is the run's workspace path (default: made from
    ``run_id``; the planner makes it once for all its steps). ``ledger``:
    the run's budget (``budget.py``; None without one, or before version 3).

    The task's result (its TASK_EXIT, the record that settles the step) is
    the outcome: from version 3 on as a dict (:meth:`StepOutcome.record`),
    which the journal packs exactly (tuples, sets, bytes in the output
    stay what they were: a re-run reuses the output from it); before, the
    :class:`StepOutcome` itself, as those runs journaled it.
    """
    outcome = yield from _attempts(env, run_id, spec, inputs, outputs, workspace, ledger)
    results.put(outcome)
    return outcome.record() if compat >= EXACT_OUTCOME_COMPAT else outcome


def tool_call(
    env: AgentEnv,
    run_id: str,
    spec: StepSpec,
    workspace: Path | None = None,
    ledger: Ledger | None = None,
) -> Co:
    """One tool call outside a plan (a workflow's ``tool(...)``); returns the :class:`StepOutcome`.

    The step's attempts exactly as a plan's worker makes them (arguments
    checked against the tool's model, a tool task or a ready-made step,
    retries, the step's timeout, the run's budget ``ledger``), in the
    calling task, with no ``${...}`` reference resolved: the arguments are
    values already.
    """
    return (yield from _attempts(env, run_id, spec, {}, {}, workspace, ledger, refs=False))


def _attempts(
    env: AgentEnv,
    run_id: str,
    spec: StepSpec,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    workspace: Path | None,
    ledger: Ledger | None,
    *,
    refs: bool = True,
) -> Co:
    """The step's attempts (:func:`worker`); returns the :class:`StepOutcome`.

    ``refs``: resolve the arguments' ``${...}`` references (a plan's step).
    """
    outcome = StepOutcome(spec.id, False)
    try:
        # Enabled or not: the engine holds a disabled tool's step (registry.py).
        tool = env.registry.lookup(spec.tool)
        args = _tool_args(tool, spec, inputs, outputs, refs=refs)
    except ValidationError as exc:
        outcome.error = _args_error(exc)
        return outcome
    except (RefError, TiffanyError) as exc:
        outcome.error = error_info(exc)
        return outcome
    how = metered(tool) if ledger is not None else None
    for attempt in range(1, spec.retries + 2):
        if how == "call" and ledger is not None and ledger.spent():
            # Refused before the model is called: the budget is spent (budget.py).
            refused = error_info(ledger.exceeded(f"step {spec.id} attempt {attempt}"))
            outcome.attempts.append({"attempt": attempt, "ok": False, "error": refused})
            outcome.error = refused
            return outcome
        step = _ready_step(tool, args, spec, env.settings)
        if step is not None:
            ok, output, record = yield from _step_attempt(step, attempt)
        else:
            ctx = _tool_context(env, run_id, spec, attempt, workspace, ledger)
            ok, output, record = yield from _tool_attempt(tool, args, ctx, spec)
        outcome.attempts.append(record)
        if ok:
            if ledger is not None and how != "self" and _crossed(ledger, output):
                outcome.output = output  # bought past the budget: shown, not used
                outcome.error = error_info(ledger.exceeded(f"step {spec.id}'s usage"))
            else:
                outcome.ok, outcome.output = True, output
            return outcome
        outcome.error = output
        if ledger is not None:
            stops = _budget_stops(ledger, how, output)
            if stops:
                return outcome
            if stops is None:
                continue
        yield from _back_off(env, run_id, spec, attempt)
    return outcome


def _tool_args(
    tool: Any,
    spec: StepSpec,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    *,
    refs: bool = True,
) -> Any:
    """The step's arguments, references resolved (``refs``), validated by the tool's ``Args``.

    Raises:
        ValidationError: The arguments do not fit the tool.
        RefError: A reference names no input or earlier output.
    """
    raw = spec.args
    opaque = OPAQUE_ARGS.get(spec.tool) if refs else None
    if opaque:  # resolved without them, then put back as they are
        kept = {k: raw[k] for k in opaque if k in raw}
        rest = {k: v for k, v in raw.items() if k not in opaque}
        raw = {**(resolve(rest, inputs, outputs) if _has_refs(rest) else rest), **kept}
    return tool.Args.model_validate(
        resolve(raw, inputs, outputs) if refs and not opaque and _has_refs(raw) else raw
    )


def _args_error(exc: ValidationError) -> dict[str, Any]:
    """The step's error when its arguments do not fit its tool: every field named."""
    fields = "; ".join(
        f"args.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
        for e in exc.errors(include_url=False)
    )
    return {"type": "ValidationError", "code": "plan.args", "message": fields}


def _step_attempt(step: Step, attempt: int) -> Co:
    """One attempt as the worker's own journaled step; returns ``(ok, output or error, record)``."""
    try:
        (ok, output), started, ended = yield step
    except TiffanyError as exc:  # a result the journal refused (the step reports the rest)
        (ok, output), started, ended = (False, error_info(exc)), None, None
    record: dict[str, Any] = {"attempt": attempt, "started_at": started, "ok": ok}
    if not ok:
        record["error"] = output
    record["ended_at"] = ended
    return ok, output, record


def _tool_context(
    env: AgentEnv,
    run_id: str,
    spec: StepSpec,
    attempt: int,
    workspace: Path | None,
    ledger: Ledger | None,
) -> ToolContext:
    return ToolContext(
        run_id,
        spec.id,
        attempt,
        workspace or env.workspace_root / run_id,  # made by the first tool needing it
        env.settings,
        _emitter(env, run_id, spec.id),
        env.runs,
        env.registry,
        ledger,
        memory=env.memory,
    )


def _tool_attempt(tool: Any, args: Any, ctx: ToolContext, spec: StepSpec) -> Co:
    """One attempt as a tool task (:func:`_run_tool`); returns ``(ok, output or error, record)``."""
    started = yield _NOW
    record: dict[str, Any] = {"attempt": ctx.attempt, "started_at": started}
    try:
        output = yield from _run_tool(tool, args, ctx, spec)
    except TaskCrashed as exc:
        cause = exc.__cause__ or exc
        record.update(ok=False, error=error_info(cause))
    except (TiffanyError, TaskKilled) as exc:
        record.update(ok=False, error=error_info(exc))
    else:
        record["ok"] = True
        record["ended_at"] = yield _NOW
        return True, output, record
    record["ended_at"] = yield _NOW
    return False, record["error"], record


def _crossed(ledger: Ledger, output: Any) -> bool:
    """Charge a succeeded attempt's usage; True if it leaves the run past its budget."""
    return ledger.charge(output) and ledger.over()


def _budget_stops(ledger: Ledger, how: str | None, error: Any) -> bool | None:
    """Charge a failed attempt's usage; whether the budget ends the step's retries.

    True: the failure was the budget's (an agent's turn it refused): no
    retry. None: a model call while the budget is spent: the next attempt
    is refused at once (recorded), with no back-off before it. False: retry
    as the step says.
    """
    if how != "self":
        ledger.charge(error)
    if isinstance(error, Mapping) and error.get("code") == BudgetExceeded.code:
        return True
    if how == "call" and ledger.spent():
        return None
    return False


def _back_off(env: AgentEnv, run_id: str, spec: StepSpec, attempt: int) -> Co:
    """After a failed attempt with retries left: report it and sleep (durable timer)."""
    if attempt <= spec.retries:
        delay = spec.backoff * (2 ** (attempt - 1))
        env.emit(run_id, "step.retry", {"step": spec.id, "attempt": attempt, "delay_s": delay})
        if delay > 0:
            yield Sleep(delay)


def _emitter(env: AgentEnv, run_id: str, step_id: str) -> Callable[[str, Mapping[str, Any]], None]:
    def emit(kind: str, data: Mapping[str, Any]) -> None:
        env.emit(run_id, kind, {"step": step_id, **data})

    return emit
