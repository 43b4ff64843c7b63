"""The journal: the kernel instrument that makes runs durable and replayable.

A *run* is a root task and its descendants. The journal follows every
dispatch of every run's tasks and appends it to the WAL; for a run being
replayed it does the opposite: it checks each dispatch against the WAL and
feeds the recorded outcomes back.

What is recorded (see ``tiffany/wire/records.py`` for the layout):

* every dispatch: which task (by its run-local id), what it yielded (the
  call's kind and a small deterministic argument);
* every value from outside the run, in full: ``Now()``, ``Random()``, step
  and thread results, and every wake-up that entered the ready queue at a
  wait stage (timers, I/O, thread and step completions, cancel requests),
  with the run's dispatch count at that moment;
* spawns, step starts (with the attempt number), task exits, the run's end;
* every signal sent to the run (a WAKE of task 0, cause ``signal``), at the
  wait stage that delivered it: to the task parked on ``Receive`` of its
  name, or into the run's mailbox until one asks (:meth:`JournalInstrument.request_signal`,
  a client's; :meth:`JournalInstrument.request_internal_signal`, the engine's own).

One record per dispatch at most: a dispatch whose own record would follow
at once (a ``NewTask`` and its SPAWN, a ``Now()`` or ``Random()`` and its
OUTCOME, a ``Step`` and its STEP_START, a task's final ``return`` and its
TASK_EXIT) is journaled by that record alone, which *stands for* the
dispatch. The rule a reader applies (``history.py``, the store's projector)
is that dispatch counts only grow: a SPAWN, OUTCOME, STEP_START or
TASK_EXIT whose ``n`` is above the last dispatch seen is the dispatch ``n``
itself, with the call's kind and argument implied by the record
(``tiffany.wire.records.carried``). Older journals read the same way (old
layout: see docs/wal-format.md, compatibility). The run's root keeps
the DISPATCH record of its final ``return``: the run's last dispatch stays
an explicit record (its count is what readers show for the run).

Why that suffices: the kernel is deterministic for a given sequence of
external events, and the only place external events enter the ready queue
is the wait stage. A run's tasks are appended to the FIFO ready queue either
by their own dispatches (reproduced by re-running the code) or at a wait
stage (reproduced by injecting the recorded wake-up when the run's dispatch
count reaches the recorded value). Other runs sharing the scheduler never
touch this run's tasks, so each run replays alone, in the same order.

The journal splits its work along that seam: the recorder
(``recorder.py``) turns a live run's dispatches into records and commits
them (group commit, write-ahead); the replayer (``replayer.py``) checks a
replayed run's dispatches against its records and feeds it the recorded
outcomes. This module is the kernel instrument that routes each hook to
one or the other, the run table, and the handlers of the system calls whose
outcome comes from outside (``Now``, ``Random``, timers, steps, I/O).

Invariants:

* The journal reaches the kernel through its public ports (``find``,
  ``throw``, ``wake_at``, ``hold_effects``...; ``tests/durable/test_ports.py``).
* Fail-stop: the journal is a critical instrument; a WAL error stops the
  kernel. A replay mismatch raises :class:`~tiffany.errors.NondeterminismError`
  the same way.
* Opaque tasks (the body of a generator step) are not journaled dispatch by
  dispatch: only their outcome is, as a wake-up of the caller.
* A step the engine's ``step_gate`` holds back is not started: a HOLD record
  says why, the task stays parked until a later engine starts it
  (``gate.py``).
* The engine's own signals (a name in ``records.RESERVED_SIGNAL_PREFIXES``:
  a sub-plan's end, a concurrency slot) enter only through
  :meth:`JournalInstrument.request_internal_signal`; the clients' path refuses those
  names, and their ids live apart from the clients' (a client's signal id
  cannot make the engine's signal a "repeat" that is never delivered).
* A client's signal costs memory from its request until a task receives
  it: the journal counts, per run and in all, the signals held (queued for
  the next wait stage, or kept in the mailbox) and their bytes
  (:func:`signal_bytes`), for the engine to bound; a run's kept signals are
  let go when it ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from tiffany.durable.dispatch import MAX_ARG_CHARS, is_generator_step
from tiffany.durable.gate import HeldStep, StepGate
from tiffany.durable.history import cursor_of
from tiffany.durable.recorder import GROUP_COMMIT_MAX_S, Recorder
from tiffany.durable.records import pack_error
from tiffany.durable.replayer import RecoveryError, ReplayCursor, Replayer
from tiffany.errors import ReservedSignal, SystemCallMisuse, TiffanyError, UnjournalableValue
from tiffany.kernel import (
    PARKED,
    Instrument,
    NewTask,
    Now,
    Patched,
    Random,
    ReadWait,
    Receive,
    RunInThread,
    Scheduler,
    Sleep,
    Step,
    SystemCall,
    Task,
    TaskState,
    WaitTask,
    WriteWait,
)
from tiffany.wal import Log
from tiffany.wire.records import (
    JOURNAL_COMPAT,
    Dispatch,
    Hold,
    Outcome,
    RunEnd,
    RunStart,
    Spawn,
    StepStart,
    TaskExit,
    TaskLabel,
    Wake,
    as_list,
    reserved_signal,
    root_role,
)
from tiffany.wire.status import RunStatus
from tiffany.wire.values import (
    ENCODE_ERRORS,
    canonical,
    pack_value,
    stand_in,
    text_of,
    unpack_value,
)

__all__ = [
    "GROUP_COMMIT_MAX_S",
    "JournalInstrument",
    "RecoveryError",
    "ReplayCursor",
    "RunState",
    "TaskMeta",
    "signal_bytes",
]

log = structlog.get_logger("tiffany.durable")

#: The label of a task spawned with none (``NewTask`` without ``meta``).
_PLAIN_TASK: Final = TaskLabel()
#: The label of a generator step's body (an opaque task).
_STEP_BODY: Final = TaskLabel("step")

_END_STATUS = {
    TaskState.DONE: RunStatus.SUCCEEDED.value,
    TaskState.CRASHED: RunStatus.FAILED.value,
    TaskState.CANCELLED: RunStatus.CANCELLED.value,
}


@dataclass(eq=False, slots=True)
class RunState:
    """One run as the journal sees it."""

    run_no: int
    run_id: str
    name: str
    prefix: bytes
    n: int = 0
    next_ltid: int = 1
    root: Task | None = None
    tasks: dict[int, Task] = field(default_factory=dict)  # ltid -> task, while alive
    replay: ReplayCursor | None = None
    status: str = "running"
    result: Any = None
    error: BaseException | None = None
    on_end: Callable[[RunState], None] | None = None
    #: The journal-compatibility version the run started under (its RUN_START).
    compat: int = JOURNAL_COMPAT
    #: Signals journaled and not yet received, by name, oldest first:
    #: ``(payload, bytes)``, bytes None for the engine's own (not counted).
    mailbox: dict[str, deque[tuple[Any, int | None]]] = field(default_factory=dict)
    #: Tasks parked on ``Receive``, by channel: ``(task, call)``, oldest first
    #: (an entry whose task no longer waits on that call is stale and skipped).
    receivers: dict[str, list[tuple[Task, Receive]]] = field(default_factory=dict)
    #: The id of each client's signal journaled for the run -> its WAL seq (a
    #: signal sent again with the same id is not journaled twice).
    signal_ids: dict[str, int] = field(default_factory=dict)
    #: Clients' signals the run holds (queued or kept, not yet received), and their bytes.
    signals_held: int = 0
    signal_bytes_held: int = 0


@dataclass(eq=False, slots=True)
class SignalRequest:
    """A signal waiting for the next wait stage to be journaled and delivered.

    ``done(seq, status)``: called on the loop with the WAL seq of its record
    (the earlier one for a repeated id) and None, or with -1 and the run's
    status when the run had ended first.
    """

    run: RunState
    name: str
    payload: Any
    signal_id: str
    done: Callable[[int, str | None], None]
    #: The WAKE's value: ``[name, payload packed, signal_id]`` (known to encode).
    value: Any = None
    #: Its :func:`signal_bytes`; None for the engine's own signal (not a client's).
    size: int | None = None


@dataclass(eq=False, slots=True)
class TaskMeta:
    """The journal's note on a task (kept in ``Task.meta``)."""

    run: RunState
    ltid: int
    opaque: bool = False
    steps: int = 0
    #: What the task is (role, plan step, tool), as its SPAWN record says.
    label: TaskLabel = _PLAIN_TASK


