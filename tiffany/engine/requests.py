"""The engine's answers to requests: the control channel's ops, on behalf of the loop.

:class:`ControlRequests` answers one request of the control channel
(:mod:`tiffany.wire.control`): ``status``, ``submit``, ``rerun``, ``cancel``,
``signal``, ``verify``, ``export``, ``wait_projected``, ``metrics``, ``tools`` and
``check_plan``, each a typed command dispatched by its type (one handler a
command type, in a table built once). The control server
(``control_server.py``) decodes each line it reads into its command and
calls :meth:`ControlRequests.handle`; on the PostgreSQL journal the request
claimer (``db_requests.py``) does the same for each request row it claims;
engine 0's schedules (``schedules.py``) submit their ticks through
:meth:`ControlRequests.submit`. The engine process's lifecycle
(build, sockets, recovery, the loop, shutdown) is ``service.py``'s.

Invariants:

- Requests are answered off the loop: on the control pool's threads, or on
  their connection's thread for the requests :func:`quick` names. What
  touches the kernel, the journal or the run table (starting a run,
  requesting a cancel or a signal) is queued on the
  :class:`~tiffany.engine.inbox.Inbox` and runs on the loop; nothing here
  makes the loop wait.
- SQL (a re-run's source, a finished run's status, a signal's first
  delivery) runs only on control threads: never on the loop, never on a
  connection's thread (a re-run is therefore not quick).
- A submission holds no thread while it waits to be durable: its answer is
  a future the commit that covers its seq resolves
  (:class:`~tiffany.engine.inbox.DurableWaits`), its deadline an entry in
  ``timeouts.py``: :class:`~tiffany.errors.EngineNotReady` after
  :data:`SUBMIT_TIMEOUT_S`, "busy" if the loop never took it, "not
  durable" if it did.
- The engine trusts no caller (``tiffany submit`` and ``tiffany signal``
  bypass the API's checks): plans, inputs and payloads are checked here,
  and a signal named in the engine's reserved namespace
  (``records.RESERVED_SIGNAL_PREFIXES``: a sub-plan's end, a concurrency
  slot) is refused here, whichever way it came (socket, database row).
- A signal's payload is held to the payload schema of every ``signal.wait``
  step of its run that waits for its name (``Engine.signals``): one that
  does not satisfy it is refused (:class:`~tiffany.errors.InvalidCommand`
  naming the field by its JSON pointer) before anything is journaled,
  whichever way it came. A signal no step waits for is taken (it may be
  early) and its answer carries a ``warning`` naming what the run waits for.
- A run holds at most ``max_pending_signals`` clients' signals no step has
  received, of ``max_pending_signal_bytes`` in all: one more is refused
  (:class:`~tiffany.errors.SignalsHeldFull`,
  :class:`~tiffany.errors.SignalBytesHeldFull`), naming the setting; a
  run's are let go when it ends.
- A run the engine no longer holds (``run_table.py`` keeps the newest
  finished ones) is answered from the store: :class:`~tiffany.errors.RunFinished`
  with its status, not :class:`~tiffany.errors.RunNotFound`.
- The engine refuses with domain errors (``tiffany/errors.py``), never with
  HTTP statuses: the API maps them once (``tiffany/api/problems.py``).

Discussion: the parts are given, not the service. :class:`ControlRequests`
is built with what it uses (the engine, hub, inbox, durable waits,
timeouts, run table, projector link, verifier, metrics) and reads the
engine process's lifecycle through :class:`Lifecycle`, a few callables
read when asked (the phase changes on other threads). It never sees the
checkpointer, the schedules, the sockets or the order of the shutdown; the
service, in turn, uses only :meth:`~ControlRequests.handle`,
:meth:`~ControlRequests.submit` and :meth:`~ControlRequests.close`.
Rejected: a back-reference to ``EngineService``: every handler could reach
any part of the process, and the split would only have moved lines.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

from tiffany.agents import PlanError
from tiffany.agents.tools.llm import provider_status
from tiffany.config import Settings
from tiffany.durable import signal_bytes
from tiffany.durable.checkpoint import KeyEntry
from tiffany.engine.inbox import DurableWaits, Inbox, settle
from tiffany.errors import (
    CommandTooLarge,
    EngineNotReady,
    InvalidCommand,
    KeyReused,
    LimitExceeded,
    MalformedCommand,
    RunExists,
    RunFinished,
    RunNotFinished,
    RunNotFound,
    SignalBytesHeldFull,
    SignalsHeldFull,
)
from tiffany.wire.control import (
    MAX_WAIT_PROJECTED_S,
    Cancel,
    Cancelling,
    CheckPlan,
    Command,
    Export,
    Metrics,
    MetricsText,
    PlanChecked,
    Projected,
    Rerun,
    Signal,
    Signalled,
    Status,
    Submit,
    Submitted,
    Tools,
    Verify,
    WaitProjected,
    command_name,
    submission_digest,
)
from tiffany.wire.documents import SIGNAL_NAME_PATTERN, DocumentError
from tiffany.wire.documents import check as check_document
from tiffany.wire.records import reserved_signal, reserved_signal_message
from tiffany.wire.shards import engine_of, engine_stream
from tiffany.wire.status import TERMINAL
from tiffany.workflows import WorkflowInputError

if TYPE_CHECKING:
    from tiffany.engine import Engine
    from tiffany.engine.run_table import RunTable
    from tiffany.engine.timeouts import Timeouts
    from tiffany.engine.verifier import Verifier
    from tiffany.feed import Hub
    from tiffany.observe.metrics import EngineMetrics
    from tiffany.projector.link import ProjectorLink

__all__ = [
    "MAX_RUNNING_LISTED",
    "NOT_DURABLE",
    "SUBMIT_TIMEOUT_S",
    "ControlRequests",
    "Lifecycle",
    "quick",
]

log = structlog.get_logger(__name__)

#: Running runs a status lists by id (the count is always exact).
MAX_RUNNING_LISTED: Final = 100
#: Largest run export (``export``) sent over the control channel: base64 makes
#: it 4/3 as large, and a frame holds ``MAX_FRAME_BYTES`` (64 MiB).
MAX_EXPORT_BYTES: Final = 32 * 1024 * 1024
#: How long a submission waits for the loop and its group commit, in seconds.
SUBMIT_TIMEOUT_S: Final = 30.0
_BUSY: Final = "the engine is busy or recovering; try again"
#: How long a signal sent again to a finished run waits for the store to hold
#: the run's end before its first delivery is looked up there, in seconds.
SIGNAL_LOOKUP_WAIT_S: Final = 5.0
#: How long a re-run waits for the store to hold what the journal has
#: written (the earlier run's end) before it reads the run there, in seconds.
RERUN_SOURCE_WAIT_S: Final = 5.0
#: The refusal (not ready) of a submission or signal whose record was not durable in time
#: (the service fails the durable waits with it when the loop fails).
NOT_DURABLE: Final = "the submission was not made durable in time"
_SIGNAL_NAME: Final = re.compile(SIGNAL_NAME_PATTERN)


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """What the requests read of the engine process's lifecycle (``service.py``).

    Each callable is read when a request asks, on whatever thread answers it.

    Attributes:
        phase: starting -> scanning -> replaying -> ready -> stopping.
        stopping: A stop was requested: the loop starts no more runs.
        ready: Recovery is over and the projector has reported (``/readyz``).
        recovering: How many runs are still replaying their journal.
        fenced: The journal's lease was taken over (PostgreSQL).
        started_at: When the engine started (wall clock, for status).
    """

    phase: Callable[[], str]
    stopping: Callable[[], bool]
    ready: Callable[[], bool]
    recovering: Callable[[], int]
    fenced: Callable[[], bool]
    started_at: float


def quick(command: Command) -> bool:
    """Whether :meth:`ControlRequests.handle` answers ``command`` without blocking.

    Such commands are handled on their connection's thread, not the control
    pool's (``engine/control_server.py``): a submission checks its plan and
    queues it for the loop (a re-run reads the store: not quick), a
    ``wait_projected`` registers a future.
    """
    return type(command) in _QUICK


_QUICK: Final = frozenset({Submit, WaitProjected})


def _sandbox_status(mode: str) -> str:
    return "none (UNSANDBOXED)" if mode == "none" else mode


class ControlRequests:
    """The answers to the engine's requests (see :mod:`tiffany.wire.control`).

    Args:
        settings: The engine's settings (its number, database URL, journal).
        engine: The engine (its runtime: kernel, journal, WAL).
        hub: The activity feed: a started run and a journaled signal are events.
        inbox: Where work for the loop is queued.
        durable: The waits for the WAL to be durable past a seq.
        timeouts: Submissions' deadlines.
        runs: What the engine remembers of runs (``run_table.py``).
        projector: The projector process (``wait_projected``, the store's seq).
        verifier: Replays a finished run (``verify``).
        metrics: The engine's registry (``metrics``).
        on_end: Called on the loop when a run this starts ends.
        lifecycle: The engine process's phase and the like.
    """

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        hub: Hub,
        inbox: Inbox,
        durable: DurableWaits,
        timeouts: Timeouts,
        runs: RunTable,
        projector: ProjectorLink,
        verifier: Verifier,
        metrics: EngineMetrics,
        on_end: Callable[[Any], None],
        lifecycle: Lifecycle,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.runtime = engine.runtime
        self.hub = hub
        self.inbox = inbox
        self.durable = durable
        self.timeouts = timeouts
        self.runs = runs
        self.projector = projector
        self.verifier = verifier
        self.metrics = metrics
        self._on_end = on_end
        self.lifecycle = lifecycle
        self._store: Any = None  # the store's SQLAlchemy engine, for _stored_status
        self._store_lock = threading.Lock()
        #: One handler a command type (a table built once: no chain of ``if op ==``).
        self._handlers: dict[type[Any], Callable[[Any], Any]] = {
            Status: lambda _: self._status(),
            Submit: self.submit,
            Rerun: self.rerun,
            Cancel: self._cancel_command,
            Signal: self._signal,
            Verify: self._verify,
            Export: self._export,
            WaitProjected: self._wait_projected,
            CheckPlan: self._check_plan,
            Metrics: lambda _: MetricsText(text=self.metrics.render()),
            Tools: lambda _: self.engine.env.registry.describe(),
        }

    def close(self) -> None:
        """Let the store's connections go (at the engine's stop, after the loop)."""
        if self._store is not None:
            self._store.dispose()

    # -- control threads -----------------------------------------------------------------

    def handle(self, command: Command) -> Any:
        """Answer one command (see :mod:`tiffany.wire.control`): its answer, or a future of it.

        Raises:
            Refusal: The command is refused (a subclass names why).
        """
        handler = self._handlers.get(type(command))
        if handler is None:
            raise MalformedCommand(f"no command {command_name(command)!r}")
        return handler(command)

    def _check_plan(self, command: CheckPlan) -> PlanChecked:
        """A schedule's plan (or workflow), checked when it is added: its name, or the refusal.

        A workflow is checked as its submission is (:meth:`_submit`): the
        same refusal, naming ``workflow`` or ``inputs.NAME``.
        """
        inputs = command.inputs or {}
        if command.workflow is not None:
            try:
                check_document(inputs, loc=["inputs"])
                _, name = self.engine.prepare_workflow(command.workflow, inputs)
            except DocumentError as exc:
                raise InvalidCommand(exc.message, field="inputs", detail=exc.detail) from None
            except WorkflowInputError as exc:
                field = str(exc.errors[0]["loc"]) if exc.errors else "workflow"
                raise InvalidCommand(exc.message, field=field, detail=exc.errors) from None
            return PlanChecked(name=name)
        try:
            check_document(command.plan, loc=["plan"])
            check_document(inputs, loc=["inputs"])
            _, name = self.engine.prepare_plan(command.plan, inputs, checked=True)
        except DocumentError as exc:
            raise InvalidCommand(exc.message, field="plan", detail=exc.detail) from None
        except PlanError as exc:
            raise InvalidCommand(exc.message, field="plan", detail=exc.errors) from None
        return PlanChecked(name=name)

    def _cancel_command(self, command: Cancel) -> Cancelling:
        run_id = command.run_id
        reason = command.reason or "cancelled"
        answer: Cancelling = self._for_run(
            run_id, lambda: self._cancel(run_id, reason), live=command.live
        )
        return answer

    def submit(self, command: Submit) -> Future[Submitted]:
        """Start a run; a future of its :class:`Submitted` answer once it is durable.

        Holds no thread while it waits (``engine/timeouts.py``): after
        ``SUBMIT_TIMEOUT_S`` the future fails with :class:`EngineNotReady`,
        busy if the loop never took the submission, not durable if it did.
        """
        return self._submit(
            command.plan,
            command.inputs or {},
            command.key,
            command.run_id,
            command.schedule,
            workflow=command.workflow,
        )

    def rerun(self, command: Rerun) -> Future[Submitted]:
        """Start a re-run of a finished run (control threads: it reads the store)."""
        plan, inputs, rerun = self._rerun_of(command)
        return self._submit(plan, inputs, command.key, command.run_id, None, rerun)

    def _submit(
        self,
        plan: Any,
        inputs: Any,
        key: Any,
        given: str | None,
        schedule: dict[str, Any] | None,
        rerun: dict[str, Any] | None = None,
        *,
        workflow: str | None = None,
    ) -> Future[Submitted]:
        """Check a run's plan and inputs and queue its start (``given``: the caller's run id)."""
        if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 255):
            raise InvalidCommand(
                "invalid Idempotency-Key",
                field="key",
                detail=[{"loc": "Idempotency-Key", "msg": "must be 1 to 255 characters"}],
            )
        if workflow is not None and (plan is not None or rerun is not None):
            msg = "send either a workflow or a plan, not both"
            raise InvalidCommand(msg, field="workflow", detail=[{"loc": "workflow", "msg": msg}])
        try:  # the engine trusts no caller: `tiffany submit` bypasses the API's checks
            if rerun is None and workflow is None:  # a re-run's plan was checked when first run
                check_document(plan, loc=["plan"])
            check_document(inputs, loc=["inputs"])
        except DocumentError as exc:
            field = str(exc.detail[0]["loc"][0]) if _located(exc.detail) else None
            raise InvalidCommand(exc.message, field=field, detail=exc.detail) from None
        if workflow is not None:  # a user's @workflow (tiffany/workflows), known here by import
            try:
                entry, name = self.engine.prepare_workflow(workflow, inputs)
            except WorkflowInputError as exc:
                field = str(exc.errors[0]["loc"]) if exc.errors else "workflow"
                raise InvalidCommand(exc.message, field=field, detail=exc.errors) from None
        else:
            try:  # checked just above (or, for a re-run, when it was first submitted)
                entry, name = self.engine.prepare_plan(plan, inputs, checked=True)
            except PlanError as exc:
                raise InvalidCommand(exc.message, field="plan", detail=exc.errors) from None
        if schedule is not None:  # a schedule's tick (engine/schedules.py)
            entry["schedule"] = {"id": str(schedule.get("id")), "tick": str(schedule.get("tick"))}
        if rerun is not None:  # the earlier run and the restart point name the plan and reuse
            entry["rerun_of"], entry["reuse"] = rerun["rerun_of"], rerun["reuse"]
        digest = ""  # only a key is tied to a body (a sorted JSON dump and a hash a run)
        if key is not None:
            # the API's digest of a database submission: its body's plan (none) and workflow
            body = {"plan": None, "workflow": workflow} if workflow is not None else plan
            digest = submission_digest(body if rerun is None else rerun["rerun_of"], inputs)
            entry["idempotency"] = {"key": key, "digest": digest}
        answer: Future[Submitted] = Future()  # the inbox runs it, the commit resolves it
        reply: Future[Submitted] = Future()  # the caller's: the answer, or the timeout

        def start() -> None:  # on the loop; the answer is resolved when its seq is durable
            run_id, created, seq = self._start(entry, name, key, digest, given)
            self.durable.when(seq, answer, Submitted(run_id=run_id, created=created, seq=seq))

        def relay(done: Future[Submitted]) -> None:
            if not done.cancelled():
                exc = done.exception()
                settle(reply, None if exc is not None else done.result(), exc)

        def expire() -> None:
            if not reply.done():
                never_taken = answer.cancel()  # the inbox skips it; False once it ran
                settle(reply, exc=EngineNotReady(_BUSY if never_taken else NOT_DURABLE))

        if self.lifecycle.phase() == "stopping":
            raise EngineNotReady("the engine is stopping")
        answer.add_done_callback(relay)
        token = self.timeouts.start(expire)
        reply.add_done_callback(lambda _: self.timeouts.cancel(token))
        self.inbox.call_later(start, answer)
        return reply

    def _rerun_of(self, command: Rerun) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """A re-run's plan, inputs and reuse (``tiffany/agents/rerun.py``), from the store.

        Control threads only (SQL). The earlier run must be finished and in
        the store; ``inputs`` given here override its inputs.
        """
        from tiffany.agents.rerun import journal_reuse, rerun_reuse
        from tiffany.store import queries, session_factory

        source_id, from_step, inputs = command.rerun_of, command.from_step, command.inputs
        if not source_id:
            raise InvalidCommand("rerun_of must be a run id", field="rerun_of")
        # The store is let catch up with what the journal has written first: a
        # run whose end was just on the feed (`tiffany tail`, the dashboard) is
        # finished there too, not "not found" or "not finished" for a few ms.
        written = self.runtime.wal.next_seq - 1
        caught = self.projector.when_projected(written, RERUN_SOURCE_WAIT_S).result()
        if not caught["reached"]:
            raise EngineNotReady(
                f"the store is at seq {caught['last_seq']} and did not reach seq {written} "
                f"within {RERUN_SOURCE_WAIT_S:g} s; retry",
                detail={"min_seq": written, "store_seq": caught["last_seq"]},
            )
        with session_factory(self._store_engine())() as session:
            source = queries.rerun_source(session, source_id)
        if source is None:
            raise RunNotFound(f"no run {source_id!r}")
        status, entry = source["status"], source["entry"]
        if status not in TERMINAL:
            raise RunNotFinished(
                f"run {source_id} has not finished ({status}); re-run a finished run",
                detail={"status": status},
            )
        if not isinstance(entry, dict) or entry.get("kind") != "plan":
            raise InvalidCommand(f"run {source_id} is not a plan run", field="rerun_of")
        try:
            reuse, restart = rerun_reuse(source["after"], source["steps"], from_step, source_id)
        except PlanError as exc:
            raise InvalidCommand(exc.message, field="from_step", detail=exc.errors) from None
        # The outputs themselves come from the journal, not the store's projection.
        reuse, projected = journal_reuse(reuse, self._settling_records(reuse))
        if projected:
            log.warning(
                "rerun.projected_outputs",
                run_id=source_id,
                steps=projected,
                reason="the journal no longer holds their records (TIFFANY_WAL_RETAIN)",
            )
        merged = {**(entry.get("inputs") or {}), **inputs}
        return (
            entry.get("plan"),
            merged,
            {
                "rerun_of": {"run_id": source_id, "restart": restart},
                "reuse": reuse,
            },
        )

    def _settling_records(self, reuse: dict[str, dict[str, Any]]) -> dict[int, Any]:
        """The journal records that settled the reused steps, by seq (control threads only).

        A seq names the engine whose journal wrote it (``tiffany/wire/shards.py``):
        each engine's journal is read once, from its lowest wanted seq to its
        highest, archived segments included. A journal that is not there
        (an engine directory removed) reads as holding none of them.
        """
        from tiffany.durable.history import records_at
        from tiffany.engine import journal_source

        by_engine: dict[int, list[int]] = {}
        for given in reuse.values():
            seq = given.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0:
                by_engine.setdefault(engine_of(seq), []).append(seq)
        found: dict[int, Any] = {}
        for engine, seqs in sorted(by_engine.items()):
            source = journal_source(self.settings.for_engine(engine))
            try:
                found.update(records_at(source, seqs))
            except FileNotFoundError:
                continue
        return found

    def _for_run(self, run_id: str, fn: Callable[[], Any], *, live: bool) -> Any:
        """Run a run's command on the loop; a run the engine no longer holds: finished (the store).

        ``live``: the API asks every engine; only the one holding the run
        answers, the others "not found" (the store is not asked).
        """
        try:
            return self._on_loop(fn)
        except RunNotFound:
            stored = None if live else self._stored_status(run_id)
            if stored is None:
                raise
            raise RunFinished(
                f"run {run_id} already finished ({stored})", detail={"status": stored}
            ) from None

    def _signal(self, command: Signal) -> Signalled:
        """Journal a signal for a running run; answer once its record is durable.

        Command: ``run_id``, ``name``, ``payload`` (any JSON), ``signal_id``
        (optional: a signal sent again with the same id is journaled once;
        the API sends one per request, so a request retried after an engine
        died is not delivered twice). Answer: :class:`Signalled`, ``seq`` the
        WAL seq of the signal's record, and ``warning`` when no step of the
        run waits for that name.

        Raises:
            InvalidCommand: A bad name or id, or a payload its waits' schema
                refuses (``detail``: the fields, ``signal.payload_invalid``).
            Refusal: Not found, finished, too many held, not ready: as the
                module docstring says.
        """
        run_id, name, payload = command.run_id, command.name, command.payload
        given = command.signal_id  # the caller's id: it may send the signal again
        signal_id = given or uuid.uuid4().hex
        if not _SIGNAL_NAME.match(name):
            msg = f"must match {SIGNAL_NAME_PATTERN}"
            raise InvalidCommand(f"signal name {msg}", field="name", detail=[_at("name", msg)])
        if reserved_signal(name) is not None:
            msg = reserved_signal_message(name)
            raise InvalidCommand(msg, field="name", detail=[_at("name", msg)])
        if not 0 < len(signal_id) <= 255:
            msg = "must be 1 to 255 characters"
            raise InvalidCommand(
                f"signal_id {msg}", field="signal_id", detail=[_at("signal_id", msg)]
            )
        try:  # the engine trusts no caller: `tiffany signal` bypasses the API's checks
            check_document(payload, loc=["payload"])
        except DocumentError as exc:
            raise InvalidCommand(exc.message, field="payload", detail=exc.detail) from None
        waits = self.engine.signals.get(run_id)  # a plan run the engine holds
        if waits is not None:  # checked here, off the loop, before anything is journaled
            refused = waits.refusal(name, payload)
            if refused is not None:
                message, items = refused
                raise InvalidCommand(message, field="payload", detail=items)
        size = signal_bytes(payload)  # measured here, off the loop
        deadline = time.monotonic() + SUBMIT_TIMEOUT_S
        journaled: Future[int] = Future()
        warning: list[str] = []

        def done(seq: int, ended: str | None) -> None:  # on the loop
            if ended is not None:
                journaled.set_exception(
                    RunFinished(
                        f"run {run_id} already finished ({ended})", detail={"status": ended}
                    )
                )
                return
            journaled.set_result(seq)
            self.hub.publish(
                "signal",
                wal_seq=seq,
                run_id=run_id,
                label=f"signal {name}",
                data={"name": name, "signal_id": signal_id},
            )

        def queue() -> None:
            journal = self.runtime.journal
            run = journal.runs.get(run_id)
            status = run.status if run is not None else self.runs.status(run_id)
            if status is None:
                raise RunNotFound(f"no run {run_id!r}")
            if status == "running" and journal.signal_seq(run_id, signal_id) is None:
                self._check_held(run_id, size)  # a repeat holds nothing more
            if not journal.request_signal(run_id, name, payload, signal_id, done, size):
                raise RunFinished(
                    f"run {run_id} already finished ({status})", detail={"status": status}
                )
            said = _unawaited(run_id, name, waits, journal.awaited_signals(run_id))
            if said is not None:
                warning.append(said)

        try:
            self._for_run(run_id, queue, live=command.live)
            try:
                seq = journaled.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                raise EngineNotReady(_BUSY) from None
        except RunFinished:
            # Sent again (a client retried after a lost answer) once the run had
            # finished, perhaps because of it: the first delivery's answer.
            sent = self._signal_sent(run_id, given) if given else None
            if sent is None or sent[1] != name:  # not that signal: the run had finished
                raise
            seq = sent[0]
        self._wait_durable(seq, deadline)
        return Signalled(
            run_id=run_id,
            name=name,
            seq=seq,
            signal_id=signal_id,
            warning=warning[0] if warning else None,
        )

    def _check_held(self, run_id: str, size: int) -> None:
        """Refuse a signal the run cannot hold: past the count, or past the bytes."""
        count, held = self.runtime.journal.held_signals(run_id)
        settings = self.settings
        if count + 1 > settings.max_pending_signals:
            refusal = LimitExceeded(
                "max_pending_signals",
                settings.max_pending_signals,
                f"run {run_id} holds {count} signals no step has received: one more would pass "
                f"TIFFANY_MAX_PENDING_SIGNALS ({settings.max_pending_signals}); try again once "
                "a step takes one",
                held=count,
            )
            raise SignalsHeldFull(refusal.message, detail=refusal.to_dict())
        if held + size > settings.max_pending_signal_bytes:
            refusal = LimitExceeded(
                "max_pending_signal_bytes",
                settings.max_pending_signal_bytes,
                f"run {run_id} holds {held} bytes of signals no step has received: this one "
                f"({size} bytes) would pass TIFFANY_MAX_PENDING_SIGNAL_BYTES "
                f"({settings.max_pending_signal_bytes})",
                held_bytes=held,
                bytes=size,
            )
            raise SignalBytesHeldFull(refusal.message, detail=refusal.to_dict())

    def _signal_sent(self, run_id: str, signal_id: str) -> tuple[int, str] | None:
        """A finished run's signal ``signal_id``: ``(seq, name)`` from the store, or None.

        Control threads only (SQL). The store is first let catch up with what
        is durable now (the run's end, and so the signal before it), for
        :data:`SIGNAL_LOOKUP_WAIT_S` at most.
        """
        from tiffany.store import session_factory
        from tiffany.store.journal import signal_record

        self.projector.when_projected(self.durable.seq, SIGNAL_LOOKUP_WAIT_S).result()
        with session_factory(self._store_engine())() as session:
            return signal_record(session, run_id, signal_id)

    def _wait_projected(self, command: WaitProjected) -> Future[Any]:
        """Answer once the store holds ``seq`` (or after ``wait_s``); holds no thread.

        ``written``: everything this engine has written so far (a reader of
        another engine's run, a re-run, ``tail --run``: what it saw on the
        feed is in the store then). The answer names that seq (``written_seq``).
        """
        wait_s = min(command.wait_s, MAX_WAIT_PROJECTED_S)
        if command.written:
            written = self.runtime.wal.next_seq - 1
            return _with_seq(self.projector.when_projected(written, wait_s), written)
        seq = command.seq
        if seq is None:
            raise InvalidCommand("seq is required (or written)", field="seq")
        max_seq = command.max_seq
        written = self.runtime.wal.next_seq - 1
        if max_seq is not None and max_seq > written:
            # A read asks for a seq never written: answer now, the API refuses it (422).
            done: Future[Any] = Future()
            last = self.projector.last_seq
            done.set_result(Projected(last_seq=last, reached=last >= seq, written_seq=written))
            return done
        return self.projector.when_projected(seq, wait_s)

    def _verify(self, command: Verify) -> dict[str, Any]:
        run_id = command.run_id
        if not run_id:
            raise InvalidCommand("run_id is required", field="run_id", detail=[_at("run_id")])
        status = self.runs.status(run_id) or (None if command.live else self._stored_status(run_id))
        if status is None:
            raise RunNotFound(f"no run {run_id!r}")
        if status == "running":
            raise RunNotFinished(f"run {run_id} has not finished; only finished runs verify")
        report = self.verifier.verify(run_id)
        # "ok" is the envelope's: the report's verdict travels as "identical".
        report["identical"] = bool(report.pop("ok", False))
        return report

    def _export(self, command: Export) -> dict[str, Any]:
        """The run's export file (docs/replay.md), base64: read from the journal, on this thread.

        A control thread reads the journal as ``tiffany export`` does (the
        scheduler writes on); a run still running is exported as far as its
        journal goes. A file too large for one control frame is refused (413)
        rather than sent in a frame the API cannot read.
        """
        import base64
        import io

        import tiffany
        from tiffany.durable import UnknownRun
        from tiffany.durable.export import export_run
        from tiffany.engine import journal_source

        run_id = command.run_id
        if not run_id:
            raise InvalidCommand("run_id is required", field="run_id", detail=[_at("run_id")])
        if command.live and self.runs.status(run_id) is None:
            raise RunNotFound(f"no run {run_id!r}")  # another engine's, if any
        out = io.BytesIO()
        source = journal_source(self.settings)
        try:
            meta = export_run(source, run_id, out, tiffany_version=tiffany.__version__)
        except UnknownRun:
            raise RunNotFound(f"no run {run_id!r}") from None
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        data = out.getvalue()
        if len(data) > MAX_EXPORT_BYTES:
            raise CommandTooLarge(
                f"the export of run {run_id} is {len(data)} bytes; the API sends up to "
                f"{MAX_EXPORT_BYTES}: run `tiffany export {run_id}` where the journal is",
            )
        return {
            "run_id": run_id,
            "records": meta.records,
            "export": base64.b64encode(data).decode("ascii"),
        }

    def _status(self) -> dict[str, Any]:
        return {
            "engine": self.settings.engine,
            "ready": self.lifecycle.ready(),
            "phase": self.lifecycle.phase(),
            "recovering": self.lifecycle.recovering(),
            "pid": os.getpid(),
            "started_at": self.lifecycle.started_at,
            "runs_active": len(self.runs.running),
            # Concurrency limits: per key, runs holding a slot and runs queued.
            "concurrency": self.engine.slots.status(),
            # Which runs (``tiffany status`` lists them engine by engine), the first few.
            "running": sorted(self.runs.running)[:MAX_RUNNING_LISTED],
            "durable_seq": self.durable.seq,
            **self.engine.waiting(),  # steps held back: their tool is disabled here
            # Runs whose state the journal holds in memory (running ones, and
            # finished ones until they are forgotten, right after their end).
            "runs_held": len(self.runtime.journal.runs),
            # Clients' signals no step has received yet, in all runs, and their bytes.
            "signals_held": self.runtime.journal.signals_held,
            "signal_bytes_held": self.runtime.journal.signal_bytes_held,
            # Runs in a tree of child runs (plan.run), live: engine/children.py.
            "tree_runs": len(self.engine.tree),
            "tasks_held": self.runtime.sched.records,
            "projector": self.projector.health(),
            "shell_sandbox": _sandbox_status(self.settings.shell_sandbox),
            # The model llm and agent steps call, or why they fail (tools/llm.py).
            "llm": provider_status(self.engine.env.settings),
            "journal": self._journal_status(),
        }

    def _journal_status(self) -> dict[str, Any]:
        """Where the journal is; on PostgreSQL, the stream and this engine's lease."""
        wal = self.runtime.wal
        if self.settings.journal != "postgres":
            return {"backend": "file", "path": str(self.runtime.wal_dir)}
        return {
            "backend": "postgres",
            "stream": engine_stream(self.settings.journal_stream, self.settings.engine),
            "owner": getattr(wal, "owner", None),
            "epoch": getattr(wal, "epoch", None),
            "lease_s": self.settings.journal_lease_s,
            "fenced": self.lifecycle.fenced() or wal.failed,
        }

    def _on_loop(self, fn: Callable[[], Any], timeout: float = SUBMIT_TIMEOUT_S) -> Any:
        if self.lifecycle.phase() == "stopping":
            raise EngineNotReady("the engine is stopping")
        fut = self.inbox.call(fn)
        try:
            return fut.result(timeout)
        except FutureTimeout:
            fut.cancel()
            raise EngineNotReady(_BUSY) from None

    def _wait_durable(self, seq: int, deadline: float) -> None:
        """Until the WAL is durable past ``seq`` (control threads; not ready at ``deadline``)."""
        if self.durable.seq >= seq:
            return
        durable: Future[None] = Future()
        self.durable.when(seq, durable)
        try:
            durable.result(max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            durable.cancel()
            raise EngineNotReady(NOT_DURABLE) from None

    def _stored_status(self, run_id: str) -> str | None:
        """The store's status of a run the engine no longer holds (control threads only).

        The engine keeps the newest finished runs (``run_table.py``); the
        store is the source of truth for older ones. Never on the loop: SQL.
        """
        from tiffany.store import queries, session_factory

        with session_factory(self._store_engine())() as session:
            run = queries.get_run(session, run_id)
            return None if run is None else str(run.status)

    def _store_engine(self) -> Any:
        """The store's SQLAlchemy engine, made on first use (control threads only)."""
        from tiffany.store import make_engine

        with self._store_lock:
            if self._store is None:
                self._store = make_engine(self.settings.database_url)
            return self._store

    # -- scheduler thread (queued on the inbox) -------------------------------------------

    def _start(
        self,
        entry: dict[str, Any],
        name: str,
        key: str | None,
        digest: str,
        run_id: str | None = None,
    ) -> tuple[str, bool, int]:
        if self.lifecycle.stopping():
            raise EngineNotReady("the engine is stopping")
        now = time.time()  # noqa: TID251 - the key window, like RUN_START's own time
        if key is not None:
            known = self.runs.key(key, now)
            if known is not None:
                if known.digest != digest:
                    raise KeyReused(
                        f"Idempotency-Key {key!r} was used for a different submission "
                        f"(run {known.run_id})",
                        detail={"run_id": known.run_id},
                    )
                return known.run_id, False, known.seq
        if run_id is not None and self.runs.status(run_id) is not None:
            raise RunExists(f"run {run_id} exists already", detail={"run_id": run_id})
        run_id = run_id or f"run-{uuid.uuid4().hex[:12]}"
        # Published first, so the feed shows the run before its tasks; it
        # announces the RUN_START record that submit_entry appends next.
        self.hub.publish(
            "run.started",
            wal_seq=self.runtime.wal.next_seq,
            run_id=run_id,
            task=name,
            task_kind="planner",
            label=name,
            data={"name": name},
        )
        start_seq = self.runtime.wal.next_seq  # the RUN_START's: the run's first record
        self.engine.start_entry(entry, run_id=run_id, name=name, on_end=self._on_end)
        self.runs.started(
            run_id, None if key is None else KeyEntry(key, run_id, digest, now, start_seq)
        )
        return run_id, True, start_seq

    def _cancel(self, run_id: str, reason: str) -> Cancelling:
        run = self.runtime.journal.runs.get(run_id)
        status = run.status if run is not None else self.runs.status(run_id)
        if status is None:
            raise RunNotFound(f"no run {run_id!r}")
        if run is None or status != "running":
            raise RunFinished(
                f"run {run_id} already finished ({status})", detail={"status": status}
            )
        if not self.engine.cancel(run_id, reason):  # its tree stops growing first
            raise RunFinished(f"run {run_id} already finished", detail={"status": run.status})
        return Cancelling(run_id=run_id, status="cancelling")


def _located(detail: Any) -> bool:
    """Whether a document's refusal names where (``[{"loc": [field, ...]}, ...]``)."""
    return bool(
        isinstance(detail, list)
        and detail
        and isinstance(detail[0], dict)
        and isinstance(detail[0].get("loc"), list)
        and detail[0]["loc"]
    )


def _at(loc: str, msg: str = "required") -> dict[str, Any]:
    """One item of an invalid command's detail."""
    return {"loc": loc, "msg": msg}


def _with_seq(fut: Future[dict[str, Any]], seq: int) -> Future[dict[str, Any]]:
    """``fut``'s answer (:class:`Projected`'s fields) with ``written_seq``, the seq it awaited."""
    out: Future[dict[str, Any]] = Future()
    fut.add_done_callback(lambda f: out.set_result({**f.result(), "written_seq": seq}))
    return out


def _unawaited(run_id: str, name: str, waits: Any, awaited: list[str]) -> str | None:
    """The warning for signal ``name`` that no step (or task) of the run waits for, or None.

    ``waits``: a plan run's :class:`~tiffany.agents.tools.signal.RunSignals`
    (every wait of its plan, reached or not); None for a code run, whose
    waits are known only as its tasks reach them: ``awaited``, the names
    its tasks are parked on now.
    """
    if waits is not None:
        said: str | None = waits.warning(name, f"run {run_id}")
        return said
    if name in awaited:
        return None
    return (
        f"no task of run {run_id} waits for signal {name!r} now: it is kept until one "
        f"does; its tasks wait for: {', '.join(awaited) or 'no signal'}"
    )
