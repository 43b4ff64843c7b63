"""The engine's composition root: kernel + durable runtime + agents (+ PAL, store).

:func:`build` wires a :class:`~tiffany.durable.Runtime` whose ``plan``
entries run through the agents layer, with the tools the operator enabled.
``tiffany run`` uses it in-process; ``tiffany serve`` (the engine process)
adds the activity log, the store projector and the control channel.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiffany.agents.concurrency import SLOT_SIGNAL, Slots, entry_concurrency, spec_of
from tiffany.agents.rate_limits import RateLimiter
from tiffany.config import Settings, parse_rate_limits
from tiffany.durable import Runtime
from tiffany.durable.records import unpack_error
from tiffany.engine.children import ChildLimits, RunTree, TreeClosed
from tiffany.engine.plan_cache import PlanCache
from tiffany.errors import LimitExceeded, UnjournalableValue
from tiffany.kernel import Instrument, SlowDispatchWatchdog
from tiffany.observe.otel import attach_from_env
from tiffany.wal import Log, Source
from tiffany.wire.entries import Entry, read_entry
from tiffany.wire.records import CHILD_SIGNAL_PREFIX, reserved_signal
from tiffany.wire.shards import engine_stream, seq_base, seq_last
from tiffany.wire.values import text_of, unpack_value

if TYPE_CHECKING:
    from tiffany.agents import AgentEnv
    from tiffany.agents.tools.base import ToolSettings
    from tiffany.agents.tools.signal import RunSignals

# The agents (plans, tools: a heavy share of the imports) are imported where
# they are used: the projector's process imports this package, and needs none.

__all__ = ["Engine", "build", "replay_resolvers", "take_slot", "tool_settings"]

#: Held steps listed in the engine's status (the count is always exact).
MAX_WAITING_LISTED = 100


def tool_settings(settings: Settings, *, server: bool = False) -> ToolSettings:
    """Return the tools' settings taken from the process settings.

    ``server``: the engine of ``tiffany serve``; its ``auto`` shell sandbox
    is bubblewrap or a refusal, never an unsandboxed fallback (docs/security.md).
    """
    from tiffany.agents.tools.base import ToolSettings
    from tiffany.agents.tracebacks import TracebackLimits

    return ToolSettings(
        llm_base_url=settings.llm_base_url,
        llm_model=settings.llm_model,
        llm_api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        llm_script=str(settings.llm_script) if settings.llm_script else None,
        shell_sandbox=settings.shell_sandbox,
        shell_fallback=not server,
        http_allow=tuple(settings.http_allow),
        traceback=TracebackLimits(settings.traceback_frames, settings.traceback_chars),
    )


@dataclass(slots=True)
class Engine:
    """A runtime ready to take plans."""

    runtime: Runtime
    env: AgentEnv
    watchdog: SlowDispatchWatchdog
    #: The bounds on child runs (``children.py``).
    child_limits: ChildLimits
    #: The most steps a run may have, its dynamic ones included (``max_steps``):
    #: written into each run's entry, so its replay applies the same bound.
    max_steps: int | None = None
    #: Concurrency limits' slots (``concurrency.py``), on the loop only.
    slots: Slots = field(init=False)
    #: The tree of child runs: bounds, closing on cancel (``children.py``), on the loop.
    tree: RunTree = field(init=False)
    #: Whether a run id is taken, beyond the runs the journal holds (the
    #: service adds the finished runs its run table remembers).
    known_run: Callable[[str], bool] = lambda run_id: False
    #: Told of each child run started (the service's run table), and its end.
    child_started: Callable[[str], None] = lambda run_id: None
    child_ended: Callable[[Any], None] | None = None

    #: Plans validated already, by content (``plan_cache.py``).
    plans: PlanCache = field(init=False, default_factory=PlanCache)
    #: The signals each running plan run's steps wait for, with their payload
    #: schemas (``tools/signal.py``): set on the loop (a run's start, a dynamic
    #: step's new steps, its end), read by the control threads that take
    #: signals (each value is replaced, never changed).
    signals: dict[str, RunSignals] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.slots = Slots(self._request_slot)
        self.tree = RunTree(self.child_limits, self.runtime.journal.request_cancel)
        self.env.steps_added = self._steps_added

    def _watch_signals(self, run_id: str, entry: Entry) -> None:
        """Hold run ``run_id``'s signals to its plan's waits (a code run has none known)."""
        from tiffany.agents.tools.signal import RunSignals

        plan = entry.plan_doc
        if plan is not None:
            defaults = plan.get("inputs")
            inputs = {**(defaults if isinstance(defaults, Mapping) else {}), **entry.run_inputs}
            self.signals[run_id] = RunSignals.of_steps(plan.get("steps"), inputs)
        elif entry.workflow_name is not None:  # its waits' schemas are told as it reaches them
            self.signals[run_id] = RunSignals.open()

    def _steps_added(self, run_id: str, steps: list[Any]) -> None:
        """A dynamic step added ``steps`` to a running run: their waits count too."""
        known = self.signals.get(run_id)
        if known is not None:
            self.signals[run_id] = known.plus(steps, {})

    def awaited(self, run_id: str) -> list[dict[str, Any]]:
        """The signals run ``run_id``'s tasks are parked on now, with each wait's schema (the loop).

        ``[{"name", "schema"}]``, names sorted; ``schema`` the one the wait
        declared (a plan's step, or told by a workflow's ``signal(...)`` as it
        was reached: ``_steps_added``), or None.
        """
        known = self.signals.get(run_id)
        return [
            {"name": name, "schema": None if known is None else known.schema(name)}
            for name in self.runtime.journal.awaited_signals(run_id)
            if reserved_signal(name) is None  # a child's end, a slot: the engine's own
        ]

    def cancel(self, run_id: str, reason: str = "cancelled") -> bool:
        """Cancel a running run (on the loop); False if it already ended.

        Its tree starts no child from now on (``children.py``); then the
        journal cancels it at the next wait stage, and its children after it.
        """
        run = self.runtime.journal.runs.get(run_id)
        if run is None or run.status != "running":
            return False
        self.tree.close(run_id, reason)
        return self.runtime.journal.request_cancel(run_id, reason)

    def submit_plan(
        self,
        doc: Mapping[str, Any],
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
    ) -> str:
        """Start a plan run (validated first); return its run id."""
        entry, name = self.prepare_plan(doc, inputs)
        return self.start_entry(entry, run_id=run_id, name=name)

    def start_entry(
        self,
        entry: dict[str, Any],
        *,
        run_id: str | None = None,
        name: str | None = None,
        on_end: Callable[[Any], None] | None = None,
        fork: tuple[list[tuple[int, bytes]], int | None] | None = None,
    ) -> str:
        """Start a run (on the loop's thread, or before it runs); return its id.

        A run with a concurrency limit gets its slot or queues (``concurrency.py``).
        ``fork``: a workflow's re-run: the earlier run's records its journal
        begins with, and their journal version (``tiffany/durable/fork.py``).
        """
        typed = read_entry(entry)
        spec = spec_of(typed)
        on_end = self._ending(typed, on_end)
        records, compat = fork if fork is not None else (None, None)
        forked: dict[str, Any] = {} if records is None else {"fork": records}
        if compat is not None:
            forked["compat"] = compat
        if spec is None:
            run_id = self.runtime.submit_entry(
                entry, run_id=run_id, name=name, on_end=on_end, **forked
            )
            self._watch_signals(run_id, typed)
            return run_id
        run_id = self.runtime.submit_entry(
            entry, run_id=run_id, name=name, on_end=self._releasing(on_end), **forked
        )
        self._watch_signals(run_id, typed)
        run = self.runtime.journal.runs[run_id]
        if any(_signal_name(w) == SLOT_SIGNAL for _, w in _wakes(run)):
            self.slots.holding(run_id, spec[0])  # a fork whose copy holds the slot's signal
        else:
            self.slots.admit(run_id, *spec)
        return run_id

    def recover_runs(
        self, on_end: Callable[[Any], None] | None = None, only: Iterable[str] | None = None
    ) -> list[str]:
        """``Runtime.recover``, then ``on_end`` on each resumed run and their slots rebuilt."""
        resumed = self.runtime.recover(only)
        index = self.runtime.index
        assert index is not None  # recover() sets it
        journal = self.runtime.journal
        limited = []
        for run_id in resumed:
            run = journal.runs[run_id]
            entry = read_entry(index.get(run_id).entry)  # resolved: recover() read it
            self._watch_signals(run_id, entry)
            spec = spec_of(entry)
            ending = self._ending(entry, on_end)
            if spec is None:
                run.on_end = ending
                continue
            run.on_end = self._releasing(ending)
            # Its slot is the engine's own signal, by name (a client cannot send it).
            holds = any(_signal_name(w) == SLOT_SIGNAL for _, w in _wakes(run))
            limited.append((run.run_no, run_id, *spec, holds))
        self.slots.recover((r, k, n, h) for _, r, k, n, h in sorted(limited))
        live = set(resumed)
        runs = sorted(index.runs.values(), key=lambda i: i.first_seq)
        orphans = self.tree.recover(
            (
                i.run_id,
                i.entry.get("parent") if isinstance(i.entry, Mapping) else None,
                not i.finished,
            )
            for i in runs
        )
        for orphan in orphans:  # its parent ended: the cancel it asked for was lost
            if orphan in live:
                journal.request_cancel(orphan, "its parent run ended")
        self._missed_ends(runs, live)
        return resumed

    def _missed_ends(self, runs: Iterable[Any], live: set[str]) -> None:
        """Give a recovered parent the end of each child that ended without telling it.

        A child's end reaches its parent as the engine's own signal at the
        wait stage after the child's RUN_END; an engine that stopped in
        between left the parent waiting. The child's own journal (its
        RUN_END, in the start-up index) says how it ended.
        """
        journal = self.runtime.journal
        for info in runs:
            parent = info.entry.get("parent") if isinstance(info.entry, Mapping) else None
            if not info.finished or not isinstance(parent, Mapping):
                continue
            parent_id = parent.get("run_id")
            if parent_id not in live:
                continue
            name = CHILD_SIGNAL_PREFIX + info.run_id
            if any(_signal_name(w) == name for _, w in _wakes(journal.runs[parent_id])):
                continue
            result = unpack_value(info.result)
            outputs = result.get("outputs") if isinstance(result, Mapping) else None
            error = None
            if info.status != "succeeded" and isinstance(info.result, list | tuple):
                error = text_of(unpack_error(info.result))[:2000]
            end = child_end(info.run_id, info.status, outputs, error)
            self._tell_parent(parent_id, name, end, f"end:{info.run_id}")

    def _tell_parent(self, parent_id: str, name: str, end: dict[str, Any], signal_id: str) -> None:
        """Journal a child's end for its parent's ``plan.run`` step (the engine's own signal).

        A child whose outputs cannot be journaled in the signal fails the
        parent's step instead (``plan.child_failed``), with why.
        """
        journal = self.runtime.journal
        try:
            journal.request_internal_signal(parent_id, name, end, signal_id)
        except UnjournalableValue as exc:
            end = {**end, "status": "failed", "outputs": None, "error": exc.message}
            journal.request_internal_signal(parent_id, name, end, signal_id)

    # -- child runs (plan.run: tiffany/agents/tools/subplan.py) ---------------------

    def start_child(
        self, parent: str, step: str, child: str, plan: Any, inputs: Any
    ) -> dict[str, Any]:
        """Start run ``child`` of ``plan`` for ``parent``'s step (an inline step: the loop).

        A no-op for a child that exists (the step ran again after a crash).
        An invalid plan is an answer (``{"error"}``), not an exception: the
        step fails with it.
        """
        from tiffany.agents import PlanError
        from tiffany.wire.documents import DocumentError, check
        from tiffany.workflows import WorkflowInputError, prepare_workflow

        if child in self.runtime.journal.runs or self.known_run(child):
            return {"run_id": child, "existing": True}
        try:
            if isinstance(plan, str):  # a workflow's child(NAME, inputs)
                check(inputs, loc=["inputs"])
                entry, name = prepare_workflow(plan, inputs)
            else:
                entry, name = self.prepare_plan(plan, inputs)
        except (PlanError, WorkflowInputError, DocumentError) as exc:
            return {"error": exc.message}
        try:  # the bounds on child runs, and a tree being cancelled (children.py)
            fields = self.tree.admit(parent)
        except (LimitExceeded, TreeClosed) as exc:
            return {"refused": exc.to_dict()}
        entry["parent"] = {"run_id": parent, "step": step, **fields}
        self.start_entry(entry, run_id=child, name=name, on_end=self.child_ended)
        self.tree.started(parent, child, fields)
        self.child_started(child)
        return {"run_id": child}

    def _ending(
        self, entry: Entry, on_end: Callable[[Any], None] | None
    ) -> Callable[[Any], None] | None:
        """``on_end``, after the run's children still running are asked to cancel.

        For a child run (``plan.run``), also its end sent to its parent: the
        engine's own signal ``child:<id>``, taken from the child's end
        (its RUN_END), through the path no client request reaches.
        """
        parent = entry.parent
        if parent is None or not isinstance(parent.get("run_id"), str):

            def parent_ended(state: Any) -> None:
                self.signals.pop(state.run_id, None)
                self.tree.ended(state.run_id)
                if on_end is not None:
                    on_end(state)

            return parent_ended
        parent_id = parent["run_id"]

        def ended(state: Any) -> None:
            self.signals.pop(state.run_id, None)
            self.tree.ended(state.run_id)
            result = state.result if isinstance(state.result, Mapping) else {}
            end = child_end(
                state.run_id,
                state.status,
                result.get("outputs"),
                None if state.error is None else text_of(state.error)[:2000],
            )
            name = CHILD_SIGNAL_PREFIX + state.run_id
            self._tell_parent(parent_id, name, end, f"end:{state.run_id}")
            if on_end is not None:
                on_end(state)

        return ended

    def _releasing(self, on_end: Callable[[Any], None] | None) -> Callable[[Any], None]:
        def ended(state: Any) -> None:
            self.slots.release(state.run_id)
            if on_end is not None:
                on_end(state)

        return ended

    def _request_slot(self, run_id: str, payload: dict[str, Any], signal_id: str) -> bool:
        return self.runtime.journal.request_internal_signal(run_id, SLOT_SIGNAL, payload, signal_id)

    def prepare_plan(
        self,
        doc: Mapping[str, Any],
        inputs: Mapping[str, Any] | None = None,
        *,
        checked: bool = False,
    ) -> tuple[dict[str, Any], str]:
        """Validate a plan and its inputs; return its run entry and name.

        Pure (any thread): the service validates off the scheduler thread.
        ``checked``: the document passed ``tiffany.wire.documents.check`` already.

        Raises:
            PlanError: The plan or an input is invalid (``errors`` name the fields).
        """
        from tiffany.agents import PlanError, parse_plan, plan_entry
        from tiffany.agents.plan import check_inputs
        from tiffany.agents.tools.python import check_python_steps

        if not isinstance(doc, Mapping):
            raise PlanError([{"loc": "plan", "msg": "a plan must be a JSON object"}])
        if inputs is not None and not isinstance(inputs, Mapping):
            raise PlanError([{"loc": "inputs", "msg": "inputs must be a JSON object"}])
        registry = self.env.registry
        names, disabled = registry.names(), registry.disabled_names()
        plan = self.plans.get(
            doc,
            (tuple(names), tuple(disabled)),
            lambda: parse_plan(doc, names, strict=True, disabled=disabled, checked=checked),
        )
        uncallable = check_python_steps(plan.steps)  # its function, its kwargs' names
        if uncallable:
            raise PlanError(uncallable)
        unknown = check_inputs(plan, inputs or {})
        if unknown:
            raise PlanError(unknown)
        if self.max_steps is not None and len(plan.steps) > self.max_steps:
            msg = f"{len(plan.steps)} steps: more than TIFFANY_MAX_STEPS ({self.max_steps})"
            raise PlanError([{"loc": "steps", "msg": msg}])
        entry = plan_entry(doc, inputs)
        if self.max_steps is not None:  # its dynamic steps too: the replay reads the bound here
            entry["limits"] = {"max_steps": self.max_steps}
        if plan.concurrency is not None:  # as a workflow's (one rule: entry_concurrency)
            entry["concurrency"] = entry_concurrency(
                plan.concurrency, {**plan.inputs, **(inputs or {})}
            )
        self.env.remember_plan(entry["plan"], plan)
        return entry, plan.name

    def prepare_workflow(
        self, name: Any, inputs: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], str]:
        """Check a workflow submission; return its run entry and name (any thread).

        Raises:
            WorkflowInputError: An unknown workflow or inputs its signature
                refuses (``errors`` name ``workflow`` or ``inputs.NAME``).
        """
        from tiffany.workflows import prepare_workflow

        # Twin kept: the built-in workflow ``plan``'s input is checked against
        # this engine's tools (prepare_plan), a user's against its signature.
        return prepare_workflow(name, inputs)

    def waiting(self) -> dict[str, Any]:
        """Return the status fields of the steps held back (their tool is disabled here).

        Any thread: the journal's dict of held steps is copied in one call.
        """
        steps = list(self.runtime.journal.held.values())
        listed = []
        for h in steps[:MAX_WAITING_LISTED]:
            tool = self.env.registry.tool_of_step(h.step)
            listed.append({**h.to_dict(), "tool": tool, "step_id": h.step_id})
        return {"steps_waiting": len(steps), "waiting": listed}


def child_end(run_id: str, status: str, outputs: Any, error: str | None) -> dict[str, Any]:
    """What a child run's end tells its parent's ``plan.run`` step (the signal's payload)."""
    return {
        "run_id": run_id,
        "status": status,
        "outputs": outputs if status == "succeeded" else None,
        "error": error,
    }


def _wakes(run: Any) -> Iterable[tuple[int, Any]]:
    """A recovered run's WAKE records still to replay."""
    return run.replay.wakes if run.replay is not None else ()


def _signal_name(wake: Any) -> str | None:
    """The name of the signal a WAKE record delivers, or None for another wake-up."""
    if wake.ltid != 0 or wake.cause != "signal" or not isinstance(wake.value, list | tuple):
        return None
    return str(wake.value[0]) if wake.value else None


def replay_resolvers(settings: Settings) -> dict[str, Any]:
    """Return the entry resolvers a local replay needs (plans with every tool known)."""
    from tiffany.agents import AgentEnv
    from tiffany.agents.registry import ToolRegistry
    from tiffany.workflows import workflow_resolver

    registry = ToolRegistry.default(enabled=ToolRegistry.default().all_names())
    env = AgentEnv(registry, Path(settings.data_dir) / "workspaces", tool_settings(settings))
    return {"workflow": workflow_resolver(env)}  # plan runs: the built-in workflow plan


def journal_log(settings: Settings, *, wait_s: float = 0.0, owner: str | None = None) -> Log | None:
    """Open the journal ``settings`` name, or None for the WAL under the data dir.

    A leased journal (:attr:`~tiffany.ports.journals.Journals.leased`: the
    PostgreSQL one): migrate the database (``tiffany db upgrade``), then take
    the lease of this engine's stream (``journal_stream``, or
    ``<journal_stream>-<engine>``: :class:`~tiffany.wal.pg.PgLog`), waiting
    up to ``wait_s`` for a held one; raises
    :class:`~tiffany.errors.WalLockedError` while another engine holds it.
    ``owner``: the lease holder's name (:func:`tiffany.wal.pg.new_owner`).
    """
    from tiffany.ports.journals import journals_for

    if not journals_for(settings).leased:
        return None  # the runtime opens (and locks) the WAL in the data dir
    from tiffany.store.migrate import upgrade_url
    from tiffany.wal.pg import PgLog

    upgrade_url(settings.database_url)  # the journal's tables are Alembic's too
    return PgLog.open(
        settings.database_url,
        engine_stream(settings.journal_stream, settings.engine),
        lease_s=settings.journal_lease_s,
        wait_s=wait_s,
        first_seq=seq_base(settings.engine) + 1,
        owner=owner,
    )


def take_slot(settings: Settings, owner: str | None = None) -> tuple[Settings, Log]:
    """Take the first free stream of ``settings.engine_slots``; wait while every one is held.

    Returns the settings of the engine whose stream it took (``engine`` set
    to its number) and the open stream. Two engines after the same freed
    stream: its lease row admits one; the other tries the next, or waits.
    """
    import structlog
    import tenacity

    from tiffany.errors import WalLockedError
    from tiffany.store.migrate import upgrade_url
    from tiffany.wal.pg import PgLog

    log = structlog.get_logger(__name__)
    upgrade_url(settings.database_url)  # the journal's tables are Alembic's too
    lease_s = settings.journal_lease_s

    def first_free() -> tuple[Settings, Log]:
        soonest = lease_s
        for i in range(settings.engine_slots):
            try:
                opened = PgLog.open(
                    settings.database_url,
                    engine_stream(settings.journal_stream, i),
                    lease_s=lease_s,
                    first_seq=seq_base(i) + 1,
                    owner=owner,
                )
            except WalLockedError as exc:
                soonest = min(soonest, float(exc.fields["lease_left_s"]))
                continue
            log.info("engine.slot_taken", engine=i, slots=settings.engine_slots)
            return settings.model_copy(update={"engine": i}), opened
        raise _EverySlotHeld(soonest)

    def until_one_frees(state: tenacity.RetryCallState) -> float:
        """The soonest lease's end, at least 50 ms, at most a quarter lease and a second."""
        exc = state.outcome.exception() if state.outcome is not None else None
        soonest = exc.soonest_s if isinstance(exc, _EverySlotHeld) else lease_s
        return min(max(soonest, 0.05), lease_s / 4, 1.0)

    def standby(state: tenacity.RetryCallState) -> None:
        if state.attempt_number == 1:  # once, not once a try
            log.info("engine.standby", slots=settings.engine_slots, reason="every slot held")

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(_EverySlotHeld),
        wait=until_one_frees,
        before_sleep=standby,
    )
    return retrying(first_free)


class _EverySlotHeld(Exception):
    """Every stream of the slots is leased to another engine (:func:`take_slot` waits)."""

    def __init__(self, soonest_s: float) -> None:
        super().__init__(f"every slot held; the soonest lease ends in {soonest_s:.1f} s")
        self.soonest_s = soonest_s


def journal_source(settings: Settings) -> Source:
    """Where readers find the journal of ``settings``' engine (no lock, no lease taken)."""
    from tiffany.ports.journals import journals_for

    return journals_for(settings).source(settings.engine)


def build(
    settings: Settings,
    *,
    enabled_tools: Iterable[str] | None = None,
    instruments: Iterable[Instrument] = (),
    emit: Callable[[str, str, Mapping[str, Any]], None] | None = None,
    server: bool = False,
    log: Log | None = None,
) -> Engine:
    """Wire an engine under ``settings.data_dir`` (``server``: see :func:`tool_settings`).

    A ``server`` also waits for the journal's lease (``journal=postgres``).
    ``log``: a journal already open (:func:`take_slot`'s).
    """
    from tiffany.agents import AgentEnv
    from tiffany.agents.registry import ToolRegistry
    from tiffany.engine.memory import EngineMemory
    from tiffany.workflows import workflow_resolver

    data_dir = Path(settings.data_dir)
    registry = ToolRegistry.default(
        enabled=list(enabled_tools) if enabled_tools is not None else settings.enabled_tools
    )
    env = AgentEnv(registry, data_dir / "workspaces", tool_settings(settings, server=server))
    if emit is not None:
        env.emit = emit
    watchdog = SlowDispatchWatchdog(settings.slow_dispatch_threshold_s)
    # What opens here closes again if a later part fails (one ExitStack):
    # the journal (its lock, or its lease), then the runtime that owns it.
    with contextlib.ExitStack() as on_failure:
        # A server waits for the lease as long as another engine holds it (a
        # standby; a restart after a crash waits out the dead one's lease).
        log = log or journal_log(settings, wait_s=float("inf") if server else 0.0)
        if log is not None:
            on_failure.callback(log.close)
        runtime = Runtime(
            data_dir,
            fsync=settings.wal_fsync,
            preallocate=settings.wal_preallocate,
            instruments=[watchdog],
            resolvers={"workflow": workflow_resolver(env)},  # plan runs too: workflow plan
            key_window_s=settings.idempotency_window_s,
            log=log,
            # This engine's seqs (tiffany/wire/shards.py): never another engine's.
            seqs=(seq_base(settings.engine) + 1, seq_last(settings.engine) + 1),
        )
        on_failure.pop_all()  # the runtime owns the journal now
        on_failure.callback(runtime.close)
        # The memory tools' store: opened off the loop, closed with the runtime (memory.py).
        env.memory = EngineMemory(settings)
        runtime.on_close(env.memory.close)
        engine = _assemble(settings, runtime, env, watchdog, registry, instruments)
        on_failure.pop_all()  # built: the caller closes it (engine.runtime.close())
    return engine


def _assemble(
    settings: Settings,
    runtime: Runtime,
    env: Any,
    watchdog: SlowDispatchWatchdog,
    registry: Any,
    instruments: Iterable[Instrument],
) -> Engine:
    """The engine around an open runtime: gates, limits, instruments, spans (:func:`build`)."""
    # A step of a tool disabled here waits instead of starting (before recovery).
    runtime.journal.step_gate = registry.step_gate
    limits = parse_rate_limits(settings.rate_limits)
    if limits:  # steps of a limited tool start when its limit allows (rate_limits.py)
        limiter = RateLimiter(limits, registry.tool_of_step, runtime.sched.clock.monotonic)
        runtime.sched.set_admission(limiter.admit)
    # After the journal: it tags each new task with its run (Task.meta),
    # which observers such as the activity log read in the same hook.
    for inst in instruments:
        runtime.sched.add_instrument(inst)
    # Run and step spans, when OpenTelemetry's variables ask for them (engine/otel.py).
    attach_from_env(runtime, env=env)
    # Everything loaded so far (modules, schemas, the tool registry) lives as
    # long as the process: move it out of the collector's reach, so a full
    # collection during a run traverses the run's objects only (measured: a
    # gen-2 collection over the start-up heap cost a large fan-out a large
    # share of its throughput; bench/README.md).
    children = ChildLimits(
        settings.max_child_depth, settings.max_children, settings.max_descendants
    )
    engine = Engine(runtime, env, watchdog, children, max_steps=settings.max_steps)
    env.runs = engine  # plan.run's child runs (tiffany/agents/tools/subplan.py)
    gc.collect()
    gc.freeze()
    return engine
