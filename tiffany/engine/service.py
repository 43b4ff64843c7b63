"""The engine process's lifecycle: build, sockets, recovery, the loop, retention, shutdown.

``tiffany serve`` runs this in a process of its own (``tiffany engine``);
the API side-process talks to it over two Unix sockets in the data dir::

    control.sock   commands (tiffany.wire.control: status, submit, cancel, signal, verify, metrics)
    feed.sock      the PAL feed (tiffany.feed.transport)

This module builds the engine's parts, wires them together and runs them
from start to stop. The answers to the commands are ``requests.py``'s
(:class:`~tiffany.engine.requests.ControlRequests`): it is given the parts
it uses and reads this module's state (the phase, the runs still
replaying, the lease) through a few callables
(:class:`~tiffany.engine.requests.Lifecycle`), never the service itself.

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

Shutdown (SIGINT/SIGTERM, or :meth:`EngineService.request_stop`): no
effect starts from the signal on (``Scheduler.stop``: steps queued for the
thread pool and not begun stay unstarted; the ones in flight finish), the
control server stops taking requests, the loop stops at the next pass
(nothing is killed, so unfinished runs stay unfinished in the WAL and are
resumed by the next start, where each step that had not begun runs, marked
as a re-run), the steps the workers had begun are waited for up to
:data:`DRAIN_S` and their ends journaled (``Scheduler.drain``: the next
start does not run them again), the journal commits, the projector applies
what is left, and the process exits 0. A fail-stop (the WAL cannot write) and a
fence (the stream's lease was taken over) stop the scheduler the same way,
from the log itself (``on_failed``), before anything else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import structlog

from tiffany.agents.tools.llm import provider_status
from tiffany.config import Settings, scrub_secrets
from tiffany.durable.history import checkpoint_of
from tiffany.durable.retention import CHECKPOINT_EVERY_RUNS, Checkpointer, Retain, StreamLog
from tiffany.engine import Engine, build, journal_log, take_slot
from tiffany.engine.control_server import ControlServer
from tiffany.engine.inbox import DurableWaits, Inbox
from tiffany.engine.requests import NOT_DURABLE, SUBMIT_TIMEOUT_S, ControlRequests, Lifecycle, quick
from tiffany.engine.run_table import RunTable
from tiffany.engine.timeouts import Timeouts
from tiffany.engine.verifier import Verifier
from tiffany.errors import EngineNotReady, KernelError, NondeterminismError
from tiffany.feed import EVENT_KINDS, FEED_SEQ_FILE, Hub
from tiffany.feed.activity import ActivityLog
from tiffany.feed.transport import FEED_SOCKET, FeedServer
from tiffany.kernel import ReadWait
from tiffany.observe.metrics import EngineMetrics, project_health
from tiffany.ports.journals import journals_for
from tiffany.projector.link import ProjectorLink
from tiffany.schedules.runner import ScheduleRunner
from tiffany.wal import Wal
from tiffany.wire.control import CONTROL_SOCKET, Submit, answer_fields
from tiffany.wire.shards import note_owner, seq_base

if TYPE_CHECKING:
    from tiffany.engine.db_requests import RequestClaimer
    from tiffany.feed.pg import NotifyFeed

__all__ = ["FEED_SOCKET", "EngineService", "Inbox"]

log = structlog.get_logger(__name__)

#: Exit code of an engine that stopped because a run's replay diverged
#: (that run is marked failed; a restart resumes the others).
EXIT_RUN_DIVERGED: Final = 3
#: Exit code of an engine that refused a damaged WAL: restarting it cannot
#: help (``tiffany serve`` stops instead); a person runs ``tiffany wal repair``.
#: The CLI's table's ``WAL_DAMAGED`` (tiffany/cli/exits.py), which serve reads
#: without importing the engine (which delayed its first child's start:
#: bench/README.md, "Figures behind design choices in the code").
EXIT_WAL_DAMAGED: Final = 4
#: How long the stop waits on the projector after the WAL failed (disk full or
#: broken: the projector may hang on the same disk; it is killed after this).
WAL_FAILED_STOP_S: Final = 0.3
#: On a stop, how long the engine waits for the steps its workers had begun,
#: to journal their ends (``Scheduler.drain``), in seconds. Below ``serve``'s
#: 20 s before a SIGKILL, leaving time for the commit, the projector and the
#: checkpoint. A step still running then runs again on the next start.
DRAIN_S: Final = 10.0
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


#: The signals that stop the engine (their numbers arrive on the wakeup pipe).
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


def _drain(fd: int, on_stop: Callable[[], None]) -> Generator[Any, Any, None]:
    """Empty the signal wakeup pipe whenever it is readable (a kernel task).

    A stopping signal's number calls ``on_stop`` here, on whichever thread
    runs the loop: the Python handler runs only on the main thread, which
    may be in a step's function (a helped step, ``kernel/sysmon.py``) and,
    inside a C call that does not look at signals, not run it before that
    call returns. Both call the same idempotent stop.
    """
    stops = {int(sig) for sig in STOP_SIGNALS}
    while True:
        yield ReadWait(fd)
        got = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(fd, 512):
                got += chunk
        if stops.intersection(got):
            on_stop()


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
        if journals_for(settings).leased:
            from tiffany.wal.pg import new_owner

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
        #: This engine's journal and its peers' (a slot taken above included).
        self.journals = journals_for(settings)
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
        self.hub.follow_wal(self.runtime.wal)  # feed seqs follow the WAL (tiffany/feed/hub.py)
        self.runtime.journal.on_hold = self.activity.step_held
        self.inbox = Inbox()
        #: Submissions' timeouts (a submission holds no control thread while it waits).
        self.timeouts = Timeouts(SUBMIT_TIMEOUT_S)
        #: The feed through the database the journal is in: API replicas on any host.
        self.pg_feed: NotifyFeed | None = None
        if self.journals.in_database:
            from tiffany.feed.pg import NotifyFeed

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
        self.feed = FeedServer(self.hub, self.data_dir / FEED_SOCKET)
        self.verifier = Verifier(settings)
        #: Running runs, the newest finished ones, idempotency keys in their window.
        self.runs = RunTable(window_s=settings.idempotency_window_s)
        self.engine.known_run = lambda run_id: self.runs.status(run_id) is not None
        self.engine.child_started = self.runs.started
        self.engine.child_ended = self._on_end
        self.started_at = time.time()  # noqa: TID251 - wall clock for status, not task code
        self._phase = "starting"  # starting -> scanning -> replaying -> ready -> stopping
        self._replaying: set[str] = set()
        self._stopping = False
        #: The answers to requests (engine/requests.py): given its parts, not this service.
        self.requests = ControlRequests(
            settings,
            self.engine,
            hub=self.hub,
            inbox=self.inbox,
            durable=self.durable,
            timeouts=self.timeouts,
            runs=self.runs,
            projector=self.projector,
            verifier=self.verifier,
            metrics=self.metrics,
            on_end=self._on_end,
            lifecycle=Lifecycle(
                phase=lambda: self._phase,
                stopping=lambda: self._stopping,
                ready=lambda: self.ready,
                recovering=lambda: len(self._replaying),
                fenced=lambda: self._fenced,
                started_at=self.started_at,
            ),
        )
        self.control = ControlServer(self.data_dir / CONTROL_SOCKET, self.requests.handle, quick)
        self.checkpointer: Checkpointer | None = None
        #: Engine 0's schedule ticks (engine/schedules.py).
        self.schedules: ScheduleRunner | None = None
        #: Requests through the database (journal=postgres): engine/db_requests.py.
        self.claimer: RequestClaimer | None = None
        self._ended_since_checkpoint = 0
        self._leaving = threading.Event()  # the loop has ended
        self._loop_error: BaseException | None = None
        self._announcer: threading.Thread | None = None  # calls serve's ``ready``
        self._wal_failed = False  # the WAL had failed when the runtime closed

    # -- lifecycle (main thread) -----------------------------------------------------

    def serve(
        self, *, install_signals: bool = True, ready: Callable[[], None] | None = None
    ) -> int:
        """Start everything, recover, run the loop until stopped; return an exit code.

        The process's parts start through one :class:`contextlib.ExitStack`:
        each registers its stop as it starts, so every way out (the loop's
        end, an error, a part that failed to start) stops what started, in
        reverse, each stop run even if one before it raised.

        Discussion: a stop is registered where the stopping order needs it,
        which is not always where its part starts. The control server stops
        first of all (no new request), yet the request claimer, started
        after it, stops after the inbox (what it holds is answered); the
        runtime closes (the WAL's last commit) before the projector is told
        the last durable seq, and the checkpointer's last checkpoint comes
        after the projector's last report. Those stops are registered early
        and do nothing for a part that never started.
        """
        with contextlib.ExitStack() as parts:
            parts.callback(lambda: log.info("engine.stopped", durable_seq=self.durable_seq))
            wakeup = self._install_signals(parts) if install_signals else None
            _migrate(self.settings.database_url)  # the API reads the store as soon as we are up
            parts.callback(self.requests.close)
            self.hub.start()
            parts.callback(self.hub.stop)
            self.feed.start()
            parts.callback(self.feed.stop)
            if self.pg_feed is not None:
                self.pg_feed.start()
                parts.callback(self.pg_feed.stop)
            parts.callback(self._stop_checkpointer)
            self.projector.start()
            parts.callback(self._stop_projector)
            parts.callback(self.durable.fail, EngineNotReady("the engine is stopping"))
            if self._owner_note is not None:  # its lease is given back
                parts.callback(self._owner_note.unlink, missing_ok=True)
            parts.callback(self._close_runtime)
            parts.callback(self._stop_claimer)
            parts.callback(self.timeouts.close)
            parts.callback(self.inbox.close)
            parts.callback(self._fail_not_durable)
            parts.callback(self.verifier.close)
            self.control.start()
            parts.callback(self.control.stop)
            parts.callback(self._stop_schedules)
            parts.callback(self._leave)
            return self._run(wakeup, ready)

    def _install_signals(self, parts: contextlib.ExitStack) -> int:
        """SIGINT and SIGTERM stop the engine; return the wakeup pipe's read end.

        A signal may land on any thread; the Python handler only runs once
        the main thread runs bytecode. The wakeup fd makes the loop's epoll
        return (a kernel task drains it), so it does.
        """
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: self.request_stop())
        wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        parts.callback(os.close, wakeup[0])
        parts.callback(os.close, wakeup[1])
        signal.set_wakeup_fd(wakeup[1], warn_on_full_buffer=False)
        parts.callback(signal.set_wakeup_fd, -1)
        return wakeup[0]

    def _run(self, wakeup: int | None, ready: Callable[[], None] | None) -> int:
        """Recover, start what needs recovery's results, run the loop; return the exit code."""
        try:
            self._phase = "scanning"
            resumed = self.engine.recover_runs(self._on_end)
            self._start_requests()  # before the index is dropped: it settles from it
            self._start_retention()
            if self.settings.engine == 0:  # engine 0 fires the schedules' ticks
                self.schedules = ScheduleRunner(
                    self.settings.database_url,
                    lambda request: answer_fields(self.requests.submit(Submit(**request)).result()),
                )
                self.schedules.start()
            self._replaying = set(resumed)
            self._phase = "replaying" if resumed else "ready"
            self._log_started(len(resumed))
            self.runtime.sched.spawn(self.inbox.task(), name="engine-inbox")
            if wakeup is not None:
                self.runtime.sched.spawn(
                    _drain(wakeup, self.request_stop), name="engine-signals", daemon=True
                )
            if resumed:
                self.inbox.call(self._watch_replay)
            if ready is not None:
                # Off the loop: once the projector has reported, reads with
                # ``min_seq`` are answered and /readyz says ready (serve's API
                # listens once this is called: its first client sees no 503).
                self._announcer = threading.Thread(
                    target=self._announce, args=(ready,), name="tiffany-ready", daemon=True
                )
                self._announcer.start()
            self.runtime.run()
            # Since the stop (the signal, the lost lease), nothing has started.
            log.info("engine.stopping", fenced=self._fenced, halted=self.runtime.sched.halted)
            if not self._fenced and not self.runtime.wal.failed:
                self._drain()
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

    def _log_started(self, resumed: int) -> None:
        log.info(
            "engine.started",
            data_dir=str(self.data_dir),
            resumed=resumed,
            control=str(self.control.path),
            feed=str(self.feed.path),
        )
        if self.settings.shell_sandbox == "none":
            log.warning(
                "engine.shell_unsandboxed",
                message="TIFFANY_SHELL_SANDBOX=none: shell steps run UNSANDBOXED",
            )
        llm = provider_status(self.engine.env.settings)
        enabled = self.engine.env.registry.enabled
        if llm["provider"] is None and {"llm", "agent"} & enabled:
            log.warning("engine.llm_not_configured", message=llm["note"])

    def _drain(self) -> None:
        """Journal the ends of the steps a worker had begun at the stop (up to ``DRAIN_S``).

        A fenced engine or a failed log writes nothing more: there the steps
        in flight run again on the next start, marked as re-runs.
        """
        started = time.monotonic()
        left = self.runtime.sched.drain(DRAIN_S)
        log.info(
            "engine.drained",
            steps_still_running=left,
            waited_s=round(time.monotonic() - started, 3),
            note="their ends are journaled: the next start does not run them again"
            if not left
            else f"{left} step(s) still running after {DRAIN_S:g} s run again on the next start",
        )

    # -- the stops, in the order the ExitStack runs them (serve) ----------------------

    def _leave(self) -> None:
        self._leaving.set()  # an engine that exits at once (a diverged run) says so too
        if self._announcer is not None:
            self._announcer.join()
        self._phase = "stopping"

    def _stop_schedules(self) -> None:
        if self.schedules is not None:
            self.schedules.stop()

    def _fail_not_durable(self) -> None:
        if self._loop_error is not None:  # nothing more becomes durable
            self.durable.fail(EngineNotReady(NOT_DURABLE))

    def _stop_claimer(self) -> None:
        if self.claimer is not None:
            self.claimer.stop()  # what it holds is answered, or goes back to pending

    def _close_runtime(self) -> None:
        # Fail-stop (docs/wal-format.md): when the WAL failed, the disk may be
        # full or broken, and whatever writes to it (the projector) may hang
        # on it; wait on nothing for long, so that `serve` restarts us soon.
        self._wal_failed = self.runtime.wal.failed
        try:
            self.runtime.close()
        except Exception:
            log.exception("engine.close_failed")

    def _stop_projector(self) -> None:
        self.projector.stop(timeout=WAL_FAILED_STOP_S if self._wal_failed else 15.0)

    def _stop_checkpointer(self) -> None:
        if self.checkpointer is not None and not self._wal_failed:
            self.checkpointer.stop()  # a last checkpoint: the next start reads little

    def _start_requests(self) -> None:
        """On the PostgreSQL journal, take requests from the database too (docs/engines.md)."""
        if not self.journals.in_database:
            return
        from tiffany.engine.db_requests import RequestClaimer
        from tiffany.wal.pg import PgLog

        wal = cast(PgLog, self.runtime.wal)
        self.claimer = RequestClaimer(
            self.settings.database_url,
            self.settings.engine,
            lambda: (wal.stream, wal.epoch),
            self.requests.handle,
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
        self.runtime.sched.stop()  # before anything else: no effect starts from here on
        self._fenced = True
        log.error("engine.lease_lost", note="another engine took the journal stream over")
        self.request_stop()

    def request_stop(self) -> None:
        """Start no effect from now on; stop the loop at its next pass (any thread, signals too).

        The scheduler is stopped here, not from the loop: thread jobs not yet
        started stay so from this call on (``Scheduler.stop``); the inbox
        only wakes the loop, which returns before its next pass.
        """
        self.runtime.sched.stop()
        if self._stopping:
            return
        self._stopping = True
        self._phase = "stopping"
        if self.claimer is not None:
            self.claimer.pause()  # claims nothing more; what it holds is finished
        # Wakes the loop, which returns before its next pass. Nothing is
        # logged here: a signal handler that writes to stderr while the main
        # thread is in a write of its own raises there.
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

    # -- other threads (the engine's parts' callbacks) -----------------------------------

    def _emit(self, run_id: str, kind: str, data: Any) -> None:
        # Agents' own events (retries, tool output, LLM usage): any thread.
        event = {"step.retry": "retry"}.get(kind, kind)
        fields = dict(data) if isinstance(data, dict) else {"value": data}
        if event not in EVENT_KINDS:
            fields["event"] = kind
            event = "tool.output"
        label = str(fields.get("step", "")) + (f" {kind}" if kind else "")
        self.hub.publish(event, run_id=run_id, label=label.strip(), data=fields)

    def _quarantined(self, seqs: list[int], total: int) -> None:
        """The projector quarantined records (docs/store.md): an activity event."""
        label = f"{len(seqs)} record(s) quarantined, {total} dead letters"
        self.hub.publish("store.quarantined", label=label, data={"seqs": seqs, "total": total})

    def _pulled_metrics(self) -> dict[str, float]:
        """The values ``/metrics`` reads at scrape time (a control thread)."""
        return {
            "dispatches": self.activity.dispatched,
            "steps_handed_over": self.runtime.sched.handed_over,
            "runs_active": len(self.runs.running),
            "max_dispatch_s": self.engine.watchdog.longest_s,
            "feed_published": self.hub.published,
            "feed_dropped": self.hub.dropped_subscribers,
            "subscribers": self.hub.subscribers,
            **project_health(self.projector.health()),
        }
