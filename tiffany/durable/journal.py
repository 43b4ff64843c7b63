"""The journal: the kernel instrument that makes runs durable and replayable.

A *run* is a root task and its descendants. The journal follows every
dispatch of every run's tasks and appends it to the WAL; for a run being
replayed it does the opposite: it checks each dispatch against the WAL and
feeds the recorded outcomes back.

What is recorded (see ``records.py`` for the layout):

* every dispatch: which task (by its run-local id), what it yielded (the
  call's kind and a small deterministic argument);
* every value from outside the run, in full: ``Now()``, ``Random()``, step
  and thread results, and every wake-up that entered the ready queue at a
  wait stage (timers, I/O, thread and step completions, cancel requests),
  with the run's dispatch count at that moment;
* spawns, step starts (with the attempt number), task exits, the run's end.

One record per dispatch at most: a dispatch whose own record would follow
at once (a ``NewTask`` and its SPAWN, a ``Now()`` or ``Random()`` and its
OUTCOME, a ``Step`` and its STEP_START, a task's final ``return`` and its
TASK_EXIT) is journaled by that record alone, which *stands for* the
dispatch. The rule a reader applies (``history.py``, the store's projector)
is that dispatch counts only grow: a SPAWN, OUTCOME, STEP_START or
TASK_EXIT whose ``n`` is above the last dispatch seen is the dispatch ``n``
itself, with the call's kind and argument implied by the record (see
``records.py``). Journals written before this rule (a DISPATCH record,
then the SPAWN at the same ``n``) read the same way. The run's root keeps
the DISPATCH record of its final ``return``: the run's last dispatch stays
an explicit record (its count is what readers show for the run).

Why that suffices: the kernel is deterministic for a given sequence of
external events, and the only place external events enter the ready queue
is the wait stage. A run's tasks are appended to the FIFO ready queue either
by their own dispatches (reproduced by re-running the code) or at a wait
stage (reproduced by injecting the recorded wake-up when the run's dispatch
count reaches the recorded value). Other runs sharing the scheduler never
touch this run's tasks, so each run replays alone, in the same order.

Invariants:

* Write-ahead: records are committed (one ``fdatasync`` under the
  ``batch`` policy) at the ``before_wait`` hook; the kernel releases thread
  jobs and inline steps only after that hook, and holds them while the
  journal defers its commit to a later pass (``Scheduler.effects_held``,
  see ``before_wait``); a step's task starts in the next pass. So no effect
  leaves the process before the records that led to it are durable.

Discussion: carried dispatch records cost nothing in exactness: the
implied record is built from fields the carrying record already has, and a
replay compares it as it compared the explicit one. With the worker running
a python step itself, timed, a trivial plan step journals 4 records where it
journaled 17 (``bench/plans.py``). What a dispatch is recorded as, and which
dispatches are carried, is in ``dispatch.py``.

Discussion: records that lead to no effect (a dispatch, a spawn, a task's
exit) are not synced on their own: they are committed with the next record
that does lead to one (a step starting, a run accepted or finished), when
the loop is about to block, or after ``GROUP_COMMIT_MAX_S``. A chain of
steps then costs one ``fdatasync`` per step, not one per loop iteration of
the planner, worker and tool tasks that carry it; a crash before the sync
loses only work that no effect depended on, which replay redoes.

Discussion: a wake-up recorded at a wait stage (a step's result) is *not*
committed before the task it wakes runs; it is committed with the records
of that next pass, before any effect of that pass leaves the process.
Committing it first would cost a second ``fdatasync`` per iteration (half
the throughput of sequential steps) and buys nothing observable: if the
engine dies before the commit, everything the woken task did is lost with
it and replay redoes it from the last durable record, and none of it had
left the process. The one thing a task could do that escapes this is raw
I/O from journaled code, which is why I/O belongs inside steps.
* Fail-stop: the journal is a critical instrument; a WAL error stops the
  kernel. A replay mismatch raises :class:`~tiffany.errors.NondeterminismError`
  the same way.
* Opaque tasks (the body of a generator step) are not journaled dispatch by
  dispatch: only their outcome is, as a wake-up of the caller.
* A step the engine's ``step_gate`` holds back is not started: a HOLD record
  says why, the task stays parked until a later engine starts it
  (``gate.py``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from types import GeneratorType
from typing import Any, Final

import structlog

from tiffany.durable.dispatch import (
    CARRIED_CALLS,
    MAX_ARG_CHARS,
    describe,
    is_generator_step,
    same,
)
from tiffany.durable.gate import HeldStep, StepGate
from tiffany.durable.records import (
    RecordType,
    encode_fields,
    pack_error,
    pack_value,
    unpack_error,
    unpack_value,
)
from tiffany.errors import NondeterminismError, TiffanyError
from tiffany.kernel import (
    RETURNED,
    Instrument,
    NewTask,
    Now,
    Random,
    ReadWait,
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
from tiffany.wal import Wal

__all__ = ["Journal", "RecoveryError", "RunState", "TaskMeta"]

log = structlog.get_logger("tiffany.durable")

#: Commit at least this often while records are pending, even with no effect.
GROUP_COMMIT_MAX_S: Final = 0.010
#: Records whose effect leaves the process right after the commit: a step
#: starting, a run accepted or finished, a cancel acknowledged.
_SYNC_BEFORE_EFFECT: Final = frozenset(
    {RecordType.STEP_START, RecordType.RUN_START, RecordType.RUN_END}
)
_encode_fields: Final = encode_fields


class RecoveryError(TiffanyError):
    """A task was parked on something that cannot survive a crash (raw I/O)."""

    code = "recovery.io_lost"


@dataclass(eq=False, slots=True)
class ReplayCursor:
    """What is left to replay of one run."""

    dispatches: list[tuple[int, list[Any]]]  # (wal seq, [n, ltid, kind, arg])
    outcomes: dict[int, list[Any]]  # n -> [n, ltid, kind, value]
    wakes: deque[tuple[int, list[Any]]]  # (wal seq, [at, ltid, cause, ok, value])
    exits: dict[int, list[Any]]  # ltid -> [n, ltid, state, value]
    attempts: dict[tuple[int, int], int]  # (ltid, ordinal) -> last attempt started
    run_end: list[Any] | None
    index: int = 0
    parked: dict[Task, tuple[SystemCall, Any]] = field(default_factory=dict)

    @property
    def exhausted(self) -> bool:
        """True once every dispatch and wake-up was replayed."""
        return self.index >= len(self.dispatches) and not self.wakes


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


@dataclass(eq=False, slots=True)
class TaskMeta:
    """The journal's note on a task (kept in ``Task.meta``)."""

    run: RunState
    ltid: int
    opaque: bool = False
    steps: int = 0


