"""OpenTelemetry spans for runs and steps (the ``otel`` extra; docs/observability.md).

A run becomes a span ``run <name>``; each attempt of each plan step (and of
each ``tool(...)`` call of a workflow run) becomes a child span ``step <id>``.
They go out over OTLP/HTTP through the SDK's ``BatchSpanProcessor`` when the
environment asks for traces (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER``) and the
extra is installed; when it asks and the packages are missing, one warning
names the extra and the engine goes on. :func:`attach_from_env` is the one
hook (``engine.build``), so ``tiffany run`` and the engine of ``tiffany
serve`` both trace.

Threads: :class:`SpanRecorder` is a kernel instrument. Its hooks run on the
scheduler thread and only append a small tuple to a deque (O(1), never
blocks, never touches the SDK); its own thread drains the deque every
:data:`DRAIN_INTERVAL_S` and makes the spans. The SDK's batch processor then
exports them from its thread. The loop never waits on a collector.

Where the facts come from:
    * a run starts when its root task is spawned and ends when the root
      exits; its status is the journal's (``RunState.status``, set in the
      journal's own hook, which runs before this one);
    * a step's attempts come from the worker's report (its ``StepOutcome``, a dict) when
      the worker exits: each attempt's ``started_at``/``ended_at`` are the
      clock readings the journal recorded, its error the attempt's own. So a
      retried step shows one span per attempt, with the attempt's real times,
      even when the first attempt ran in an earlier life of the engine;
    * a step's tool comes from the run's plan (the plan entry the ``workflow``
      resolver receives: a plan run is the built-in workflow ``plan``) or
      from a tool task's label (a dynamic step);
    * a workflow run's ``tool(...)`` call has no worker: it runs in the
      workflow's task (``tiffany/workflows/calls.py``), which tells the
      recorder its outcome when it ends (``AgentEnv.call_ended``, wired by
      :func:`attach`); its attempts become step spans as a worker's report's
      do, named by the call's id (``step tool_1``). One replayed (its run
      catching up after a restart) is not exported again.

Trace ids: a run's spans share the trace id :func:`trace_id_of` derives from
the run id (the first 16 bytes of its SHA-256), so a run resumed after a
restart continues the same trace, and the trace of a run is found from its
id. Span ids are random.

Invariants: a run or step left open when the process ends (an engine stop,
Ctrl-C on ``tiffany run``) is ended by :meth:`SpanRecorder.close` at that
moment with status unset and ``tiffany.status`` ``interrupted``. A worker
that ends while its run replays (its step finished in an earlier life) is
not exported again: that life exported it. A recorder whose span making
raises is disabled and logged (observers fail soft); the run goes on.

Rejected: a subscriber of the PAL hub. The hub's events carry no step
outcome (a python step fails as a value inside its worker, with no task
crash) and ``tiffany run`` has no hub; the worker's report has both.
Rejected: opening a step span when each attempt starts: the attempt's
start is a journaled ``Now()`` inside the worker, invisible to an
instrument; the report at the worker's end has it exactly.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any, Final

import structlog

from tiffany import __version__
from tiffany.durable.journal import TaskMeta
from tiffany.kernel import Instrument, Task, current_task
from tiffany.wire.entries import Entry, EntryKind
from tiffany.wire.runstate import run_opening, step_report
from tiffany.wire.status import RunStatus, StepStatus, TaskState
from tiffany.wire.values import text_of

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

    from tiffany.durable import Runtime

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "OTEL_EXTRA_HINT",
    "SpanRecorder",
    "attach",
    "attach_from_env",
    "build_tracer_provider",
    "trace_id_of",
    "tracing_wanted",
]

log = structlog.get_logger(__name__)

#: ``service.name`` of the spans unless ``OTEL_SERVICE_NAME`` says otherwise.
DEFAULT_SERVICE_NAME: Final = "tiffany-engine"
#: How to install what tracing needs (said once when it is missing).
OTEL_EXTRA_HINT: Final = "pip install -e '.[otel]' (in Tiffany's checkout)"
#: How often the recorder's thread makes spans of what the loop queued, in seconds.
DRAIN_INTERVAL_S: Final = 0.05
#: How long :meth:`SpanRecorder.close` waits for its thread, in seconds.
CLOSE_JOIN_S: Final = 5.0
#: How long :meth:`SpanRecorder.close` waits for the last spans to be sent, in seconds.
CLOSE_FLUSH_S: Final = 3.0
#: Longest error text kept on a span, in characters.
MAX_ERROR_CHARS: Final = 500
#: Variables any one of which turns tracing on (OpenTelemetry's own names).
ENABLING_VARS: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
)

_warned: set[str] = set()  # "missing": the extra's absence is said once per process

Resolver = Callable[[Entry, str, int], Generator[Any, Any, Any]]


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Return whether the environment asks for traces (OpenTelemetry's variables)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENABLING_VARS)


def trace_id_of(run_id: str) -> int:
    """Return the trace id of run ``run_id``'s spans: the first 16 bytes of its SHA-256."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big") or 1