class JournalInstrument(Instrument):
    """Record runs into the WAL, and replay them from it.

    Args:
        wal: The open WAL (the journal appends and commits); None to replay
            without recording.
        sched: The scheduler it is attached to (it installs handlers).
        allow_live: When false (``--verify``), a replay that runs past the
            end of its journal is a divergence instead of going live.
    """

    critical = True

    def __init__(self, wal: Log | None, sched: Scheduler, *, allow_live: bool = True) -> None:
        self.wal = wal
        self.sched = sched
        self.recorder = Recorder(wal, sched, self.ltid_of)
        self.replayer = Replayer(sched, self.ltid_of, self._start_step, allow_live=allow_live)
        self._append = self.recorder.append
        self.runs: dict[str, RunState] = {}
        self._by_no: dict[int, RunState] = {}
        self._next_run_no = 1
        self._starting: RunState | None = None
        self._spawning: Any = None  # the NewTask being dispatched (its label)
        self._opaque_parent: RunState | None = None
        self._cancels: list[tuple[RunState, str]] = []
        self._signals: list[SignalRequest] = []
        #: Clients' signals held, in all runs (read by any thread: the engine's status).
        self.signals_held = 0
        self.signal_bytes_held = 0
        #: Asked before a live step starts: None lets it start, a reason holds it.
        self.step_gate: StepGate | None = None
        #: Called with each step the gate holds back (the engine's activity feed).
        self.on_hold: Callable[[Task, HeldStep], None] | None = None
        #: The steps held back, by task, while their task lives.
        self.held: dict[Task, HeldStep] = {}
        self._live: dict[type, Any] = {}
        for call_type, handler, unpark in (
            (Now, self._h_now, None),
            (Random, self._h_random, None),
            (Sleep, self._h_sleep, None),
            (WaitTask, self._h_wait_task, None),
            (RunInThread, self._h_step, self._unpark_step),
            (Step, self._h_step, self._unpark_step),
            (ReadWait, self._h_io, None),
            (WriteWait, self._h_io, None),
            (Receive, self._h_receive, self._unpark_receive),
        ):
            self._live[call_type] = sched.handler(call_type)
            sched.register(call_type, handler, unpark)
        sched.add_instrument(self)
        sched.add_injector(self._inject)

    # -- runs ------------------------------------------------------------------

    def start_run(
        self,
        run_id: str,
        name: str,
        entry: dict[str, Any],
        coro: Generator[Any, Any, Any],
        *,
        run_no: int | None = None,
        replay: ReplayCursor | None = None,
        on_end: Callable[[RunState], None] | None = None,
        compat: int = JOURNAL_COMPAT,
        fork: Iterable[tuple[int, bytes]] | None = None,
    ) -> RunState:
        """Spawn ``coro`` as the root of run ``run_id`` and journal it.

        With ``replay``, the run's records already exist: nothing is
        appended until the replay reaches their end; ``compat`` is the
        version its RUN_START holds. With ``fork`` (another run's records,
        ``(type, body)``: ``fork.py``), the run's RUN_START is followed by a
        copy of them, which the run replays before it goes live; ``compat``
        is the other run's.

        Raises:
            TiffanyError: ``run_id`` exists.
            UnjournalableValue: ``entry`` (or ``name``) has no journaled form
                (a lone surrogate, an integer past 64 bits, too large);
                nothing was started.
        """
        if run_id in self.runs:
            raise TiffanyError(f"run {run_id} exists", run_id=run_id)
        no = run_no if run_no is not None else self._next_run_no
        run = RunState(no, run_id, name, no.to_bytes(4, "little"), replay=replay, on_end=on_end)
        if replay is None:  # raises UnjournalableValue for an entry with no journaled form
            if fork is not None:
                run.compat = compat
            self.recorder.start(
                run, RunStart(run_id, name, entry, self.sched.clock.time(), run.compat)
            )
            if fork is not None:  # its journal begins with the copy, which it replays first
                replay = run.replay = cursor_of(self.recorder.copy(run, fork))
        self._next_run_no = max(self._next_run_no, no + 1)
        if replay is not None:
            run.compat = compat
            self.replayer.runs.append(run)
        self.runs[run_id] = run
        self._by_no[no] = run
        self._starting = run
        self._spawning = TaskLabel(root_role(entry))
        try:
            self.sched.spawn(coro, name=name)
        finally:
            self._starting = None
            self._spawning = None
        return run

    def reserve_run_no(self, run_no: int) -> None:
        """Make sure new runs get numbers above ``run_no`` (after a WAL scan)."""
        self._next_run_no = max(self._next_run_no, run_no + 1)

    def request_cancel(self, run_id: str, reason: str = "cancelled") -> bool:
        """Cancel a run at the next wait stage; False if it already ended."""
        run = self.runs.get(run_id)
        if run is None or run.status != "running":
            return False
        self._cancels.append((run, reason))
        return True

    def request_signal(
        self,
        run_id: str,
        name: str,
        payload: Any,
        signal_id: str,
        done: Callable[[int, str | None], None],
        size: int | None = None,
    ) -> bool:
        """Journal a client's signal ``name`` for run ``run_id`` at the next wait stage.

        ``done`` is called on the loop once the signal's record is appended
        (see :class:`SignalRequest`); it is durable at that wait stage's
        commit. A run still being replayed gets its signals once it is live.
        ``size``: the payload's :func:`signal_bytes`, if the caller measured
        it already (off the loop). Returns False if the run has ended.

        Raises:
            ReservedSignal: ``name`` is one of the engine's own (``records.reserved_signal``).
            UnjournalableValue: The name, payload or id has no journaled
                form (checked here, where the sender can be told).
        """
        if reserved_signal(name) is not None:
            raise ReservedSignal(f"signal {name!r} is the engine's own", name=name)
        run = self.runs.get(run_id)
        if run is None or run.status != "running":
            return False
        value = self._signal_value(run, name, payload, signal_id)
        size = signal_bytes(payload) if size is None else size
        self._signals.append(SignalRequest(run, name, payload, signal_id, done, value, size))
        self._count(run, 1, size)
        return True

    def _signal_value(self, run: RunState, name: str, payload: Any, signal_id: str) -> Any:
        """The WAKE value ``[name, payload packed, signal_id]`` of a signal, checked to encode.

        Raises:
            UnjournalableValue: The name, payload or id has no journaled form.
        """
        try:
            value = [name, pack_value(payload), signal_id]
        except ENCODE_ERRORS as exc:  # a payload holding itself
            value, (body, why) = None, (None, f"{type(exc).__name__}: {text_of(exc)}")
        else:
            body, why = self.recorder.fits(Wake(run.n, 0, "signal", True, value))
        if body is None:
            raise UnjournalableValue(
                f"signal {text_of(name)} for run {run.run_id} cannot be journaled: {why} (a "
                "payload must be JSON-like, its text valid Unicode, its integers within "
                "64 bits)",
                run_id=run.run_id,
                signal=text_of(name),
                reason=why,
            )
        return value

    def request_internal_signal(self, run_id: str, name: str, payload: Any, signal_id: str) -> bool:
        """Journal one of the engine's own signals for a run (a reserved name); False if it ended.

        As :meth:`request_signal`, but for the engine alone: no client
        request reaches this path, the signal is never taken for a repeat
        of a client's id, and it is not counted against the run's bounds.

        Raises:
            UnjournalableValue: The payload has no journaled form.
        """
        if reserved_signal(name) is None:
            raise TiffanyError(f"signal {name!r} is not in the reserved namespace", name=name)
        run = self.runs.get(run_id)
        if run is None or run.status != "running":
            return False
        value = self._signal_value(run, name, payload, signal_id)
        self._signals.append(SignalRequest(run, name, payload, signal_id, _ignore, value))
        return True

    def signal_seq(self, run_id: str, signal_id: str) -> int | None:
        """The WAL seq of the client's signal ``signal_id`` a running run holds, or None."""
        run = self.runs.get(run_id)
        return None if run is None else run.signal_ids.get(signal_id)

    def awaited_signals(self, run_id: str) -> list[str]:
        """The signal names run ``run_id``'s tasks are parked on now, sorted (on the loop)."""
        run = self.runs.get(run_id)
        if run is None:
            return []
        return sorted(
            name
            for name, waiting in run.receivers.items()
            if any(task.blocked_on is call and not task.finished for task, call in waiting)
        )

    def held_signals(self, run_id: str) -> tuple[int, int]:
        """How many clients' signals run ``run_id`` holds (queued or kept), and their bytes."""
        run = self.runs.get(run_id)
        return (0, 0) if run is None else (run.signals_held, run.signal_bytes_held)

    def fail_run(self, run_id: str, error: BaseException) -> bool:
        """Journal that run ``run_id`` failed with ``error`` and commit; False if it had ended.

        For a run that cannot go on (its replay diverged: the code changed under
        it): its RUN_END keeps recovery away from it. The scheduler must be
        stopped; the run's tasks are not killed, nothing more of it is journaled.
        """
        run = self.runs.get(run_id)
        if run is None or run.status != "running" or self.wal is None or self.wal.failed:
            return False
        run.status, run.error = "failed", error
        run.replay = None
        self._append(run, RunEnd("failed", pack_error(error), self.sched.clock.time()))
        self.commit()
        return True

    def forget_run(self, run_id: str) -> bool:
        """Drop a finished run's state (a long-lived engine); False if unknown or running."""
        run = self.runs.get(run_id)
        if run is None or run.status == "running":
            return False
        del self.runs[run_id]
        if self._by_no.get(run.run_no) is run:
            del self._by_no[run.run_no]
        # The root task's meta names the run, which names the root: a cycle
        # that would leave the run (its result: every step's summary) to the
        # cyclic collector. Broken, reference counting frees it now.
        run.root, run.on_end, run.replay, run.result = None, None, None, None
        run.tasks.clear()
        run.receivers.clear()
        self._let_go(run)
        return True

    def ltid_of(self, tid: int) -> int | None:
        """Return the run-local id of global task ``tid`` (None if unknown)."""
        try:
            meta = self.sched.task(tid).meta
        except LookupError:
            return None
        return meta.ltid if isinstance(meta, TaskMeta) else None

    def commit(self) -> None:
        """Make everything appended so far durable (per the fsync policy)."""
        self.recorder.commit()

    def require_commit(self) -> None:
        """Commit at the next wait stage (before an acknowledgement leaves)."""
        self.recorder.require_commit()

    # -- instrument hooks ----------------------------------------------------

    def task_spawned(self, task: Task) -> None:
        """Give the new task its run and run-local id; journal the spawn."""
        run = self._starting
        parent_ltid = 0
        label = self._spawning
        self._spawning = None
        if label.__class__ is not TaskLabel:  # a NewTask's meta, or nothing
            label = _label_of(label, task)
        if run is None:
            if task.parent is None:
                return
            parent = self.sched.find(task.parent)
            pmeta = parent.meta if parent is not None else None
            if not isinstance(pmeta, TaskMeta):
                return
            run = pmeta.run
            if pmeta.opaque or self._opaque_parent is run:
                task.meta = TaskMeta(run, -1, opaque=True, label=_STEP_BODY)
                return
            parent_ltid = pmeta.ltid
        ltid = run.next_ltid
        run.next_ltid += 1
        task.meta = TaskMeta(run, ltid, label=label)
        run.tasks[ltid] = task
        if run.root is None:
            run.root = task
        if run.replay is None:
            rec = Spawn(run.n, ltid, parent_ltid, task.name, label.role, label.step_id, label.tool)
            self._append(run, rec)

    def after_dispatch(self, task: Task, yielded: Any) -> None:
        """Journal the dispatch, or check it against the journal when replaying.

        Discussion: this runs once per dispatch of every journaled task,
        a million times in ``bench/replay.py``. A bare ``yield`` being
        replayed (most dispatches of a replay) is checked here, without
        the call to :meth:`Replayer.check_dispatch`: when the next recorded
        dispatch is that exact yield, there is nothing else to do. Any
        other dispatch, and any mismatch, takes the general check, which
        raises the divergence.
        """
        meta = task.meta
        if meta is None or meta.opaque:
            return
        run = meta.run
        cur = run.replay
        if cur is not None:
            i = cur.index
            try:
                rec = cur.dispatches[i]
            except IndexError:
                # Before counting this dispatch: steps restarted at go-live are
                # journaled at the last recorded ``n``, so they carry no dispatch.
                self.replayer.go_live(run)
            else:
                n = run.n = run.n + 1
                if yielded is None:
                    if (
                        rec.n == n
                        and rec.ltid == meta.ltid
                        and rec.kind == "yield"
                        and rec.arg is None
                    ):
                        cur.index = i + 1
                        return
                elif yielded.__class__ is NewTask:
                    self._spawning = yielded  # task_spawned, next, takes its label
                elif yielded.__class__ is Patched and not _marks(rec, n, meta.ltid, yielded):
                    # A run recorded before the marker existed: the old code's
                    # path, and no dispatch counted (its journal has none here).
                    run.n = n - 1
                    yielded.applies = False
                    return
                self.replayer.check_dispatch(run, cur, task, yielded)
                return
        run.n += 1
        if yielded.__class__ is NewTask:
            self._spawning = yielded  # task_spawned, next, takes its label
        self.recorder.dispatch(run, meta, task, yielded)

    def task_woken(self, task: Task, value: Any) -> None:
        """Journal a wake-up that came from outside the run (at a wait stage)."""
        meta = task.meta
        if meta is None or meta.opaque:
            return
        if meta.run.replay is not None:
            meta.run.replay.parked.pop(task, None)  # woken by the replayed code itself
            return
        self.recorder.woken(meta, task, value)

    def task_exited(self, task: Task) -> None:
        """Journal the task's end (and the run's, for the root)."""
        self._exit(task)

    def task_crashed(self, task: Task, error: BaseException) -> None:
        """Journal the task's crash (and the run's failure, for the root)."""
        self._exit(task)

    def before_wait(self, timeout: float | None) -> None:
        """The commit point: the recorder's group commit (``Recorder.commit_point``)."""
        self.recorder.commit_point(timeout)

    def after_wait(self, events: int) -> None:
        """Stop treating wake-ups as external (the pass begins)."""
        self.recorder.in_wait = False

    def after_run(self) -> None:
        """Commit whatever is left when the loop stops."""
        self.recorder.in_wait = False
        self.commit()

    # -- internals -------------------------------------------------------------

    def _exit(self, task: Task) -> None:
        meta = task.meta
        if meta is None or meta.opaque:
            return
        run = meta.run
        run.tasks.pop(meta.ltid, None)  # only live tasks are woken, killed or resumed
        if self.held:
            self.held.pop(task, None)
        if task.state is TaskState.DONE:
            try:
                value: Any = pack_value(task.result)
            except ENCODE_ERRORS:  # a result holding itself: kept as its stand-in
                value = stand_in(task.result)
        else:
            value = pack_error(task.error) if task.error is not None else None
        exit_rec = TaskExit(run.n, meta.ltid, task.state._value_, value)  # _value_: no property
        cur = run.replay
        if cur is None or not self.replayer.check_exit(run, cur, task, as_list(exit_rec)):
            if task.state is TaskState.DONE:
                value = self.recorder.append_result(run, exit_rec, task.result)
            else:
                self._append(run, exit_rec)
        if task is run.root:
            self._end_run(run, task, value)

    def _end_run(self, run: RunState, root: Task, value: Any) -> None:
        """Journal the run's end; ``value`` is the root's exit value, already packed.

        (The root's result packed once: for a plan it is the summary of every step.)
        """
        run.status = _END_STATUS[root.state]
        run.result, run.error = root.result, root.error
        self._let_go(run)
        cur = run.replay
        if cur is None or not self.replayer.check_end(run, cur, root, value):
            end = RunEnd(run.status, value, self.sched.clock.time())
            if run.status == "succeeded":
                self.recorder.append_result(run, end, root.result)
            else:
                self._append(run, end)
        if run.on_end is not None:
            run.on_end(run)

    def _inject(self) -> None:
        """Wait-stage injector: the replays' recorded wake-ups, then cancel and signal requests.

        Wake-ups caused *by* what it injects (a cancelled task's joiners...)
        are consequences the replay reproduces, so they are not journaled as
        external: the kernel runs injectors before the commit point, and
        wake-ups count as external only from ``before_wait`` on. The records
        it appends (a cancel, steps restarted at go-live) join that commit,
        before their effects are released.
        """
        # The replays first: a run that goes live here takes the cancels and
        # signals that waited for its replay at this same stage. (After them,
        # they waited for the next wait stage, which a loop with nothing else
        # to do never reached: a signal sent during a recovery was not
        # journaled until something else woke the engine.)
        if self.replayer.runs:
            self.replayer.inject(self._cancel_tasks, self._replay_signal)
        if self._cancels:
            cancels, self._cancels = self._cancels, []
            for run, reason in cancels:
                if run.status != "running":
                    continue
                if run.n == 0 or run.replay is not None:
                    self._cancels.append((run, reason))  # see _journal_signals
                    continue
                self._append(run, Wake(run.n, 0, "cancel", True, reason))
                self._cancel_tasks(run)
        if self._signals:
            self._journal_signals()

    def _journal_signals(self) -> None:
        requests, self._signals = self._signals, []
        for req in requests:
            run = req.run
            if run.status == "running" and (run.replay is not None or run.n == 0):
                # Its record goes after the journal's last, and after the run's
                # first dispatch: a run started in this pass has not run yet,
                # while its replay (started before the loop) runs before the
                # first wait stage, so a record at dispatch 0 would be behind it.
                self._signals.append(req)
                continue
            if req.size is not None:  # a client's: no longer queued (kept, below, or gone)
                self._count(run, -1, -req.size)
            if run.status != "running":
                req.done(-1, run.status)
            elif req.size is not None and req.signal_id in run.signal_ids:
                req.done(run.signal_ids[req.signal_id], None)
            else:
                wal = self.wal
                seq = wal.next_seq if wal is not None else 0
                self._append(run, Wake(run.n, 0, "signal", True, req.value))
                self.recorder.require_commit()
                if req.size is not None:
                    run.signal_ids[req.signal_id] = seq
                self._deliver_signal(run, req.name, req.payload, req.size)
                req.done(seq, None)

    def _replay_signal(self, run: RunState, seq: int, rec: Wake) -> None:
        name, packed, signal_id = rec.value
        payload = unpack_value(packed)
        size = None
        if reserved_signal(name) is None:  # a client's (the engine's ids live apart)
            run.signal_ids[signal_id] = seq
            size = signal_bytes(payload)
        self._deliver_signal(run, name, payload, size)

    def _deliver_signal(self, run: RunState, name: str, payload: Any, size: int | None) -> None:
        """Wake the oldest task parked on ``Receive(name)``, or keep the signal for one.

        ``size``: a client's signal's bytes, counted while it is kept; None
        for the engine's own.
        """
        waiting = run.receivers.get(name)
        while waiting:
            task, call = waiting.pop(0)
            if task.blocked_on is call and not task.finished:
                if not waiting:
                    del run.receivers[name]
                self.sched.disarm(task)
                if run.replay is not None:
                    run.replay.parked.pop(task, None)
                self.sched.wake(task, payload)
                return
        run.receivers.pop(name, None)
        if size is not None:
            self._count(run, 1, size)
        box = run.mailbox.get(name)
        if box is None:
            run.mailbox[name] = deque([(payload, size)])
        else:
            box.append((payload, size))

    def _count(self, run: RunState, n: int, size: int) -> None:
        """Add ``n`` signals of ``size`` bytes in all to what ``run`` (and the journal) holds."""
        run.signals_held += n
        run.signal_bytes_held += size
        self.signals_held += n
        self.signal_bytes_held += size

    def _let_go(self, run: RunState) -> None:
        """A run ended: its kept signals are nobody's any more (its queued ones go at the wait)."""
        kept = [size for box in run.mailbox.values() for _, size in box if size is not None]
        run.mailbox.clear()
        if kept:
            self._count(run, -len(kept), -sum(kept))

    def _cancel_tasks(self, run: RunState) -> None:
        for ltid in sorted(run.tasks):
            task = run.tasks[ltid]
            if not task.finished:
                self.sched.kill(task.id)

    # -- handlers for calls whose outcome comes from outside -------------------

    def _outcome(self, task: Task, call: SystemCall, live: Callable[[], Any]) -> Any:
        meta = task.meta
        if meta is None or meta.opaque:
            return live()
        run = meta.run
        cur = run.replay
        if cur is not None:
            recorded = self.replayer.outcome(run, cur, task, call)
            if recorded is not NotImplemented:
                return recorded
        value = live()
        self._append(run, Outcome(run.n, meta.ltid, call.kind, pack_value(value)))
        return value

    def _h_now(self, sched: Scheduler, task: Task, call: Now) -> Any:
        meta = task.meta
        if meta is not None and not meta.opaque and meta.run.replay is None:
            # The live path of _outcome, inlined: one per plan step and attempt.
            run = meta.run
            value = self._live[Now](sched, task, call)
            self._append(run, Outcome(run.n, meta.ltid, "now", pack_value(value)))
            return value
        return self._outcome(task, call, lambda: self._live[Now](sched, task, call))

    def _h_random(self, sched: Scheduler, task: Task, call: Random) -> Any:
        return self._outcome(task, call, lambda: self._live[Random](sched, task, call))

    def _h_sleep(self, sched: Scheduler, task: Task, call: Sleep) -> Any:
        meta = task.meta
        if meta is None or meta.opaque or call.seconds <= 0:
            return self._live[Sleep](sched, task, call)
        deadline = self._outcome(task, call, lambda: sched.clock.time() + call.seconds)
        if meta.run.replay is not None:
            return self.replayer.park(task, call, deadline, TaskState.BLOCKED_SLEEP)
        return self._live[Sleep](sched, task, call)

    def _h_wait_task(self, sched: Scheduler, task: Task, call: WaitTask) -> Any:
        meta = task.meta
        live = self._live[WaitTask]
        if meta is None or meta.opaque or call.timeout is None or call.timeout <= 0:
            return live(sched, task, call)
        target = sched.find(call.tid)
        if target is None or target.finished or target is task:
            return live(sched, task, call)
        timeout = float(call.timeout)
        deadline = self._outcome(task, call, lambda: sched.clock.time() + timeout)
        if meta.run.replay is None:
            return live(sched, task, call)
        sched.add_joiner(task, target)
        return self.replayer.park(task, call, deadline, TaskState.BLOCKED_JOIN)

    def _h_receive(self, sched: Scheduler, task: Task, call: Receive) -> Any:
        """A run's task waits for a signal: the oldest kept one, or park until one comes.

        Which signals are in the mailbox at this dispatch is decided by the
        SIGNAL records before it, so taking one needs no record of its own;
        a timeout's deadline is an OUTCOME (as a ``Sleep``'s), and its
        expiry a WAKE of the task.
        """
        meta = task.meta
        if meta is None or meta.opaque:
            sched.park(task, call, TaskState.BLOCKED_SYNC)
            sched.defer_wake(
                task,
                None,
                SystemCallMisuse(
                    f"task {task.id} ({task.name}) yielded Receive outside a journaled run",
                    call=call.kind,
                ),
            )
            return PARKED
        run = meta.run
        box = run.mailbox.get(call.channel)
        if box:
            value, size = box.popleft()
            if not box:
                del run.mailbox[call.channel]
            if size is not None:
                self._count(run, -1, -size)
            return value
        deadline = None
        if call.timeout is not None:
            timeout = float(call.timeout)
            deadline = self._outcome(task, call, lambda: sched.clock.time() + timeout)
        entry = (task, call)
        waiting = run.receivers.get(call.channel)
        if waiting is None:
            run.receivers[call.channel] = [entry]
        else:
            waiting.append(entry)
        if run.replay is not None:
            return self.replayer.park(task, call, deadline, TaskState.BLOCKED_SYNC)
        if deadline is not None:
            sched.wake_at(task, sched.clock.monotonic() + (deadline - sched.clock.time()))
        return sched.park(task, call, TaskState.BLOCKED_SYNC)

    def _unpark_receive(self, sched: Scheduler, task: Task, call: Receive) -> None:
        meta = task.meta
        if isinstance(meta, TaskMeta):
            waiting = meta.run.receivers.get(call.channel)
            if waiting and (task, call) in waiting:
                waiting.remove((task, call))
            if meta.run.replay is not None:
                meta.run.replay.parked.pop(task, None)

    def _h_io(self, sched: Scheduler, task: Task, call: ReadWait | WriteWait) -> Any:
        meta = task.meta
        if meta is not None and not meta.opaque and meta.run.replay is not None:
            return self.replayer.park(task, call, None, TaskState.BLOCKED_IO)
        return self._live[type(call)](sched, task, call)

    def _h_step(self, sched: Scheduler, task: Task, call: Step | RunInThread) -> Any:
        meta = task.meta
        if meta is None or meta.opaque:
            return self._start_step(task, call, 0, 0)
        meta.steps += 1
        ordinal = meta.steps
        if meta.run.replay is not None:
            state = TaskState.BLOCKED_JOIN if is_generator_step(call) else TaskState.BLOCKED_THREAD
            return self.replayer.park(task, call, ordinal, state)
        return self._start_step(task, call, ordinal, 1, fresh=True)

    def _start_step(
        self,
        task: Task,
        call: Step | RunInThread,
        ordinal: int,
        attempt: int,
        *,
        fresh: bool = False,
    ) -> Any:
        """Start a step (journal its STEP_START first), or hold it if the gate says so.

        ``fresh``: the step's dispatch is the run's latest (its STEP_START would
        carry it); otherwise it is restarted at go-live and already parked.
        """
        meta = task.meta
        name = call.name if call.__class__ is Step and call.name else call.fields()["fn"]
        if isinstance(meta, TaskMeta) and not meta.opaque:
            gate = self.step_gate
            reason = gate(task, call) if gate is not None else None
            if reason is not None:
                return self._hold(task, call, ordinal, name, reason, fresh)
            self._append(meta.run, StepStart(meta.run.n, meta.ltid, ordinal, name, attempt))
            if attempt > 1:
                log.warning(
                    "step.rerun", run_id=meta.run.run_id, task=meta.ltid, step=text_of(name)
                )
        if not is_generator_step(call):
            return self.sched.start_thread(task, call)
        # A generator step runs as a task from the next pass on: the kernel
        # cannot hold it, so its STEP_START is committed at this commit point.
        self.recorder.sync_next()
        self._opaque_parent = meta.run if isinstance(meta, TaskMeta) else None
        try:
            return self._live[Step](self.sched, task, call)
        finally:
            self._opaque_parent = None

    def _hold(
        self,
        task: Task,
        call: Step | RunInThread,
        ordinal: int,
        name: str,
        reason: str,
        fresh: bool,
    ) -> Any:
        """Hold a step back: journal why (HOLD) and leave its task parked (``gate.py``)."""
        meta: TaskMeta = task.meta
        run = meta.run
        if fresh and call.__class__ is Step:  # no STEP_START carries this dispatch
            self._append(run, Dispatch(run.n, meta.ltid, "step", text_of(name)[:MAX_ARG_CHARS]))
        self._append(run, Hold(run.n, meta.ltid, ordinal, name, reason))
        held = HeldStep(run.run_id, meta.ltid, task.name, ordinal, name, reason, meta.label.step_id)
        self.held[task] = held
        log.warning(
            "step.held", run_id=run.run_id, task=meta.ltid, step=text_of(name), reason=reason
        )
        if self.on_hold is not None:
            self.on_hold(task, held)
        if not fresh:
            return None  # parked by the replay already
        state = TaskState.BLOCKED_JOIN if is_generator_step(call) else TaskState.BLOCKED_THREAD
        return self.sched.park(task, call, state)

    def _unpark_step(self, sched: Scheduler, task: Task, call: Any) -> None:
        if self.held:
            self.held.pop(task, None)
        child = getattr(call, "child", None)
        if child is not None:
            sched.kill(child)
        meta = task.meta
        if isinstance(meta, TaskMeta) and meta.run.replay is not None:
            meta.run.replay.parked.pop(task, None)


def _marks(rec: Any, n: int, ltid: int, call: Patched) -> bool:
    """True if recorded dispatch ``rec`` is marker ``call`` (dispatch ``n`` of task ``ltid``)."""
    return bool(
        rec.n == n
        and rec.ltid == ltid
        and rec.kind == "patched"
        and rec.arg == text_of(call.patch_id)[:MAX_ARG_CHARS]
    )


def _label_of(call: Any, task: Task) -> TaskLabel:
    """The label a ``NewTask`` gave (its ``meta``), if it gave one, for ``task``."""
    if call.__class__ is NewTask and call.coro is task.coro and call.meta.__class__ is TaskLabel:
        return call.meta
    return _PLAIN_TASK


def signal_bytes(payload: Any) -> int:
    """The bytes a signal's payload counts for (its journaled form), however it is held."""
    return len(canonical(payload))


def _ignore(seq: int, ended: str | None) -> None:
    """The ``done`` of the engine's own signals: nobody waits for their answer."""
