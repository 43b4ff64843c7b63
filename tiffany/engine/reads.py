"""The engine's answers to the control requests that change nothing: its reads.

:class:`EngineReads` answers ``status``, ``verify``, ``export``,
``wait_projected``, ``metrics``, ``tools`` and ``check_plan``, on behalf of
:class:`~tiffany.engine.requests.ControlRequests`, which dispatches every
command and answers the ones that change a run (``submit``, ``rerun``,
``cancel``, ``signal``) itself.

Invariants:

- Nothing here touches the loop: a read looks at what the engine shows
  other threads (the run table, the journal's counts, the lifecycle), reads
  the journal as ``tiffany export`` does, or registers a future
  (``wait_projected``); none queues work on the inbox.
- A run the engine no longer holds is answered from the store
  (``stored_runs.py``), on a control thread.
- The engine refuses with domain errors (``tiffany/errors.py``), never with
  HTTP statuses.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final

from tiffany.agents import PlanError
from tiffany.agents.tools.llm import provider_status
from tiffany.config import Settings
from tiffany.engine.inbox import DurableWaits
from tiffany.errors import CommandTooLarge, InvalidCommand, RunNotFinished, RunNotFound
from tiffany.ports.journals import journals_for
from tiffany.wire.control import (
    MAX_WAIT_PROJECTED_S,
    CheckPlan,
    Export,
    MetricsText,
    PlanChecked,
    Projected,
    Verify,
    WaitProjected,
)
from tiffany.wire.documents import DocumentError
from tiffany.wire.documents import check as check_document
from tiffany.wire.shards import engine_stream

if TYPE_CHECKING:
    from tiffany.engine import Engine
    from tiffany.engine.requests import Lifecycle
    from tiffany.engine.run_table import RunTable
    from tiffany.engine.stored_runs import StoredRuns
    from tiffany.engine.verifier import Verifier
    from tiffany.observe.metrics import EngineMetrics
    from tiffany.projector.link import ProjectorLink

__all__ = ["MAX_EXPORT_BYTES", "MAX_RUNNING_LISTED", "EngineReads", "detail_at"]

#: Running runs a status lists by id (the count is always exact).
MAX_RUNNING_LISTED: Final = 100
#: Largest run export (``export``) sent over the control channel: base64 makes
#: it 4/3 as large, and a frame holds ``MAX_FRAME_BYTES`` (64 MiB).
MAX_EXPORT_BYTES: Final = 32 * 1024 * 1024


class EngineReads:
    """The answers to the requests that change nothing (see :mod:`tiffany.wire.control`).

    Args:
        settings: The engine's settings (its number, journal).
        engine: The engine (its runtime, slots, tools, trees).
        durable: The waits for the WAL to be durable (the seq durable now).
        runs: What the engine remembers of runs (``run_table.py``).
        stored: The store's answers about runs the engine no longer holds.
        projector: The projector process (``wait_projected``, its health).
        verifier: Replays a finished run (``verify``).
        metrics: The engine's registry (``metrics``).
        lifecycle: The engine process's phase and the like.
    """

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        durable: DurableWaits,
        runs: RunTable,
        stored: StoredRuns,
        projector: ProjectorLink,
        verifier: Verifier,
        metrics: EngineMetrics,
        lifecycle: Lifecycle,
    ) -> None:
        self.settings = settings
        #: This engine's journal and its peers' (:mod:`tiffany.ports.journals`).
        self.journals = journals_for(settings)
        self.engine = engine
        self.runtime = engine.runtime
        self.durable = durable
        self.runs = runs
        self.stored = stored
        self.projector = projector
        self.verifier = verifier
        self.metrics = metrics
        self.lifecycle = lifecycle

    def metrics_text(self) -> MetricsText:
        """The engine's metrics, in the Prometheus text format."""
        return MetricsText(text=self.metrics.render())

    def tools(self) -> Any:
        """The tools this engine has, described."""
        return self.engine.env.registry.describe()

    def check_plan(self, command: CheckPlan) -> PlanChecked:
        """A schedule's plan (or workflow), checked when it is added: its name, or the refusal.

        A workflow is checked as its submission is (``requests.py``): the
        same refusal, naming ``workflow`` or ``inputs.NAME``.
        """
        inputs = command.inputs or {}
        if command.workflow is not None:
            from tiffany.workflows import WorkflowInputError

            try:
                check_document(inputs, loc=["inputs"])
                _, name = self.engine.prepare_workflow(command.workflow, inputs)
            except DocumentError as exc:
                raise InvalidCommand(exc.message, field="inputs", detail=exc.detail) from None
            except WorkflowInputError as exc:
                field = str(exc.errors[0]["loc"]) if exc.errors else "workflow"
                detail = [{**error, "code": WorkflowInputError.code} for error in exc.errors]
                raise InvalidCommand(exc.message, field=field, detail=detail) from None
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

    def wait_projected(self, command: WaitProjected) -> Future[Any]:
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

    def verify(self, command: Verify) -> dict[str, Any]:
        """Replay a finished run against its journal: the report (``identical``, the verdict)."""
        run_id = command.run_id
        if not run_id:
            raise InvalidCommand("run_id is required", field="run_id", detail=[detail_at("run_id")])
        status = self.runs.status(run_id) or (None if command.live else self.stored.status(run_id))
        if status is None:
            raise RunNotFound(f"no run {run_id!r}")
        if status == "running":
            raise RunNotFinished(f"run {run_id} has not finished; only finished runs verify")
        report = self.verifier.verify(run_id)
        # "ok" is the envelope's: the report's verdict travels as "identical".
        report["identical"] = bool(report.pop("ok", False))
        return report

    def export(self, command: Export) -> dict[str, Any]:
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
            raise InvalidCommand("run_id is required", field="run_id", detail=[detail_at("run_id")])
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

    def status(self) -> dict[str, Any]:
        """The engine's state (``tiffany status``): its phase, runs, journal, projector."""
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
        if not self.journals.leased:
            return {"backend": "file", "path": str(self.runtime.wal_dir)}
        return {
            "backend": "postgres",
            "stream": engine_stream(self.settings.journal_stream, self.settings.engine),
            "owner": getattr(wal, "owner", None),
            "epoch": getattr(wal, "epoch", None),
            "lease_s": self.settings.journal_lease_s,
            "fenced": self.lifecycle.fenced() or wal.failed,
        }


def _sandbox_status(mode: str) -> str:
    return "none (UNSANDBOXED)" if mode == "none" else mode


def detail_at(loc: str, msg: str = "required") -> dict[str, Any]:
    """One item of an invalid command's detail."""
    return {"loc": loc, "msg": msg}


def _with_seq(fut: Future[dict[str, Any]], seq: int) -> Future[dict[str, Any]]:
    """``fut``'s answer (:class:`Projected`'s fields) with ``written_seq``, the seq it awaited."""
    out: Future[dict[str, Any]] = Future()
    fut.add_done_callback(lambda f: out.set_result({**f.result(), "written_seq": seq}))
    return out