def build_tracer_provider(
    *,
    exporter: SpanExporter | None = None,
    processor: SpanProcessor | None = None,
    environ: Mapping[str, str] | None = None,
) -> TracerProvider:
    """Return a tracer provider for the recorder (needs the ``otel`` extra).

    Args:
        exporter: Where spans go, through a ``BatchSpanProcessor`` (default:
            OTLP/HTTP configured by the ``OTEL_EXPORTER_OTLP_*`` variables, or
            the console for ``OTEL_TRACES_EXPORTER=console``).
        processor: A span processor to use instead (tests: a
            ``SimpleSpanProcessor`` over an in-memory exporter).
        environ: The environment read (default: ``os.environ``).
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    env = os.environ if environ is None else environ
    attributes: dict[str, str] = {SERVICE_VERSION: __version__}
    if not env.get("OTEL_SERVICE_NAME", "").strip():
        attributes[SERVICE_NAME] = DEFAULT_SERVICE_NAME
    # Resource.create adds OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME.
    provider = TracerProvider(
        resource=Resource.create(attributes),
        id_generator=_run_trace_ids()(),
        shutdown_on_exit=False,  # SpanRecorder.close shuts it down, after its last spans
    )
    if processor is None:
        processor = BatchSpanProcessor(exporter if exporter is not None else _exporter(env))
    provider.add_span_processor(processor)
    return provider


def _exporter(environ: Mapping[str, str]) -> SpanExporter:
    """The exporter ``OTEL_TRACES_EXPORTER`` names: ``otlp`` (HTTP, the default) or ``console``."""
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout: the OTEL_EXPORTER_OTLP_* variables


@functools.cache
def _run_trace_ids() -> Any:
    """The SDK's ``IdGenerator`` subclass (made once, when the SDK is importable)."""
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

    class RunTraceIds(IdGenerator):
        """Random span ids; the next trace id is the run's (:func:`trace_id_of`) when set.

        Only the recorder's thread makes spans with its provider, so the
        attribute it sets around a ``start_span`` needs no lock.
        """

        def __init__(self) -> None:
            self._random = RandomIdGenerator()
            #: The trace id the next root span gets (0: a random one).
            self.next_trace_id = 0

        def generate_span_id(self) -> int:
            return self._random.generate_span_id()

        def generate_trace_id(self) -> int:
            return self.next_trace_id or self._random.generate_trace_id()

    return RunTraceIds


def attach_from_env(
    runtime: Runtime, environ: Mapping[str, str] | None = None, *, env: Any = None
) -> SpanRecorder | None:
    """Trace ``runtime``'s runs when the environment asks for it; return the recorder.

    ``env``: the engine's ``AgentEnv`` (its workflows' tool calls: :func:`attach`).

    None when no OpenTelemetry variable asks for traces, or when the ``otel``
    extra is missing (then one warning names it, once per process).
    """
    env = os.environ if environ is None else environ
    if not tracing_wanted(env):
        return None
    try:
        provider = build_tracer_provider(environ=env)
    except ImportError as exc:
        if "missing" not in _warned:
            _warned.add("missing")
            log.warning(
                "otel.unavailable",
                message=f"OpenTelemetry variables are set but the packages are missing: "
                f"{OTEL_EXTRA_HINT} to export run and step spans",
                missing=exc.name,
            )
        return None
    recorder = attach(runtime, provider, env=env)
    atexit.register(recorder.close)
    return recorder


