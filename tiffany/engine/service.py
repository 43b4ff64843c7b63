"""The engine process: the kernel loop with its journal, PAL, projector and control channel.

``tiffany serve`` runs this in a process of its own (``tiffany engine``);
the API side-process talks to it over two Unix sockets in the data dir::

    control.sock   commands (tiffany.control: status, submit, cancel, signal, verify, metrics)
    feed.sock      the PAL feed (tiffany.pal.transport)

Threads: the **scheduler loop runs on the main thread** and is the only
thread that touches the kernel, the journal or the WAL. Everything else
reaches it through the :class:`~tiffany.engine.inbox.Inbox`, a kernel task
that sleeps on an eventfd (``ReadWait``) and runs the callables other
threads queue. The control server's threads parse and validate requests,
and one waiting for a submission to be durable sleeps on a future of its
own, woken once (``inbox.DurableWaits``); the hub's thread
encodes and fans out activity events; after each group commit the loop
tells the projector process how far the WAL is durable (one non-blocking
pipe write), and the process tails the WAL into the SQL store (see
``projector_link.py``). None of them ever makes the loop
wait: the loop only appends to deques and sets events.

Start-up: the sockets come up first, so ``/readyz`` can say "recovering";
then the WAL is read from the newest checkpoint on (docs/wal-format.md,
"Checkpoints and retention") and unfinished runs are replayed up to the end
of their journal, after which they go live. A checkpointer thread
(``durable/retention.py``) then writes checkpoints and releases finished,
projected segments per ``TIFFANY_WAL_RETAIN``; the loop only pokes it. What
the engine remembers of runs is bounded (``run_table.py``). ``ready`` turns true when no run
is replaying any more. Submissions that arrive meanwhile wait in the inbox.

Shutdown (SIGINT/SIGTERM, or :meth:`EngineService.request_stop`): the
control server stops taking requests, the loop stops at the next pass
(``Scheduler.stop``: nothing is killed, so unfinished runs stay unfinished
in the WAL and are resumed by the next start), the journal commits, the
projector applies what is left, and the process exits 0.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Generator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import structlog

from tiffany.agents import PlanError
from tiffany.config import Settings, scrub_secrets
from tiffany.control import (
    CONTROL_SOCKET,
    MAX_WAIT_PROJECTED_S,
    ControlError,
    submission_digest,
)
from tiffany.documents import SIGNAL_NAME_PATTERN, DocumentError
from tiffany.documents import check as check_document
from tiffany.durable.checkpoint import KeyEntry
from tiffany.durable.history import checkpoint_of
from tiffany.durable.retention import CHECKPOINT_EVERY_RUNS, Checkpointer, Retain, StreamLog
from tiffany.engine import Engine, build, journal_log, take_slot
from tiffany.engine.activity import ActivityLog
from tiffany.engine.control_server import ControlServer
from tiffany.engine.inbox import DurableWaits, Inbox, settle
from tiffany.engine.metrics import EngineMetrics, project_health
from tiffany.engine.projector_link import ProjectorLink
from tiffany.engine.run_table import RunTable
from tiffany.engine.schedules import ScheduleRunner
from tiffany.engine.timeouts import Timeouts
from tiffany.engine.verifier import Verifier
from tiffany.errors import KernelError, NondeterminismError
from tiffany.kernel import ReadWait
from tiffany.pal import EVENT_KINDS, FEED_SEQ_FILE, Hub
from tiffany.pal.transport import FEED_SOCKET, FeedServer
from tiffany.shards import engine_stream, note_owner, seq_base
from tiffany.wal import Wal

if TYPE_CHECKING:
    from tiffany.engine.db_requests import RequestClaimer
    from tiffany.engine.pg_feed import NotifyFeed

__all__ = ["FEED_SOCKET", "EngineService", "Inbox"]

#: Running runs a status lists by id (the count is always exact).
MAX_RUNNING_LISTED: Final = 100

log = structlog.get_logger(__name__)

#: How long a submission waits for the loop and its group commit, in seconds.
SUBMIT_TIMEOUT_S: Final = 30.0
_BUSY: Final = "the engine is busy or recovering; try again"
#: How long a signal sent again to a finished run waits for the store to hold
#: the run's end before its first delivery is looked up there, in seconds.
SIGNAL_LOOKUP_WAIT_S: Final = 5.0
#: How long a re-run waits for the store to hold what the journal has
#: written (the earlier run's end) before it reads the run there, in seconds.
RERUN_SOURCE_WAIT_S: Final = 5.0
_NOT_DURABLE: Final = "the submission was not made durable in time"
_SIGNAL_NAME: Final = re.compile(SIGNAL_NAME_PATTERN)
#: Exit code of an engine that stopped because a run's replay diverged
#: (that run is marked failed; a restart resumes the others).
EXIT_RUN_DIVERGED: Final = 3
#: Exit code of an engine that refused a damaged WAL: restarting it cannot
#: help (``tiffany serve`` stops instead); a person runs ``tiffany wal repair``.
#: The CLI's table's ``WAL_DAMAGED`` (tiffany/cli/exits.py), which serve reads
#: without importing the engine (0.6 s before its first child could start).
EXIT_WAL_DAMAGED: Final = 4
#: How long the stop waits on the projector after the WAL failed (disk full or
#: broken: the projector may hang on the same disk; it is killed after this).
WAL_FAILED_STOP_S: Final = 0.3
#: How long the engine waits for its projector's first report before it says
#: it is up (``ready``, the ready file) anyway, in seconds: a projector that
#: cannot reach its store reports that too, so this bound is seldom reached.
ANNOUNCE_WAIT_S: Final = 5.0


def _migrate(database_url: str) -> None:
    """Bring the store's schema up to date (logged, not fatal: the projector retries)."""
    from tiffany.store.migrate import upgrade_url

    try:
        upgrade_url(database_url)
    except Exception as exc:  # noqa: BLE001 - the projector process migrates again
        log.warning("store.migrate_failed", error=repr(exc))