class Journal(Instrument):
    """Record runs into the WAL, and replay them from it.

    Args:
        wal: The open WAL (the journal appends and commits); None to replay
            without recording.
        sched: The scheduler it is attached to (it installs handlers).
        allow_live: When false (``--verify``), a replay that runs past the
            end of its journal is a divergence instead of going live.
    """

    critical = True

    def __init__(self, wal: Wal | None, sched: Scheduler, *, allow_live: bool = True) -> None:
        self.wal = wal
        self.sched = sched
        self.allow_live = allow_live
        self.runs: dict[str, RunState] = {}
        self._by_no: dict[int, RunState] = {}
        self._next_run_no = 1
        self._starting: RunState | None = None
        self._opaque_parent: RunState | None = None
        self._in_wait = False
        self._dirty = False
        self._need_sync = False
        self._sync_now = False  # an effect starts next pass whatever the kernel holds
        self._last_commit = time.monotonic()
        self._replaying: list[RunState] = []
        self._cancels: list[tuple[RunState, str]] = []
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
        ):
            self._live[call_type] = sched.handler(call_type)
            sched.register(call_type, handler, unpark)
        self._live_now = self._live[Now]
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
    ) -> RunState:
        """Spawn ``coro`` as the root of run ``run_id`` and journal it.

        With ``replay``, the run's records already exist: nothing is
        appended until the replay reaches their end.
        """
        if run_id in self.runs:
            raise TiffanyError(f"run {run_id} exists", run_id=run_id)
        no = run_no if run_no is not None else self._next_run_no
        self._next_run_no = max(self._next_run_no, no + 1)
        run = RunState(no, run_id, name, no.to_bytes(4, "little"), replay=replay, on_end=on_end)
        self.runs[run_id] = run
        self._by_no[no] = run
        if replay is None:
            self._append(RecordType.RUN_START, run, [run_id, name, entry, self.sched.clock.time()])
        else:
            self._replaying.append(run)
        self._starting = run
        try:
            self.sched.spawn(coro, name=name)
        finally:
            self._starting = None
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
        self._append(
            RecordType.RUN_END, run, ["failed", pack_error(error), self.sched.clock.time()]
        )
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
        if self._dirty and self.wal is not None:
            self._dirty = False
            self._need_sync = False
            self._sync_now = False
            self._last_commit = time.monotonic()
            self.wal.commit()
        self.sched.release_effects()

    def require_commit(self) -> None:
        """Commit at the next wait stage (before an acknowledgement leaves)."""
        self._need_sync = True

    # -- instrument hooks ----------------------------------------------------

    def task_spawned(self, task: Task) -> None:
        """Give the new task its run and run-local id; journal the spawn."""
        run = self._starting
        parent_ltid = 0
        if run is None:
            if task.parent is None:
                return
            parent = self.sched.find(task.parent)
            pmeta = parent.meta if parent is not None else None
            if not isinstance(pmeta, TaskMeta):
                return
            run = pmeta.run
            if pmeta.opaque or self._opaque_parent is run:
                task.meta = TaskMeta(run, -1, opaque=True)
                return
            parent_ltid = pmeta.ltid
        ltid = run.next_ltid
        run.next_ltid += 1
        task.meta = TaskMeta(run, ltid)
        run.tasks[ltid] = task
        if run.root is None:
            run.root = task
        if run.replay is None:
            self._append(RecordType.SPAWN, run, [run.n, ltid, parent_ltid, task.name])

    def after_dispatch(self, task: Task, yielded: Any) -> None:
        """Journal the dispatch, or check it against the journal when replaying."""
        meta = task.meta
        if meta is None or meta.opaque:
            return
        run = meta.run
        cur = run.replay
        if cur is not None and cur.index >= len(cur.dispatches):
            # Before counting this dispatch: steps restarted at go-live are
            # journaled at the last recorded ``n``, so they carry no dispatch.
            self._go_live(run)
            cur = None
        run.n += 1
        if cur is None:
            # dispatch.carried(), inlined (this runs for every dispatch), plus
            # a task's final return, which its TASK_EXIT carries (not the root's).
            cls = yielded.__class__
            if cls in CARRIED_CALLS:
                return
            if yielded is RETURNED:
                if _ends(task, run):
                    return
            elif cls is NewTask and yielded.coro.__class__ is GeneratorType:
                return
            kind, arg = describe(self.ltid_of, yielded)
            if arg is not None and not isinstance(arg, int | float | bool):
                arg = str(arg)[:MAX_ARG_CHARS]
            self._append(RecordType.DISPATCH, run, [run.n, meta.ltid, kind, arg])
            return
        kind, arg = describe(self.ltid_of, yielded)
        if arg is not None and not isinstance(arg, int | float | bool):
            arg = str(arg)[:MAX_ARG_CHARS]
        seq, rec = cur.dispatches[cur.index]
        cur.index += 1
        if rec[0] != run.n or rec[1] != meta.ltid or rec[2] != kind or rec[3] != arg:
            raise self._divergence(run, task, seq, rec, [run.n, meta.ltid, kind, arg])

    def task_woken(self, task: Task, value: Any) -> None:
        """Journal a wake-up that came from outside the run (at a wait stage)."""
        meta = task.meta
        if meta is None or meta.opaque:
            return
        if meta.run.replay is not None:
            meta.run.replay.parked.pop(task, None)  # woken by the replayed code itself
            return
        if not self._in_wait:
            return
        call = task.blocked_on
        cause = call.kind if call is not None else "?"
        err = task.pending_error
        if err is not None:
            fields = [meta.run.n, meta.ltid, cause, False, pack_error(err)]
        else:
            fields = [meta.run.n, meta.ltid, cause, True, pack_value(value)]
        self._append(RecordType.WAKE, meta.run, fields)

    def task_exited(self, task: Task) -> None:
        """Journal the task's end (and the run's, for the root)."""
        self._exit(task)

    def task_crashed(self, task: Task, error: BaseException) -> None:
        """Journal the task's crash (and the run's failure, for the root)."""
        self._exit(task)

    def before_wait(self, timeout: float | None) -> None:
        """Group commit: make the records durable before any effect leaves.

        Commits when the loop is about to block (``timeout`` not 0), when
        the last commit is older than ``GROUP_COMMIT_MAX_S``, or when an
        effect waits for the commit (a step starts, a run starts or ends:
        ``_need_sync``) and no other task is ready. With tasks still ready,
        an effect's commit is deferred to a later pass (at most
        ``GROUP_COMMIT_MAX_S`` after the last one) and the kernel holds the
        effects until then (``effects_held``). Only effects the kernel can
        hold are deferred (thread jobs and inline steps): a generator step
        runs as a task from the next pass, so it commits at once
        (``_sync_now``).

        Discussion: a planner that starts 1,000 steps does it over ten
        passes (a task's turn is capped at ``MAX_IMMEDIATE_RESUMES``).
        Syncing at the end of each pass cost ten ``fdatasync`` calls where
        one does; holding the steps until the loop runs out of ready work
        (or 10 ms pass) batches them into one. A chain of steps never has
        another task ready, so it still syncs at once, and write-ahead is
        untouched: no effect is released before the commit.
        """
        if self._dirty:
            if (
                self._sync_now
                or timeout != 0.0
                or time.monotonic() - self._last_commit >= GROUP_COMMIT_MAX_S
            ):
                self.commit()
            elif self._need_sync:
                if self.sched.ready_count:
                    self.sched.hold_effects()  # commit in a later pass
                else:
                    self.commit()
        self._in_wait = True

    def after_wait(self, events: int) -> None:
        """Stop treating wake-ups as external (the pass begins)."""
        self._in_wait = False

    def after_run(self) -> None:
        """Commit whatever is left when the loop stops."""
        self._in_wait = False
        self.commit()

    # -- internals -------------------------------------------------------------

    def _append(self, rtype: RecordType, run: RunState, fields: list[Any]) -> None:
        wal = self.wal
        if wal is not None:
            wal.append(rtype, run.prefix + _encode_fields(fields))  # records.encode, inlined
            self._dirty = True
            if rtype in _SYNC_BEFORE_EFFECT:
                self._need_sync = True

    def _exit(self, task: Task) -> None:
        meta = task.meta
        if meta is None or meta.opaque:
            return
        run = meta.run
        run.tasks.pop(meta.ltid, None)  # only live tasks are woken, killed or resumed
        if self.held:
            self.held.pop(task, None)
        if task.state is TaskState.DONE:
            value: Any = pack_value(task.result)
        else:
            value = pack_error(task.error) if task.error is not None else None
        fields = [run.n, meta.ltid, task.state._value_, value]  # _value_: no enum property
        cur = run.replay
        rec = cur.exits.get(meta.ltid) if cur is not None else None
        if rec is None:
            # Live, or the journal ends right before this record (a torn pass).
            self._append(RecordType.TASK_EXIT, run, fields)
        else:
            if rec[2] != fields[2] or (rec[2] == "done" and not same(rec[3], task.result)):
                raise self._divergence(run, task, -1, rec, fields, what="task exit")
        if task is run.root:
            self._end_run(run, task, value)

    def _end_run(self, run: RunState, root: Task, value: Any) -> None:
        """Journal the run's end; ``value`` is the root's exit value, already packed.

        (The root's result packed once: for a plan it is the summary of every step.)
        """
        run.status = {
            TaskState.DONE: "succeeded",
            TaskState.CRASHED: "failed",
            TaskState.CANCELLED: "cancelled",
        }[root.state]
        run.result, run.error = root.result, root.error
        cur = run.replay
        if cur is None or cur.run_end is None:
            self._append(RecordType.RUN_END, run, [run.status, value, self.sched.clock.time()])
        elif cur.run_end[0] != run.status or (
            run.status == "succeeded" and not same(cur.run_end[1], root.result)
        ):
            raise self._divergence(run, root, -1, cur.run_end, [run.status, value], what="run end")
        if run.on_end is not None:
            run.on_end(run)

    def _divergence(
        self,
        run: RunState,
        task: Task,
        seq: int,
        expected: list[Any],
        actual: list[Any],
        what: str = "dispatch",
    ) -> NondeterminismError:
        meta = task.meta
        frames = [f"{fn} ({path}:{line})" for fn, path, line in task.frames()]
        err = NondeterminismError(
            f"run {run.run_id}: {what} #{run.n} of task {meta.ltid if meta else '?'} "
            f"({task.name}) diverged from the journal: expected {expected!r}, got {actual!r}",
            run_id=run.run_id,
            task=meta.ltid if meta else None,
            task_name=task.name,
            dispatch=run.n,
            seq=seq,
            what=what,
            expected=expected,
            actual=actual,
            stack=frames,
        )
        log.error(
            "replay.nondeterminism",
            **{k: v for k, v in err.fields.items() if k != "stack"},
            frames=frames,
        )
        return err

    def _inject(self) -> None:
        """Wait-stage injector: recorded wake-ups, cancel requests, go-live.

        Wake-ups caused *by* what it injects (a cancelled task's joiners...)
        are consequences the replay reproduces, so they are not journaled as
        external: the kernel runs injectors before the commit point, and
        wake-ups count as external only from ``before_wait`` on. The records
        it appends (a cancel, steps restarted at go-live) join that commit,
        before their effects are released.
        """
        if self._cancels:
            cancels, self._cancels = self._cancels, []
            for run, reason in cancels:
                if run.status == "running":
                    self._append(RecordType.WAKE, run, [run.n, 0, "cancel", True, reason])
                    self._cancel_tasks(run)
        if not self._replaying:
            return
        for run in list(self._replaying):
            cur = run.replay
            if cur is None:
                continue
            while cur.wakes and cur.wakes[0][1][0] == run.n:
                seq, rec = cur.wakes.popleft()
                self._deliver(run, cur, seq, rec)
            if cur.wakes and cur.wakes[0][1][0] < run.n:
                seq, rec = cur.wakes[0]
                raise self._stalled(run, seq, rec, "its dispatch count passed the wake-up")
            if cur.exhausted:
                self._go_live(run)
            elif not self.sched.ready_count and not cur.wakes:
                seq, rec = cur.dispatches[cur.index]
                raise self._stalled(run, seq, rec, "no task is ready for the next dispatch")
            elif not self.sched.ready_count and cur.wakes[0][1][0] > run.n:
                seq, rec = cur.wakes[0]
                raise self._stalled(run, seq, rec, "no task is ready before the wake-up")

    def _stalled(self, run: RunState, seq: int, rec: list[Any], why: str) -> NondeterminismError:
        err = NondeterminismError(
            f"run {run.run_id}: replay stalled at dispatch #{run.n} ({why}); "
            f"next journal record seq {seq}: {rec!r}",
            run_id=run.run_id,
            dispatch=run.n,
            seq=seq,
            expected=rec,
            actual=None,
        )
        log.error("replay.stalled", **err.fields)
        return err

    def _deliver(self, run: RunState, cur: ReplayCursor, seq: int, rec: list[Any]) -> None:
        _at, ltid, cause, ok, value = rec
        if cause == "cancel":
            self._cancel_tasks(run)
            return
        task = run.tasks.get(ltid)
        parked = cur.parked.pop(task, None) if task is not None else None
        if task is None or parked is None or parked[0].kind != cause:
            raise self._stalled(run, seq, rec, f"task {ltid} is not waiting on {cause}")
        call = parked[0]
        if call.__class__ is WaitTask:
            self.sched.remove_joiner(task, call.tid)
        if ok:
            self.sched.wake(task, unpack_value(value))
        else:
            self.sched.throw(task, unpack_error(value))

    def _cancel_tasks(self, run: RunState) -> None:
        for ltid in sorted(run.tasks):
            task = run.tasks[ltid]
            if not task.finished:
                self.sched.kill(task.id)

    def _go_live(self, run: RunState) -> None:
        """The replay reached the end of the journal: continue for real."""
        cur = run.replay
        if cur is None:
            return
        if not self.allow_live:
            alive = [t for t in run.tasks.values() if not t.finished]
            if alive or cur.index < len(cur.dispatches) or cur.wakes:
                task = alive[0] if alive else run.root
                assert task is not None
                raise self._divergence(
                    run,
                    task,
                    -1,
                    ["end of journal"],
                    [f"{len(alive)} task(s) still running"],
                    what="replay end",
                )
        run.replay = None
        self._replaying.remove(run)
        sched = self.sched
        for task, (call, extra) in cur.parked.items():
            cls = call.__class__
            if cls is Sleep or cls is WaitTask:
                remaining = max(0.0, float(extra) - sched.clock.time())
                sched.wake_at(task, sched.clock.monotonic() + remaining)
            elif isinstance(call, Step | RunInThread):
                meta = task.meta
                attempt = cur.attempts.get((meta.ltid, extra), 0) + 1
                self._start_step(task, call, extra, attempt)
            else:  # raw I/O: the descriptor did not survive the crash
                sched.defer_wake(
                    task,
                    None,
                    RecoveryError(
                        f"task {task.name} was waiting on {call.kind} when the engine "
                        "stopped; descriptors do not survive a restart (do I/O inside a Step)",
                        call=call.kind,
                    ),
                )
        log.info("replay.live", run_id=run.run_id, dispatches=run.n, resumed=len(cur.parked))

    # -- handlers for calls whose outcome comes from outside -------------------

    def _outcome(self, task: Task, call: SystemCall, live: Callable[[], Any]) -> Any:
        meta = task.meta
        if meta is None or meta.opaque:
            return live()
        run = meta.run
        cur = run.replay
        if cur is not None:
            rec = cur.outcomes.get(run.n)
            if rec is not None and rec[1] == meta.ltid and rec[2] == call.kind:
                return unpack_value(rec[3])
            if rec is not None or cur.index < len(cur.dispatches):
                raise self._divergence(
                    run, task, -1, rec or [], [run.n, meta.ltid, call.kind], what="outcome"
                )
            self._go_live(run)  # the journal ends between a dispatch and its outcome
        value = live()
        self._append(RecordType.OUTCOME, run, [run.n, meta.ltid, call.kind, pack_value(value)])
        return value

    def _h_now(self, sched: Scheduler, task: Task, call: Now) -> Any:
        meta = task.meta
        if meta is not None and not meta.opaque and meta.run.replay is None:
            # The live path of _outcome, inlined: one per plan step and attempt.
            run = meta.run
            value = self._live_now(sched, task, call)
            self._append(RecordType.OUTCOME, run, [run.n, meta.ltid, "now", pack_value(value)])
            return value
        return self._outcome(task, call, lambda: self._live_now(sched, task, call))

    def _h_random(self, sched: Scheduler, task: Task, call: Random) -> Any:
        return self._outcome(task, call, lambda: self._live[Random](sched, task, call))

    def _replayed_park(self, task: Task, call: SystemCall, extra: Any, state: TaskState) -> Any:
        meta: TaskMeta = task.meta
        cur = meta.run.replay
        assert cur is not None
        cur.parked[task] = (call, extra)
        return self.sched.park(task, call, state)

    def _h_sleep(self, sched: Scheduler, task: Task, call: Sleep) -> Any:
        meta = task.meta
        if meta is None or meta.opaque or call.seconds <= 0:
            return self._live[Sleep](sched, task, call)
        deadline = self._outcome(task, call, lambda: sched.clock.time() + call.seconds)
        if meta.run.replay is not None:
            return self._replayed_park(task, call, deadline, TaskState.BLOCKED_SLEEP)
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
        return self._replayed_park(task, call, deadline, TaskState.BLOCKED_JOIN)

    def _h_io(self, sched: Scheduler, task: Task, call: ReadWait | WriteWait) -> Any:
        meta = task.meta
        if meta is not None and not meta.opaque and meta.run.replay is not None:
            return self._replayed_park(task, call, None, TaskState.BLOCKED_IO)
        return self._live[type(call)](sched, task, call)

    def _h_step(self, sched: Scheduler, task: Task, call: Step | RunInThread) -> Any:
        meta = task.meta
        if meta is None or meta.opaque:
            return self._start_step(task, call, 0, 0)
        meta.steps += 1
        ordinal = meta.steps
        if meta.run.replay is not None:
            state = TaskState.BLOCKED_JOIN if is_generator_step(call) else TaskState.BLOCKED_THREAD
            return self._replayed_park(task, call, ordinal, state)
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
            fields = [meta.run.n, meta.ltid, ordinal, name, attempt]
            self._append(RecordType.STEP_START, meta.run, fields)
            if attempt > 1:
                log.warning("step.rerun", run_id=meta.run.run_id, task=meta.ltid, step=name)
        if not is_generator_step(call):
            return self.sched.start_thread(task, call)
        # A generator step runs as a task from the next pass on: the kernel
        # cannot hold it, so its STEP_START is committed at this commit point.
        self._sync_now = True
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
            self._append(RecordType.DISPATCH, run, [run.n, meta.ltid, "step", name[:MAX_ARG_CHARS]])
        self._append(RecordType.HOLD, run, [run.n, meta.ltid, ordinal, name, reason])
        held = HeldStep(run.run_id, meta.ltid, task.name, ordinal, name, reason)
        self.held[task] = held
        log.warning("step.held", run_id=run.run_id, task=meta.ltid, step=name, reason=reason)
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


def _ends(task: Task, run: RunState) -> bool:
    """True if this ``return`` ends ``task`` (its TASK_EXIT carries it), the root's aside."""
    return not task.stack and task is not run.root
