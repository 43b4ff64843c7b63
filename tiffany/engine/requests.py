"""The engine's answers to requests: the control channel's ops, on behalf of the loop.

:class:`ControlRequests` answers one request of the control channel
(:mod:`tiffany.wire.control`): ``status``, ``submit``, ``rerun``, ``cancel``,
``signal``, ``verify``, ``export``, ``wait_projected``, ``metrics``, ``tools`` and
``check_plan``, each a typed command dispatched by its type (one handler a
command type, in a table built once). It answers the commands that change a
run (``submit``, ``rerun``, ``cancel``, ``signal``) itself; the reads
(``status``, ``verify``, ``export``, ``wait_projected``, ``metrics``,
``tools``, ``check_plan``) are :class:`~tiffany.engine.reads.EngineReads`'s,
and what is read of the store (a finished run's status, a signal's first
delivery, a re-run's source) is
:class:`~tiffany.engine.stored_runs.StoredRuns`'s. The control server
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
The reads and the store's answers are parts it builds from what it was
given and delegates to, each seeing only what it reads. Rejected: mixins
on one class: every method would again share every attribute.
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

from tiffany.agents import PlanError
from tiffany.config import Settings
from tiffany.durable import signal_bytes
from tiffany.durable.checkpoint import KeyEntry
from tiffany.engine.inbox import DurableWaits, Inbox, settle
from tiffany.engine.reads import EngineReads, detail_at
from tiffany.engine.stored_runs import RerunSource, StoredRuns
from tiffany.errors import (
    EngineNotReady,
    InvalidCommand,
    KeyReused,
    LimitExceeded,
    MalformedCommand,
    RunExists,
    RunFinished,
    RunNotFound,
    SignalBytesHeldFull,
    SignalsHeldFull,
)
from tiffany.wire.control import (
    Cancel,
    Cancelling,
    CheckPlan,
    Command,
    Export,
    Metrics,
    Rerun,
    Signal,
    Signalled,
    Status,
    Submit,
    Submitted,
    Tools,
    Verify,
    WaitProjected,
    Waits,
    command_name,
    submission_digest,
)
from tiffany.wire.documents import SIGNAL_NAME_PATTERN, DocumentError
from tiffany.wire.documents import check as check_document
from tiffany.wire.entries import read_entry
from tiffany.wire.records import reserved_signal, reserved_signal_message
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
    "NOT_DURABLE",
    "SUBMIT_TIMEOUT_S",
    "ControlRequests",
    "Lifecycle",
    "quick",
]

log = structlog.get_logger(__name__)

#: How long a submission waits for the loop and its group commit, in seconds.
SUBMIT_TIMEOUT_S: Final = 30.0
_BUSY: Final = "the engine is busy or recovering; try again"
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
        #: The store's answers about runs the engine no longer holds (stored_runs.py).
        self.stored = StoredRuns(settings, self.runtime, durable, projector)
        #: The answers to the requests that change nothing (reads.py).
        self.reads = EngineReads(
            settings,
            engine,
            durable=durable,
            runs=runs,
            stored=self.stored,
            projector=projector,
            verifier=verifier,
            metrics=metrics,
            lifecycle=lifecycle,
        )
        #: One handler a command type (a table built once: no chain of ``if op ==``).
        self._handlers: dict[type[Any], Callable[[Any], Any]] = {
            Status: lambda _: self.reads.status(),
            Submit: self.submit,
            Rerun: self.rerun,
            Cancel: self._cancel_command,
            Signal: self._signal,
            Verify: self.reads.verify,
            Export: self.reads.export,
            Waits: self._waits,
            WaitProjected: self.reads.wait_projected,
            CheckPlan: self.reads.check_plan,
            Metrics: lambda _: self.reads.metrics_text(),
            Tools: lambda _: self.reads.tools(),
        }

    def close(self) -> None:
        """Let the store's connections go (at the engine's stop, after the loop)."""
        self.stored.close()

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

    def _cancel_command(self, command: Cancel) -> Cancelling:
        run_id = command.run_id
        reason = command.reason or "cancelled"
        answer: Cancelling = self._for_run(
            run_id, lambda: self._cancel(run_id, reason), live=command.live
        )
        return answer

    def _waits(self, command: Waits) -> dict[str, Any]:
        """The signals a running run waits for now, with their schemas (read on the loop)."""
        run_id = command.run_id

        def read() -> dict[str, Any]:
            if run_id not in self.runtime.journal.runs:
                raise RunNotFound(f"no run {run_id!r}")
            return {"run_id": run_id, "signals": self.engine.awaited(run_id)}

        answer: dict[str, Any] = self._for_run(run_id, read, live=command.live)
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
        """Start a re-run of a finished run (control threads: it reads the store).

        A workflow run's re-run is a fork of its journal (``stored_runs.py``):
        its run id is chosen here, and the earlier run's workspace copied
        into the new run's before it starts (a plan's re-run copies it in a
        step of its planner; a fork's journal is the earlier run's, so the
        copy is made outside it, as the run's files are).
        """
        source = self.stored.rerun_source(command)
        if source.fork is None:
            return self._submit(
                source.plan, source.inputs, command.key, command.run_id, None, source.rerun
            )
        self._check_fork(source)
        run_id = command.run_id or f"run-{uuid.uuid4().hex[:12]}"
        env = self.engine.env
        env.copy_workspace(source.rerun["rerun_of"]["run_id"], run_id)
        answer = self._submit(
            None,
            source.inputs,
            command.key,
            run_id,
            None,
            source.rerun,
            workflow=source.workflow,
            fork=(source.fork, source.compat),
        )

        def unused(done: Future[Submitted]) -> None:
            # A repeated key answered another run: this id never started. (On a
            # refusal or a timeout the run may have started all the same: kept.)
            if not done.cancelled() and done.exception() is None and done.result().run_id != run_id:
                shutil.rmtree(env.workspace_root / run_id, ignore_errors=True)

        answer.add_done_callback(unused)
        return answer

    def _check_fork(self, source: RerunSource) -> None:
        """Refuse a workflow's re-run whose code no longer replays the copy (control threads).

        The copy is replayed against the code as it is now, in the verify
        pool (no side effect): a fork whose replay would diverge is refused
        here, naming the divergence, instead of failing the new run (and
        restarting the engine, as any divergence of a live run does).
        """
        assert source.head is not None
        assert source.copied is not None
        report = self.verifier.verify_fork(source.head, source.copied)
        if report.get("ok"):
            return
        what = report.get("divergence") or {}
        why = what.get("message") if isinstance(what, dict) else None
        problems = "; ".join(str(p) for p in report.get("problems") or [])
        msg = (
            f"the workflow's code as it is now does not replay run {source.head['run_id']} "
            f"up to {', '.join(source.rerun['rerun_of']['restart'])}: {why or problems}; restart "
            "from a call before the change (from_step), or submit a new run"
        )
        raise InvalidCommand(msg, field="from_step", detail=[{"loc": "from_step", "msg": msg}])

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
        fork: tuple[list[tuple[int, bytes]], int | None] | None = None,
    ) -> Future[Submitted]:
        """Check a run's plan and inputs and queue its start (``given``: the caller's run id).

        ``fork``: a workflow's re-run: the records its journal begins with and
        their journal version (``tiffany/durable/fork.py``).
        """
        if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 255):
            raise InvalidCommand(
                "invalid Idempotency-Key",
                field="key",
                detail=[{"loc": "Idempotency-Key", "msg": "must be 1 to 255 characters"}],
            )
        if workflow is not None and (plan is not None or (rerun is not None and fork is None)):
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
                # The body's code names what was refused: the workflow or its inputs.
                detail = [{**error, "code": WorkflowInputError.code} for error in exc.errors]
                raise InvalidCommand(exc.message, field=field, detail=detail) from None
        else:
            try:  # checked just above (or, for a re-run, when it was first submitted)
                entry, name = self.engine.prepare_plan(plan, inputs, checked=True)
            except PlanError as exc:
                raise InvalidCommand(exc.message, field="plan", detail=exc.errors) from None
        if schedule is not None:  # a schedule's tick (engine/schedules.py)
            entry["schedule"] = {"id": str(schedule.get("id")), "tick": str(schedule.get("tick"))}
        if rerun is not None and fork is not None:  # a fork replays the earlier run's entry
            entry = {**rerun["entry"], "rerun_of": rerun["rerun_of"]}
        elif rerun is not None:  # the earlier run and the restart point name the plan and reuse
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
            run_id, created, seq = self._start(entry, name, key, digest, given, fork)
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

    def _for_run(self, run_id: str, fn: Callable[[], Any], *, live: bool) -> Any:
        """Run a run's command on the loop; a run the engine no longer holds: finished (the store).

        ``live``: the API asks every engine; only the one holding the run
        answers, the others "not found" (the store is not asked).
        """
        try:
            return self._on_loop(fn)
        except RunNotFound:
            stored = None if live else self.stored.status(run_id)
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
            raise InvalidCommand(
                f"signal name {msg}", field="name", detail=[detail_at("name", msg)]
            )
        if reserved_signal(name) is not None:
            msg = reserved_signal_message(name)
            raise InvalidCommand(msg, field="name", detail=[detail_at("name", msg)])
        if not 0 < len(signal_id) <= 255:
            msg = "must be 1 to 255 characters"
            raise InvalidCommand(
                f"signal_id {msg}", field="signal_id", detail=[detail_at("signal_id", msg)]
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
            sent = self.stored.signal_sent(run_id, given) if given else None
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

    # -- scheduler thread (queued on the inbox) -------------------------------------------

    def _start(
        self,
        entry: dict[str, Any],
        name: str,
        key: str | None,
        digest: str,
        run_id: str | None = None,
        fork: tuple[list[tuple[int, bytes]], int | None] | None = None,
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
            # What kind of run (``plan``, ``workflow``...): ``tail`` says it beside the name.
            data={"name": name, "kind": read_entry(entry).kind.value},
        )
        start_seq = self.runtime.wal.next_seq  # the RUN_START's: the run's first record
        self.engine.start_entry(entry, run_id=run_id, name=name, on_end=self._on_end, fork=fork)
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