def _quick(request: dict[str, Any]) -> bool:
    """Whether :meth:`EngineService.handle` answers ``request`` without blocking.

    Such requests are handled on their connection's thread, not the control
    pool's (``engine/control_server.py``): a submission checks its plan and
    queues it for the loop (a re-run's reads the store: not quick), a
    ``wait_projected`` registers a future.
    """
    op = request.get("op")
    return op == "wait_projected" or (op == "submit" and request.get("rerun_of") is None)


def _drain(fd: int) -> Generator[Any, Any, None]:
    """Empty the signal wakeup pipe whenever it is readable (a kernel task)."""
    while True:
        yield ReadWait(fd)
        with contextlib.suppress(BlockingIOError):
            while os.read(fd, 512):
                pass


def _sandbox_status(mode: str) -> str:
    return "none (UNSANDBOXED)" if mode == "none" else mode


class EngineService:
    """An engine that serves plans submitted over the control channel.

    Args:
        settings: The process settings (data dir, database URL, tools...).
        enabled_tools: Tools this engine may run (default: the settings').
    """

    def __init__(self, settings: Settings, *, enabled_tools: list[str] | None = None) -> None:
        log = None
        #: The note naming this engine's lease holder to its API (shards.note_owner).
        self._owner_note: Path | None = None
        if settings.journal == "postgres":
            from tiffany.pgwal import new_owner

            owner = new_owner()
            # Before the lease: an API here never counts it as an engine elsewhere.
            self._owner_note = note_owner(settings.data_dir, owner)
            try:
                if settings.engine_slots:
                    # Become the engine of the first free stream (or wait for one).
                    settings, log = take_slot(settings, owner)
                else:  # a server waits as long as another engine holds the stream
                    log = journal_log(settings, wait_s=float("inf"), owner=owner)
            except BaseException:
                self._owner_note.unlink(missing_ok=True)
                raise
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.hub = Hub(
            seq_file=self.data_dir / FEED_SEQ_FILE,
            engine=settings.engine,
            base=seq_base(settings.engine),
        )
        self.activity = ActivityLog(self.hub, runs_only=True)
        self.engine: Engine = build(
            settings,
            log=log,
            enabled_tools=enabled_tools,
            instruments=[self.activity],
            emit=self._emit,
            server=True,  # shell steps: bubblewrap or refuse, unless sandbox "none"
        )
        self.runtime = self.engine.runtime
        self.hub.follow_wal(self.runtime.wal)  # feed seqs follow the WAL (tiffany/pal/hub.py)
        self.runtime.journal.on_hold = self.activity.step_held
        self.inbox = Inbox()
        #: Submissions' timeouts (a submission holds no control thread while it waits).
        self.timeouts = Timeouts(SUBMIT_TIMEOUT_S)
        #: The feed through the database (journal=postgres): API replicas on any host.
        self.pg_feed: NotifyFeed | None = None
        if settings.journal == "postgres":
            from tiffany.engine.pg_feed import NotifyFeed

            self.pg_feed = NotifyFeed(self.hub, settings.database_url, settings.engine)
        child_env = {  # the projector needs the store, not the LLM key nor the API token
            **scrub_secrets(dict(os.environ)),
            "TIFFANY_DATA_DIR": str(self.data_dir),
            "TIFFANY_DATABASE_URL": settings.database_url,
            "TIFFANY_LOG_FORMAT": settings.log_format,
            "TIFFANY_LOG_LEVEL": settings.log_level,
            # The journal it tails: this engine's (a slot taken at start included).
            "TIFFANY_ENGINE": str(settings.engine),
            "TIFFANY_JOURNAL": settings.journal,
            "TIFFANY_JOURNAL_STREAM": settings.journal_stream,
            "TIFFANY_PROJECTOR_NICE": str(settings.projector_nice),
        }
        child_env.pop("TIFFANY_ENGINE_SLOTS", None)
        self.projector = ProjectorLink(self.data_dir, child_env)
        # What the WAL already holds counts in the lag before the first commit.
        self.projector.durable_seq = self.runtime.wal.durable_seq
        self.projector.on_quarantine = self._quarantined
        self.metrics = EngineMetrics(self._pulled_metrics)
        self.engine.watchdog.on_report = self.metrics.slow
        #: The WAL's durable seq, and the control threads waiting for it to pass theirs.
        self.durable = DurableWaits(self.runtime.wal.durable_seq)
        self.runtime.wal.on_commit = self._on_commit
        self._fenced = False  # the journal's lease was taken over (PostgreSQL)
        self.runtime.wal.on_lost = self._lease_lost  # a PostgreSQL stream's lease taken over
        self.control = ControlServer(self.data_dir / CONTROL_SOCKET, self.handle, _quick)
        self.feed = FeedServer(self.hub, self.data_dir / FEED_SOCKET)
        self.verifier = Verifier(settings)
        #: Running runs, the newest finished ones, idempotency keys in their window.
        self.runs = RunTable(window_s=settings.idempotency_window_s)
        self.engine.known_run = lambda run_id: self.runs.status(run_id) is not None
        self.engine.child_started = self.runs.started
        self.engine.child_ended = self._on_end
        self.checkpointer: Checkpointer | None = None
        #: Engine 0's schedule ticks (engine/schedules.py).
        self.schedules: ScheduleRunner | None = None
        #: Requests through the database (journal=postgres): engine/db_requests.py.
        self.claimer: RequestClaimer | None = None
        self._store: Any = None  # the store's SQLAlchemy engine, for _stored_status
        self._store_lock = threading.Lock()
        self._ended_since_checkpoint = 0
        self.started_at = time.time()  # noqa: TID251 - wall clock for status, not task code
        self._phase = "starting"  # starting -> scanning -> replaying -> ready -> stopping
        self._leaving = threading.Event()  # the loop has ended
        self._replaying: set[str] = set()
        self._loop_error: BaseException | None = None
        self._stopping = False

    # -- lifecycle (main thread) -----------------------------------------------------

    def serve(
        self, *, install_signals: bool = True, ready: Callable[[], None] | None = None
    ) -> int:
        """Start everything, recover, run the loop until stopped; return an exit code."""
        wakeup: tuple[int, int] | None = None
        announcer: threading.Thread | None = None
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self.request_stop())
            # A signal may land on any thread; the Python handler only runs
            # once the main thread runs bytecode. The wakeup fd makes the
            # loop's epoll return (a kernel task drains it), so it does.
            wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            signal.set_wakeup_fd(wakeup[1], warn_on_full_buffer=False)
        _migrate(self.settings.database_url)  # the API reads the store as soon as we are up
        self.hub.start()
        self.feed.start()
        if self.pg_feed is not None:
            self.pg_feed.start()
        self.projector.start()
        self.control.start()
        try:
            self._phase = "scanning"
            resumed = self.engine.recover_runs(self._on_end)
            self._start_requests()  # before the index is dropped: it settles from it
            self._start_retention()
            if self.settings.engine == 0:  # engine 0 fires the schedules' ticks
                self.schedules = ScheduleRunner(
                    self.settings.database_url, lambda request: self._submit(request).result()
                )
                self.schedules.start()
            self._replaying = set(resumed)
            self._phase = "replaying" if resumed else "ready"
            log.info(
                "engine.started",
                data_dir=str(self.data_dir),
                resumed=len(resumed),
                control=str(self.control.path),
                feed=str(self.feed.path),
            )
            if self.settings.shell_sandbox == "none":
                log.warning(
                    "engine.shell_unsandboxed",
                    message="TIFFANY_SHELL_SANDBOX=none: shell steps run UNSANDBOXED",
                )
            self.runtime.sched.spawn(self.inbox.task(), name="engine-inbox")
            if wakeup is not None:
                self.runtime.sched.spawn(_drain(wakeup[0]), name="engine-signals", daemon=True)
            if resumed:
                self.inbox.call(self._watch_replay)
            if ready is not None:
                # Off the loop: once the projector has reported, reads with
                # ``min_seq`` are answered and /readyz says ready (serve's API
                # listens once this is called: its first client sees no 503).
                announcer = threading.Thread(
                    target=self._announce, args=(ready,), name="tiffany-ready", daemon=True
                )
                announcer.start()
            self.runtime.run()
            return 1 if self._fenced else 0  # stepped down: not a clean stop
        except NondeterminismError as exc:
            # A run's code no longer matches its journal. Fail that run (its
            # RUN_END keeps recovery away from it) and exit: the next start
            # (serve restarts the engine) resumes every other run.
            self._loop_error = exc
            run_id = str(exc.fields.get("run_id"))
            failed = self.runtime.journal.fail_run(run_id, exc)
            log.error("engine.run_diverged", run_id=run_id, marked_failed=failed, restart=True)
            return EXIT_RUN_DIVERGED
        except BaseException as exc:
            self._loop_error = exc
            if self.runtime.wal.failed:
                # Fail-stop (disk full, I/O error): an operational failure, not a
                # bug; one line, no traceback to render while submitters wait.
                log.error("engine.wal_failed", error=str(exc), durable_seq=self.durable_seq)
                return 1
            log.exception("engine.failed")
            return 1
        finally:
            self._leaving.set()  # an engine that exits at once (a diverged run) says so too
            if announcer is not None:
                announcer.join()
            self._phase = "stopping"
            if self.schedules is not None:
                self.schedules.stop()
            self.control.stop()
            self.verifier.close()
            if self._loop_error is not None:  # nothing more becomes durable
                self.durable.fail(ControlError(503, _NOT_DURABLE))
            self.inbox.close()
            self.timeouts.close()
            if self.claimer is not None:
                self.claimer.stop()  # what it holds is answered, or goes back to pending
            # Fail-stop (docs/wal-format.md): when the WAL failed, the disk may be
            # full or broken, and whatever writes to it (the projector) may hang
            # on it; wait on nothing for long, so that `serve` restarts us soon.
            wal_failed = self.runtime.wal.failed
            try:
                self.runtime.close()
            except Exception:
                log.exception("engine.close_failed")
            if self._owner_note is not None:  # its lease is given back
                self._owner_note.unlink(missing_ok=True)
            self.durable.fail(ControlError(503, "the engine is stopping"))
            self.projector.stop(timeout=WAL_FAILED_STOP_S if wal_failed else 15.0)
            if self.checkpointer is not None and not wal_failed:
                self.checkpointer.stop()  # a last checkpoint: the next start reads little
            self.feed.stop()
            if self.pg_feed is not None:
                self.pg_feed.stop()
            self.hub.stop()
            if self._store is not None:
                self._store.dispose()
            if wakeup is not None:
                signal.set_wakeup_fd(-1)
                for fd in wakeup:
                    os.close(fd)
            log.info("engine.stopped", durable_seq=self.durable_seq)

    def _start_requests(self) -> None:
        """On the PostgreSQL journal, take requests from the database too (docs/engines.md)."""
        if self.settings.journal != "postgres":
            return
        from tiffany.engine.db_requests import RequestClaimer
        from tiffany.pgwal import PgLog

        wal = cast(PgLog, self.runtime.wal)
        self.claimer = RequestClaimer(
            self.settings.database_url,
            self.settings.engine,
            lambda: (wal.stream, wal.epoch),
            self.handle,
            window_s=self.settings.idempotency_window_s,
            load=lambda: len(self.runs.running),
        )
        index = self.runtime.index
        known = {r.run_id: r.first_seq for r in index.runs.values()} if index else {}
        self.claimer.settle(known)
        self.claimer.start()

    def _start_retention(self) -> None:
        """Remember what recovery found, drop its index, start the checkpointer."""
        index = self.runtime.index
        if index is None:
            return
        self.runs.load(index)
        base = checkpoint_of(index, self.settings.idempotency_window_s)
        self.runtime.index = None  # after a full scan it holds every run: let it go
        wal = self.runtime.wal
        source = self.runtime.source  # the WAL directory, or the PostgreSQL stream
        self.checkpointer = Checkpointer(
            source if isinstance(source, Path) else cast(StreamLog, source),
            base,
            durable_seq=lambda: wal.durable_seq,
            projected_seq=lambda: self.projector.last_seq,
            retain=Retain(self.settings.wal_retain),
            window_s=self.settings.idempotency_window_s,
            durable_ends=wal.durable_ends if isinstance(wal, Wal) else None,
        )
        wal.on_rotate = self.checkpointer.poke
        self.checkpointer.start()

    def _lease_lost(self) -> None:
        """The journal's lease was taken over (heartbeat thread): step down, write nothing more.

        The log is fenced already (its next commit fails); stopping makes an
        idle engine step down too, instead of holding runs it no longer owns.
        """
        log.error("engine.lease_lost", note="another engine took the journal stream over")
        self._fenced = True
        self.request_stop()

    def request_stop(self) -> None:
        """Stop the loop at its next pass (any thread, signal handlers included)."""
        if self._stopping:
            return
        self._stopping = True
        self._phase = "stopping"
        if self.claimer is not None:
            self.claimer.pause()  # claims nothing more; what it holds is finished
        self.inbox.call(self.runtime.sched.stop)

    def _announce(self, ready: Callable[[], None]) -> None:
        """Call ``ready`` once the projector reported, the loop ended, or at the bound."""
        deadline = time.monotonic() + ANNOUNCE_WAIT_S
        while not self.projector.wait_reported(0.02):
            if self._leaving.is_set() or time.monotonic() > deadline:
                break
        ready()

    @property
    def ready(self) -> bool:
        """True once recovery is over and the projector has reported the store's watermark.

        A reader's ``min_seq`` is answered by the projector's reports
        (docs/clock.md): until its process is up, none would be.
        """
        return self._phase == "ready" and self.projector.reported

    # -- scheduler thread --------------------------------------------------------------

    @property
    def durable_seq(self) -> int:
        """The last seq the WAL made durable (as of the last group commit)."""
        return self.durable.seq

    def _on_commit(self, first_seq: int, last: int, sync_s: float) -> None:
        self.metrics.committed(last - first_seq + 1, sync_s)
        self.projector.committed(last)
        self.durable.committed(last)

    def _still_replaying(self) -> set[str]:
        runs = self.runtime.journal.runs  # a finished run may be forgotten already
        return {
            r
            for r in self._replaying
            if (run := runs.get(r)) is not None and run.replay is not None
        }

    def _watch_replay(self) -> None:
        # Runs on the loop after each pass while runs replay; cheap set checks.
        self._replaying = self._still_replaying()
        if self._replaying:
            self.runtime.sched.add_injector(self._replay_probe)
        else:
            self._phase = "ready"
            log.info("engine.ready", after="recovery")

    def _replay_probe(self) -> None:
        self._replaying = self._still_replaying()
        if not self._replaying:
            self.runtime.sched.remove_injector(self._replay_probe)
            if self._phase == "replaying":
                self._phase = "ready"
                log.info("engine.ready", after="recovery")

    def _start(
        self,
        entry: dict[str, Any],
        name: str,
        key: str | None,
        digest: str,
        run_id: str | None = None,
    ) -> tuple[str, bool, int]:
        if self._stopping:
            raise ControlError(503, "the engine is stopping")
        now = time.time()  # noqa: TID251 - the key window, like RUN_START's own time
        if key is not None:
            known = self.runs.key(key, now)
            if known is not None:
                if known.digest != digest:
                    raise ControlError(
                        409,
                        f"Idempotency-Key {key!r} was used for a different submission "
                        f"(run {known.run_id})",
                        {"run_id": known.run_id},
                    )
                return known.run_id, False, known.seq
        if run_id is not None and self.runs.status(run_id) is not None:
            raise ControlError(409, f"run {run_id} exists already", {"run_id": run_id})
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

    def _on_end(self, state: Any) -> None:
        self.runs.ended(state.run_id, state.status)
        self._ended_since_checkpoint += 1
        if self._ended_since_checkpoint >= CHECKPOINT_EVERY_RUNS and self.checkpointer:
            self._ended_since_checkpoint = 0
            self.checkpointer.poke()
        # Later, outside the root's exit hooks: a long-lived engine keeps
        # nothing of a finished run but its status (the WAL and store have it).
        root = state.root
        self.inbox.call(lambda: self._forget_run(state.run_id, root.id if root else None))

    def _forget_run(self, run_id: str, root_tid: int | None) -> None:
        self.runtime.journal.forget_run(run_id)
        if root_tid is not None:
            with contextlib.suppress(LookupError, KernelError):
                self.runtime.sched.forget(root_tid)

    def _cancel(self, run_id: str, reason: str) -> dict[str, Any]:
        run = self.runtime.journal.runs.get(run_id)
        status = run.status if run is not None else self.runs.status(run_id)
        if status is None:
            raise ControlError(404, f"no run {run_id!r}")
        if run is None or status != "running":
            raise ControlError(409, f"run {run_id} already finished ({status})", {"status": status})
        if not self.runtime.journal.request_cancel(run_id, reason):
            raise ControlError(409, f"run {run_id} already finished", {"status": run.status})
        return {"run_id": run_id, "status": "cancelling"}

    def _emit(self, run_id: str, kind: str, data: Any) -> None:
        # Agents' own events (retries, tool output, LLM usage): any thread.
        event = {"step.retry": "retry"}.get(kind, kind)
        fields = dict(data) if isinstance(data, dict) else {"value": data}
        if event not in EVENT_KINDS:
            fields["event"] = kind
            event = "tool.output"
        label = str(fields.get("step", "")) + (f" {kind}" if kind else "")
        self.hub.publish(event, run_id=run_id, label=label.strip(), data=fields)

    # -- control requests (control threads) ---------------------------------------------

    def handle(self, request: dict[str, Any]) -> dict[str, Any] | Future[dict[str, Any]]:
        """Answer one control request (see :mod:`tiffany.control`)."""
        op = request.get("op")
        if op == "status":
            return self._status()
        if op == "submit":
            return self._submit(request)
        if op == "cancel":
            run_id = str(request.get("run_id") or "")
            reason = str(request.get("reason") or "cancelled")
            answer: dict[str, Any] = self._for_run(
                run_id, lambda: self._cancel(run_id, reason), live=bool(request.get("live"))
            )
            return answer
        if op == "signal":
            return self._signal(request)
        if op == "check_plan":  # a schedule's plan, checked when it is added
            plan, inputs = request.get("plan"), request.get("inputs") or {}
            try:
                check_document(plan, loc=["plan"])
                check_document(inputs, loc=["inputs"])
                _, name = self.engine.prepare_plan(plan, inputs, checked=True)  # type: ignore[arg-type]
            except DocumentError as exc:
                raise ControlError(422, exc.message, exc.detail) from None
            except PlanError as exc:
                raise ControlError(422, exc.message, exc.errors) from None
            return {"name": name}
        if op == "wait_projected":
            return self._wait_projected(request)
        if op == "verify":
            return self._verify(str(request.get("run_id") or ""), live=bool(request.get("live")))
        if op == "metrics":
            return {"text": self.metrics.render()}
        if op == "tools":  # GET /api/tools: the API imports no tools, the engine knows its own
            return self.engine.env.registry.describe()
        raise ControlError(400, f"unknown op {op!r}")

    def _signal(self, request: dict[str, Any]) -> dict[str, Any]:
        """Journal a signal for a running run; answer once its record is durable.

        Request: ``run_id``, ``name``, ``payload`` (any JSON), ``signal_id``
        (optional: a signal sent again with the same id is journaled once;
        the API sends one per request, so a request retried after an engine
        died is not delivered twice). Answer: ``{"run_id", "name", "seq",
        "signal_id"}``, ``seq`` the WAL seq of the signal's record.
        """
        run_id = str(request.get("run_id") or "")
        name, payload = request.get("name"), request.get("payload")
        given = request.get("signal_id")  # the caller's id: it may send the signal again
        signal_id = given or uuid.uuid4().hex
        if not isinstance(name, str) or not _SIGNAL_NAME.match(name):
            msg = f"must match {SIGNAL_NAME_PATTERN}"
            raise ControlError(422, f"signal name {msg}", [{"loc": "name", "msg": msg}])
        if not isinstance(signal_id, str) or not 0 < len(signal_id) <= 255:
            msg = "must be 1 to 255 characters"
            raise ControlError(422, f"signal_id {msg}", [{"loc": "signal_id", "msg": msg}])
        try:  # the engine trusts no caller: `tiffany signal` bypasses the API's checks
            check_document(payload, loc=["payload"])
        except DocumentError as exc:
            raise ControlError(422, exc.message, exc.detail) from None
        deadline = time.monotonic() + SUBMIT_TIMEOUT_S
        journaled: Future[int] = Future()

        def done(seq: int, ended: str | None) -> None:  # on the loop
            if ended is not None:
                journaled.set_exception(
                    ControlError(409, f"run {run_id} already finished ({ended})", {"status": ended})
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
            run = self.runtime.journal.runs.get(run_id)
            status = run.status if run is not None else self.runs.status(run_id)
            if status is None:
                raise ControlError(404, f"no run {run_id!r}")
            if not self.runtime.journal.request_signal(run_id, name, payload, signal_id, done):
                raise ControlError(
                    409, f"run {run_id} already finished ({status})", {"status": status}
                )

        try:
            self._for_run(run_id, queue, live=bool(request.get("live")))
            try:
                seq = journaled.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                raise ControlError(503, _BUSY) from None
        except ControlError as exc:
            # Sent again (a client retried after a lost answer) once the run had
            # finished, perhaps because of it: the first delivery's answer.
            sent = self._signal_sent(run_id, given) if exc.status == 409 and given else None
            if sent is None or sent[1] != name:  # not that signal: the run had finished
                raise
            seq = sent[0]
        self._wait_durable(seq, deadline)
        return {"run_id": run_id, "name": name, "seq": seq, "signal_id": signal_id}

    def _for_run(self, run_id: str, fn: Callable[[], Any], *, live: bool) -> Any:
        """Run a run's command on the loop; a run the engine no longer holds: 409 from the store.

        ``live``: the API asks every engine; only the one holding the run
        answers, the others 404 (the store is not asked).
        """
        try:
            return self._on_loop(fn)
        except ControlError as exc:
            stored = self._stored_status(run_id) if exc.status == 404 and not live else None
            if stored is None:
                raise
            raise ControlError(
                409, f"run {run_id} already finished ({stored})", {"status": stored}
            ) from None

    def _signal_sent(self, run_id: str, signal_id: str) -> tuple[int, str] | None:
        """A finished run's signal ``signal_id``: ``(seq, name)`` from the store, or None.

        Control threads only (SQL). The store is first let catch up with what
        is durable now (the run's end, and so the signal before it), for
        :data:`SIGNAL_LOOKUP_WAIT_S` at most.
        """
        from tiffany.store import session_factory
        from tiffany.store.journal import signal_record

        self.projector.when_projected(self.durable_seq, SIGNAL_LOOKUP_WAIT_S).result()
        with session_factory(self._store_engine())() as session:
            return signal_record(session, run_id, signal_id)

    def _wait_projected(self, request: dict[str, Any]) -> Future[dict[str, Any]]:
        """Answer once the store holds ``seq`` (or after ``wait_s``); holds no thread."""
        seq, wait_s = request.get("seq"), request.get("wait_s", MAX_WAIT_PROJECTED_S)
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            msg = "must be an integer >= 0"
            raise ControlError(422, f"seq {msg}", [{"loc": "seq", "msg": msg}])
        if not isinstance(wait_s, int | float) or isinstance(wait_s, bool) or wait_s < 0:
            msg = "must be a number >= 0"
            raise ControlError(422, f"wait_s {msg}", [{"loc": "wait_s", "msg": msg}])
        max_seq = request.get("max_seq")
        written = self.runtime.wal.next_seq - 1
        if isinstance(max_seq, int) and max_seq > written:
            # A read asks for a seq never written: answer now, the API refuses it (422).
            done: Future[dict[str, Any]] = Future()
            last = self.projector.last_seq
            done.set_result({"last_seq": last, "reached": last >= seq, "written_seq": written})
            return done
        return self.projector.when_projected(seq, min(float(wait_s), MAX_WAIT_PROJECTED_S))

    def _quarantined(self, seqs: list[int], total: int) -> None:
        """The projector quarantined records (docs/store.md): an activity event."""
        label = f"{len(seqs)} record(s) quarantined, {total} dead letters"
        self.hub.publish("store.quarantined", label=label, data={"seqs": seqs, "total": total})

    def _status(self) -> dict[str, Any]:
        return {
            "engine": self.settings.engine,
            "ready": self.ready,
            "phase": self._phase,
            "recovering": len(self._replaying),
            "pid": os.getpid(),
            "started_at": self.started_at,
            "runs_active": len(self.runs.running),
            # Concurrency limits: per key, runs holding a slot and runs queued.
            "concurrency": self.engine.slots.status(),
            # Which runs (``tiffany status`` lists them engine by engine), the first few.
            "running": sorted(self.runs.running)[:MAX_RUNNING_LISTED],
            "durable_seq": self.durable_seq,
            **self.engine.waiting(),  # steps held back: their tool is disabled here
            # Runs whose state the journal holds in memory (running ones, and
            # finished ones until they are forgotten, right after their end).
            "runs_held": len(self.runtime.journal.runs),
            "tasks_held": self.runtime.sched.records,
            "projector": self.projector.health(),
            "shell_sandbox": _sandbox_status(self.settings.shell_sandbox),
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
            "fenced": self._fenced or wal.failed,
        }

    def _on_loop(self, fn: Callable[[], Any], timeout: float = SUBMIT_TIMEOUT_S) -> Any:
        if self._phase == "stopping":
            raise ControlError(503, "the engine is stopping")
        fut = self.inbox.call(fn)
        try:
            return fut.result(timeout)
        except FutureTimeout:
            fut.cancel()
            raise ControlError(503, _BUSY) from None

    def _submit(self, request: dict[str, Any]) -> Future[dict[str, Any]]:
        """Start a run; a future of ``{"run_id", "created", "seq"}`` once it is durable.

        Holds no thread while it waits (``engine/timeouts.py``): after
        ``SUBMIT_TIMEOUT_S`` the future fails with 503, busy if the loop
        never took the submission, not durable if it did.
        """
        plan = request.get("plan")
        inputs = request.get("inputs") or {}
        rerun: dict[str, Any] | None = None
        if request.get("rerun_of") is not None:
            plan, inputs, rerun = self._rerun_of(request, inputs)
        key = request.get("key")
        if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 255):
            raise ControlError(
                422,
                "invalid Idempotency-Key",
                [{"loc": "Idempotency-Key", "msg": "must be 1 to 255 characters"}],
            )
        try:  # the engine trusts no caller: `tiffany submit` bypasses the API's checks
            if rerun is None:  # a re-run's plan is the store's, checked when first submitted
                check_document(plan, loc=["plan"])
            check_document(inputs, loc=["inputs"])
        except DocumentError as exc:
            raise ControlError(422, exc.message, exc.detail) from None
        try:  # checked just above (or, for a re-run, when it was first submitted)
            entry, name = self.engine.prepare_plan(plan, inputs, checked=True)  # type: ignore[arg-type]
        except PlanError as exc:
            raise ControlError(422, exc.message, exc.errors) from None
        schedule = request.get("schedule")
        if isinstance(schedule, dict):  # a schedule's tick (engine/schedules.py)
            entry["schedule"] = {"id": str(schedule.get("id")), "tick": str(schedule.get("tick"))}
        if rerun is not None:  # the earlier run and the restart point name the plan and reuse
            entry["rerun_of"], entry["reuse"] = rerun["rerun_of"], rerun["reuse"]
        digest = ""  # only a key is tied to a body (a sorted JSON dump and a hash a run)
        if key is not None:
            digest = submission_digest(plan if rerun is None else rerun["rerun_of"], inputs)
            entry["idempotency"] = {"key": key, "digest": digest}
        given = request.get("run_id")  # through the database: the API named the run
        answer: Future[dict[str, Any]] = Future()  # the inbox runs it, the commit resolves it
        reply: Future[dict[str, Any]] = Future()  # the caller's: the answer, or the timeout

        def start() -> None:  # on the loop; the answer is resolved when its seq is durable
            run_id, created, seq = self._start(
                entry, name, key, digest, given if isinstance(given, str) else None
            )
            self.durable.when(seq, answer, {"run_id": run_id, "created": created, "seq": seq})

        def relay(done: Future[dict[str, Any]]) -> None:
            if not done.cancelled():
                exc = done.exception()
                settle(reply, None if exc is not None else done.result(), exc)

        def expire() -> None:
            if not reply.done():
                never_taken = answer.cancel()  # the inbox skips it; False once it ran
                settle(reply, exc=ControlError(503, _BUSY if never_taken else _NOT_DURABLE))

        if self._phase == "stopping":
            raise ControlError(503, "the engine is stopping")
        answer.add_done_callback(relay)
        token = self.timeouts.start(expire)
        reply.add_done_callback(lambda _: self.timeouts.cancel(token))
        self.inbox.call_later(start, answer)
        return reply

    def _rerun_of(
        self, request: dict[str, Any], inputs: Any
    ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """A re-run's plan, inputs and reuse (``tiffany/agents/rerun.py``), from the store.

        Control threads only (SQL). The earlier run must be finished and in
        the store; ``inputs`` given here override its inputs.
        """
        from tiffany.agents.rerun import rerun_reuse
        from tiffany.store import queries, session_factory

        source_id, from_step = request.get("rerun_of"), request.get("from_step")
        if not isinstance(source_id, str) or not source_id:
            raise ControlError(422, "rerun_of must be a run id", [{"loc": "rerun_of"}])
        if from_step is not None and not isinstance(from_step, str):
            raise ControlError(422, "from_step must be a step id", [{"loc": "from_step"}])
        if not isinstance(inputs, dict):
            raise ControlError(422, "inputs must be an object", [{"loc": "inputs"}])
        # The store is let catch up with what the journal has written first: a
        # run whose end was just on the feed (`tiffany tail`, the dashboard) is
        # finished there too, not a 404 or "not finished" for a few ms.
        written = self.runtime.wal.next_seq - 1
        caught = self.projector.when_projected(written, RERUN_SOURCE_WAIT_S).result()
        if not caught["reached"]:
            raise ControlError(
                503,
                f"the store is at seq {caught['last_seq']} and did not reach seq {written} "
                f"within {RERUN_SOURCE_WAIT_S:g} s; retry",
                {"min_seq": written, "store_seq": caught["last_seq"]},
            )
        with session_factory(self._store_engine())() as session:
            source = queries.rerun_source(session, source_id)
        if source is None:
            raise ControlError(404, f"no run {source_id!r}")
        status, entry = source["status"], source["entry"]
        if status in ("pending", "running"):
            raise ControlError(
                409,
                f"run {source_id} has not finished ({status}); re-run a finished run",
                {"status": status},
            )
        if not isinstance(entry, dict) or entry.get("kind") != "plan":
            raise ControlError(422, f"run {source_id} is not a plan run", [{"loc": "rerun_of"}])
        try:
            reuse, restart = rerun_reuse(
                entry.get("plan") or {}, source["steps"], from_step, source_id
            )
        except PlanError as exc:
            raise ControlError(422, exc.message, exc.errors) from None
        merged = {**(entry.get("inputs") or {}), **inputs}
        return (
            entry.get("plan"),
            merged,
            {
                "rerun_of": {"run_id": source_id, "restart": restart},
                "reuse": reuse,
            },
        )

    def _store_engine(self) -> Any:
        """The store's SQLAlchemy engine, made on first use (control threads only)."""
        from tiffany.store import make_engine

        with self._store_lock:
            if self._store is None:
                self._store = make_engine(self.settings.database_url)
            return self._store

    def _wait_durable(self, seq: int, deadline: float) -> None:
        """Until the WAL is durable past ``seq`` (control threads; 503 at ``deadline``)."""
        if self.durable_seq >= seq:
            return
        durable: Future[None] = Future()
        self.durable.when(seq, durable)
        try:
            durable.result(max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            durable.cancel()
            raise ControlError(503, _NOT_DURABLE) from None

    def _stored_status(self, run_id: str) -> str | None:
        """The store's status of a run the engine no longer holds (control threads only).

        The engine keeps the newest finished runs (``run_table.py``); the
        store is the source of truth for older ones. Never on the loop: SQL.
        """
        from tiffany.store import queries, session_factory

        with session_factory(self._store_engine())() as session:
            run = queries.get_run(session, run_id)
            return None if run is None else str(run.status)

    def _verify(self, run_id: str, *, live: bool = False) -> dict[str, Any]:
        if not run_id:
            raise ControlError(422, "run_id is required", [{"loc": "run_id", "msg": "required"}])
        status = self.runs.status(run_id) or (None if live else self._stored_status(run_id))
        if status is None:
            raise ControlError(404, f"no run {run_id!r}")
        if status == "running":
            raise ControlError(409, f"run {run_id} has not finished; only finished runs verify")
        report = self.verifier.verify(run_id)
        # "ok" is the envelope's: the report's verdict travels as "identical".
        report["identical"] = bool(report.pop("ok", False))
        return report

    def _pulled_metrics(self) -> dict[str, float]:
        """The values ``/metrics`` reads at scrape time (a control thread)."""
        return {
            "dispatches": self.activity.dispatched,
            "runs_active": len(self.runs.running),
            "max_dispatch_s": self.engine.watchdog.longest_s,
            "feed_published": self.hub.published,
            "feed_dropped": self.hub.dropped_subscribers,
            "subscribers": self.hub.subscribers,
            **project_health(self.projector.health()),
        }