def attach(runtime: Runtime, provider: TracerProvider, *, env: Any = None) -> SpanRecorder:
    """Record ``runtime``'s runs and steps as spans of ``provider``; start the recorder.

    Call before the runtime takes runs (``engine.build`` does). The caller
    (or the process's exit) calls :meth:`SpanRecorder.close`. ``env``: the
    engine's ``AgentEnv``, whose workflow runs' ``tool(...)`` calls are then
    told to :meth:`SpanRecorder.call_ended` (None: their calls make no spans).
    """
    recorder = SpanRecorder(provider, clock=runtime.sched.clock.time)
    runs = runtime.resolvers.get(EntryKind.WORKFLOW.value)  # plan runs' too: workflow plan
    if runs is not None:
        runtime.resolvers[EntryKind.WORKFLOW.value] = recorder.watch_plans(runs)
    if env is not None:
        env.call_ended = recorder.call_ended
    runtime.sched.add_instrument(recorder)
    recorder.start()
    return recorder


class _OpenRun:
    """A run's span while it or one of its steps is open, and its steps' tools.

    A run ends before its cancelled steps do: the root exits first and the
    journal then cancels the run's other tasks (a cancel, a failed step's
    siblings, a kill). So a run whose span has ended stays here, with
    ``ended_ns`` set, until ``open_steps`` falls to 0: its steps' spans are
    still its children.
    """

    __slots__ = ("ended_ns", "open_steps", "span", "tools")

    def __init__(self, span: Span | None, tools: dict[str, str]) -> None:
        self.span = span
        self.tools = tools
        #: Steps of this life started and not yet ended.
        self.open_steps = 0
        #: When the run's span ended (ns), or None while it is open.
        self.ended_ns: int | None = None


class SpanRecorder(Instrument):
    """Turn runs and step attempts into spans (see the module docstring).

    Args:
        provider: The tracer provider spans are made with (and shut down by
            :meth:`close`).
        clock: The wall clock runs' and steps' own times come from (the
            scheduler's ``clock.time``, which ``Now()`` reads too).
    """

    def __init__(self, provider: TracerProvider, *, clock: Callable[[], float]) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("tiffany", __version__)
        self._clock = clock
        self._queue: deque[tuple[Any, ...]] = deque()
        self._runs: dict[str, _OpenRun] = {}
        self._plans: dict[str, dict[str, str]] = {}  # run id -> step id -> tool, before its root
        self._steps: dict[int, tuple[str, str, float]] = {}  # worker tid -> run, step, start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Set when making spans failed: the hooks stop queueing (fail soft).
        self.disabled = False
        #: Spans made (ended) so far.
        self.spans = 0

    @property
    def open_runs(self) -> int:
        """Runs whose span, or a step of which, is still open (the recorder's thread)."""
        return len(self._runs)

    # -- scheduler thread: O(1) appends only ------------------------------------------

    def watch_plans(self, resolver: Resolver) -> Resolver:
        """Wrap the ``workflow`` resolver: note each plan run's entry (its steps' tools)."""
        queue = self._queue

        def resolve(entry: Entry, run_id: str, compat: int) -> Generator[Any, Any, Any]:
            if not self.disabled and entry.plan_doc is not None:
                queue.append(("plan", run_id, entry))
            return resolver(entry, run_id, compat)

        return resolve

    def call_ended(self, run_id: str, step_id: str, tool: str, outcome: Any) -> None:
        """Queue a workflow's ``tool(...)`` call's end: its attempts, as a worker's report.

        Called in the workflow's task (on the loop); a call replayed as its
        run catches up was exported by the life that made it.
        """
        task = current_task()
        meta = task.meta if task is not None else None
        if self.disabled or (meta.__class__ is TaskMeta and meta.run.replay is not None):
            return
        got = step_report(outcome)
        if got is None:
            return
        report = (got.ok, got.error, got.attempts or [])
        self._queue.append(("call_end", run_id, step_id, tool, self._clock(), report))

    def task_spawned(self, task: Task) -> None:
        """Queue a run's start (its root) or a step's (its worker, or a tool task's tool)."""
        meta = task.meta
        if meta.__class__ is not TaskMeta or self.disabled:
            return
        run = meta.run
        if run.root is task:
            self._queue.append(("run", run.run_id, run.name, self._clock(), run.replay is not None))
            return
        label = meta.label
        if label.role == "worker":
            self._queue.append(("step", task.id, run.run_id, label.step_id, self._clock()))
        elif label.role == "tool" and label.tool is not None:
            self._queue.append(("tool", run.run_id, label.step_id, label.tool))

    def task_exited(self, task: Task) -> None:
        """Queue a run's or a worker's end (DONE or CANCELLED)."""
        self._ended(task, None)

    def task_crashed(self, task: Task, error: BaseException) -> None:
        """Queue a run's or a worker's end by an exception."""
        self._ended(task, error)

    def _ended(self, task: Task, error: BaseException | None) -> None:
        meta = task.meta
        if meta.__class__ is not TaskMeta or self.disabled:
            return
        run = meta.run
        if run.root is task:
            # The journal's hook ran first: the run's status and error are set.
            self._queue.append(("run_end", run.run_id, self._clock(), run.status, run.error))
        elif meta.label.role == "worker":
            state = task.state.value
            report = None
            if error is None and state == TaskState.DONE:
                # The worker's result: its outcome as a dict (journal version 3 on),
                # or the StepOutcome itself.
                got = step_report(task.result)
                report = None if got is None else (got.ok, got.error, got.attempts)
            self._queue.append(
                ("step_end", task.id, self._clock(), state, report, error, run.replay is not None)
            )

    # -- the recorder's thread ----------------------------------------------------------

    def start(self) -> None:
        """Start the thread that makes the spans."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tiffany-otel", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(DRAIN_INTERVAL_S):
            self.drain()

    def drain(self) -> int:
        """Make spans of what the loop queued; return how many items were taken."""
        queue, taken = self._queue, 0
        while queue and not self.disabled:
            item = queue.popleft()
            taken += 1
            try:
                getattr(self, "_on_" + item[0])(*item[1:])
            except Exception as exc:  # noqa: BLE001 - observers fail soft (disabled, logged)
                self.disabled = True
                queue.clear()
                log.warning("otel.disabled", error=repr(exc), item=item[0])
        return taken

    def close(self) -> None:
        """End what is still open (status unset), flush and shut the provider down.

        The flush waits at most :data:`CLOSE_FLUSH_S` (a collector down or slow
        costs the exit no more). Idempotent; registered with ``atexit`` by :func:`attach_from_env`.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(CLOSE_JOIN_S)
            self._thread = None
        self.drain()
        if not self.disabled:
            now = _ns(self._clock())
            for tid in list(self._steps):
                self._step_interrupted(tid, now)
            for open_run in self._runs.values():
                if open_run.span is not None and open_run.ended_ns is None:
                    open_run.span.set_attribute("tiffany.status", "interrupted")
                    open_run.span.end(end_time=now)
                    self.spans += 1
            self._runs.clear()
        # Flush and shut down, waiting a bounded time: with the collector down,
        # the exporter's retries would hold the process's exit for seconds.
        flush = threading.Thread(target=self.provider.shutdown, name="tiffany-otel-flush")
        flush.daemon = True
        flush.start()
        flush.join(CLOSE_FLUSH_S)
        if flush.is_alive():
            log.warning("otel.flush_timeout", waited_s=CLOSE_FLUSH_S, note="spans not sent")

    def _on_plan(self, run_id: str, entry: Entry) -> None:
        opening = run_opening(entry)
        self._plans[run_id] = {sid: tool for sid, tool in opening.steps if tool is not None}

    def _on_run(self, run_id: str, name: str, ts: float, resumed: bool) -> None:
        from opentelemetry.trace import SpanKind

        ids = self.provider.id_generator
        if hasattr(ids, "next_trace_id"):
            ids.next_trace_id = trace_id_of(run_id)
        try:
            span = self.tracer.start_span(
                f"run {name}",
                kind=SpanKind.INTERNAL,
                attributes={
                    "tiffany.run_id": run_id,
                    "tiffany.plan": name,
                    "tiffany.resumed": resumed,
                },
                start_time=_ns(ts),
            )
        finally:
            if hasattr(ids, "next_trace_id"):
                ids.next_trace_id = 0
        self._runs[run_id] = _OpenRun(span, self._plans.pop(run_id, {}))

    def _on_tool(self, run_id: str, step_id: str | None, tool: str) -> None:
        open_run = self._runs.get(run_id)
        if open_run is not None and step_id is not None:
            open_run.tools.setdefault(step_id, tool)

    def _on_call_end(
        self,
        run_id: str,
        step_id: str,
        tool: str,
        ts: float,
        report: tuple[bool, Mapping[str, Any] | None, list[dict[str, Any]]],
    ) -> None:
        open_run = self._runs.get(run_id)
        if open_run is not None:
            open_run.tools.setdefault(step_id, tool)
        started = next((float(a["started_at"]) for a in report[2] if "started_at" in a), ts)
        self._step_ended(run_id, step_id, started, ts, TaskState.DONE, report, None)

    def _on_step(self, tid: int, run_id: str, step_id: str, ts: float) -> None:
        self._steps[tid] = (run_id, step_id, ts)
        open_run = self._runs.get(run_id)
        if open_run is not None:
            open_run.open_steps += 1

    def _step_closed(self, run_id: str) -> None:
        """One of run ``run_id``'s steps ended: forget an ended run with none left open."""
        open_run = self._runs.get(run_id)
        if open_run is None:
            return
        open_run.open_steps -= 1
        if open_run.ended_ns is not None and open_run.open_steps <= 0:
            del self._runs[run_id]

    def _on_step_end(
        self,
        tid: int,
        ts: float,
        state: str,
        report: tuple[bool, Mapping[str, Any] | None, list[dict[str, Any]]] | None,
        error: BaseException | None,
        replayed: bool,
    ) -> None:
        opened = self._steps.pop(tid, None)
        if opened is None:
            return  # a step this life did not see start
        run_id, step_id, started = opened
        try:
            if not replayed:  # a step an earlier life exported is not exported again
                self._step_ended(run_id, step_id, started, ts, state, report, error)
        finally:
            self._step_closed(run_id)

    def _step_ended(
        self,
        run_id: str,
        step_id: str,
        started: float,
        ts: float,
        state: str,
        report: tuple[bool, Mapping[str, Any] | None, list[dict[str, Any]]] | None,
        error: BaseException | None,
    ) -> None:
        if report is None:  # cancelled, killed or crashed: one span for the whole step
            status = StepStatus.FAILED.value
            if state == TaskState.CANCELLED:
                status = RunStatus.CANCELLED.value  # a step's span says the run's word
            info = None if error is None else _error_of(error)
            self._step_span(run_id, step_id, None, started, ts, status, info)
            return
        ok, step_error, attempts = report
        made = 0
        for attempt in attempts:
            if "reused" in attempt or "started_at" not in attempt:
                continue
            good = bool(attempt.get("ok"))
            begin = float(attempt["started_at"])
            end = float(attempt.get("ended_at") or begin)
            info = None if good else attempt.get("error")
            status = (StepStatus.SUCCEEDED if good else StepStatus.FAILED).value
            number = attempt.get("attempt")
            self._step_span(run_id, step_id, number, begin, end, status, info)
            made += 1
        if not made:  # no attempt ran (its arguments were refused): the step itself
            status = (StepStatus.SUCCEEDED if ok else StepStatus.FAILED).value
            self._step_span(run_id, step_id, None, started, ts, status, step_error)

    def _on_run_end(self, run_id: str, ts: float, status: str, error: Any) -> None:
        from opentelemetry.trace import Status, StatusCode

        open_run = self._runs.get(run_id)
        if open_run is None:
            return
        if open_run.open_steps <= 0:
            del self._runs[run_id]
        else:  # its steps end after it (cancelled at its end): still its children
            open_run.ended_ns = _ns(ts)
        span = open_run.span
        if span is None:
            return
        span.set_attribute("tiffany.status", status)
        if status == RunStatus.SUCCEEDED:
            span.set_status(Status(StatusCode.OK))
        elif status == RunStatus.FAILED:
            message = _text(error) if error is not None else "failed"
            span.set_attribute("tiffany.error", message)
            if error is not None:
                span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, message))
        span.end(end_time=_ns(ts))
        self.spans += 1

    def _step_interrupted(self, tid: int, now_ns: int) -> None:
        run_id, step_id, started = self._steps.pop(tid)
        try:
            span = self._start_step(run_id, step_id, None, started)
            span.set_attribute("tiffany.status", "interrupted")
            span.end(end_time=self._step_end_ns(run_id, now_ns, _ns(started)))
            self.spans += 1
        finally:
            self._step_closed(run_id)

    def _step_end_ns(self, run_id: str, end_ns: int, begin_ns: int) -> int:
        """A step span's end: not before its start, nor after its run's span's end.

        A step cancelled by its run's end is cancelled a moment after the
        root exits (the same pass of the loop); its span ends with the run's
        so the trace nests.
        """
        open_run = self._runs.get(run_id)
        if open_run is not None and open_run.ended_ns is not None:
            end_ns = min(end_ns, open_run.ended_ns)
        return max(end_ns, begin_ns)

    def _start_step(self, run_id: str, step_id: str, attempt: Any, begin: float) -> Span:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        open_run = self._runs.get(run_id)
        attributes: dict[str, Any] = {"tiffany.run_id": run_id, "tiffany.step_id": step_id}
        tool = open_run.tools.get(step_id) if open_run is not None else None
        if tool is not None:
            attributes["tiffany.tool"] = tool
        if isinstance(attempt, int):
            attributes["tiffany.attempt"] = attempt
        context = None
        ids = self.provider.id_generator
        if open_run is not None and open_run.span is not None:
            context = trace.set_span_in_context(open_run.span)
        elif hasattr(ids, "next_trace_id"):  # its run's span is gone: the same trace still
            ids.next_trace_id = trace_id_of(run_id)
        try:
            return self.tracer.start_span(
                f"step {step_id}",
                context=context,
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=_ns(begin),
            )
        finally:
            if hasattr(ids, "next_trace_id"):
                ids.next_trace_id = 0

    def _step_span(
        self,
        run_id: str,
        step_id: str,
        attempt: Any,
        begin: float,
        end: float,
        status: str,
        error: Mapping[str, Any] | None,
    ) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self._start_step(run_id, step_id, attempt, begin)
        span.set_attribute("tiffany.status", status)
        if status == StepStatus.SUCCEEDED:
            span.set_status(Status(StatusCode.OK))
        elif status == StepStatus.FAILED:
            message = _text(error.get("message") if error else None) or "failed"
            span.set_attribute("tiffany.error", message)
            if error and isinstance(error.get("type"), str):
                span.set_attribute("error.type", error["type"])
            span.set_status(Status(StatusCode.ERROR, message))
        span.end(end_time=self._step_end_ns(run_id, _ns(end), _ns(begin)))
        self.spans += 1


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _text(value: Any) -> str:
    """An error's text as an attribute takes it (a lone surrogate escaped; never raises)."""
    return "" if value is None else text_of(value)[:MAX_ERROR_CHARS]


def _error_of(error: BaseException) -> dict[str, Any]:
    cause = error.__cause__ or error
    return {"type": type(cause).__name__, "message": _text(cause)}
