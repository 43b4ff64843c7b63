"""The replayer: feeds a run its recorded outcomes and checks each dispatch.

A run being replayed re-runs its task code in a scheduler; the journal
(``journal.py``) hands each of its dispatches here instead of to the
recorder. The replayer compares the dispatch with the next recorded one,
answers ``Now()``, ``Random()`` and timer deadlines from their recorded
OUTCOME, parks a task whose wake-up is recorded (a step, a sleep, a timed
join, raw I/O) and wakes it when the run's dispatch count reaches the
recorded value, at a wait stage (:meth:`Replayer.inject`). At the end of the
journal the run goes live: parked sleeps get their timers back, steps that
had not finished start again (at-least-once), raw I/O fails with
:class:`RecoveryError`.

Why that suffices is in ``journal.py``; which records a dispatch implies is
in ``history.py``, which builds the :class:`ReplayCursor` read here.

Invariants:

* The replayer reaches the kernel through its ports only (``wake``,
  ``throw``, ``wake_at``, ``remove_joiner``, ``park``, ``ready_count``).
* Every mismatch raises :class:`~tiffany.errors.NondeterminismError` naming
  the run, the task, the WAL seq of the record, what was expected and what
  the code did; the journal is a critical instrument, so it stops the kernel.

Discussion: the per-dispatch check is the replay's hot path (a million
dispatches for ``bench/replay.py``): a bare ``yield`` that matches its
record is checked by the journal's ``after_dispatch`` itself, without a
call here; other dispatches are described, the recorded record is compared
field by field, and the WAL seq is looked up only to report a divergence
(:meth:`ReplayCursor.seq_of`).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import GeneratorType
from typing import TYPE_CHECKING, Any, Final

import structlog

from tiffany.durable.dispatch import describe, same
from tiffany.durable.records import unpack_error
from tiffany.errors import NondeterminismError, TiffanyError
from tiffany.kernel import (
    Receive,
    RunInThread,
    Scheduler,
    Sleep,
    Step,
    SystemCall,
    Task,
    TaskState,
    WaitTask,
)
from tiffany.wire.records import (
    WORKFLOW_CALL_PREFIXES,
    Dispatch,
    Outcome,
    Record,
    RunEnd,
    TaskExit,
    Wake,
    as_list,
)
from tiffany.wire.values import stand_in_text, text_of, unpack_value

if TYPE_CHECKING:
    from tiffany.durable.journal import RunState

__all__ = ["JournalEnded", "RecoveryError", "ReplayCursor", "Replayer", "call_site", "user_source"]

log = structlog.get_logger("tiffany.durable")

#: ``restart(task, call, ordinal, attempt)``: start a step again at go-live.
Restart = Callable[[Task, Any, int, int], Any]


#: Tiffany's own source tree: frames under it are not the user's code.
_OWN_CODE = str(Path(__file__).resolve().parent.parent) + os.sep


#: Names whose use in a task's own code usually means time or randomness read
#: outside a system call (the commonest cause of a divergence), and the fix.
_SUSPECT_NAMES: Final = {
    "time": "yield Now()",
    "monotonic": "yield Now()",
    "perf_counter": "yield Now()",
    "datetime": "yield Now()",
    "random": "yield Random()",
    "randint": "yield Random()",
    "uuid4": "yield Random() (or a Step)",
    "urandom": "yield Random() (or a Step)",
}


def suspect_reads(task: Task) -> str | None:
    """A hint naming the user's functions on ``task``'s stack that read time or randomness.

    Read from their code objects' names (``co_names``) when a divergence is
    reported, so it costs a run nothing: a function that calls
    ``time.time()`` or ``random.random()`` itself, instead of yielding
    ``Now()`` or ``Random()``, replays differently.
    """
    gens: list[Any] = list(task.stack or ())
    gen: Any = task.coro
    while gen is not None:
        gens.append(gen)
        gen = getattr(gen, "gi_yieldfrom", None)
    found: list[str] = []
    for g in gens:
        code = getattr(getattr(g, "gi_frame", None), "f_code", None)
        if code is None or code.co_filename.startswith(_OWN_CODE):
            continue
        names = sorted(set(code.co_names) & _SUSPECT_NAMES.keys())
        if names:
            fixes = sorted({_SUSPECT_NAMES[n] for n in names})
            found.append(f"{code.co_qualname} uses {', '.join(names)} (use {' / '.join(fixes)})")
    if not found:
        return None
    return "time or randomness read outside a system call replays differently: " + "; ".join(found)


def user_source(frames: list[tuple[str, str, int]]) -> str | None:
    """``path:line (function)`` of the innermost frame of the user's code, or None.

    ``frames`` are a task's (``Task.frames()``, outermost first): the user's
    generator is suspended at the yield that diverged, possibly under
    Tiffany's own helpers (a workflow's ``tool(...)``), which are skipped.
    """
    for fn, path, line in reversed(frames):
        if not path.startswith(_OWN_CODE):
            return f"{path}:{line} ({fn})"
    return None


def call_site(task: Task, yielded: Any) -> str | None:
    """``path:line (function)`` of the user's code that yielded a workflow call or a step, or None.

    A workflow's run-level call (a coroutine named ``tool:``, ``child:``,
    ``signal:``: ``WORKFLOW_CALL_PREFIXES``) or a ``Step`` / ``RunInThread``;
    anything else, or a call yielded by Tiffany's own code only, is None.
    Walks the task's frames: call it only where that is paid for (a
    workflow's tasks: the activity feed, a verify's report).
    """
    cls = yielded.__class__
    if cls is GeneratorType:
        name = getattr(yielded, "__qualname__", "")
        if not isinstance(name, str) or not name.startswith(WORKFLOW_CALL_PREFIXES):
            return None
    elif cls is not Step and cls is not RunInThread:
        return None
    return user_source(task.frames())


class RecoveryError(TiffanyError):
    """A task was parked on something that cannot survive a crash (raw I/O)."""

    code = "recovery.io_lost"


class JournalEnded(NondeterminismError):
    """A replay that may not go live (``--verify``) replayed the whole journal, tasks still running.

    For a finished run that is a divergence (the code does more than the
    run did); for an unfinished one (an export of a run in flight) it is
    where the check ends: the code reproduced every recorded dispatch.
    """


@dataclass(eq=False, slots=True)
class ReplayCursor:
    """What is left to replay of one run."""

    dispatches: list[Dispatch]  # in order, carried ones made explicit
    seqs: list[int]  # the WAL seq of each dispatch (for errors: read them with seq_of)
    outcomes: dict[int, tuple[int, Outcome]]  # n -> (wal seq, record)
    wakes: deque[tuple[int, Wake]]  # (wal seq, record)
    exits: dict[int, tuple[int, TaskExit]]  # ltid -> (wal seq, record)
    attempts: dict[tuple[int, int], int]  # (ltid, ordinal) -> last attempt started
    run_end: RunEnd | None
    #: The WAL seq of ``run_end``.
    end_seq: int | None = None
    index: int = 0
    parked: dict[Task, tuple[SystemCall, Any]] = field(default_factory=dict)
    #: Reads ``seqs`` again, when the load did not keep them (``history.load_run``).
    reread: Callable[[], list[int]] | None = None

    @property
    def exhausted(self) -> bool:
        """True once every dispatch and wake-up was replayed."""
        return self.index >= len(self.dispatches) and not self.wakes

    def seq_of(self, i: int) -> int:
        """Return the WAL seq of dispatch ``i`` (reading the seqs again if none were kept).

        Discussion: only an error names a dispatch's seq. A million kept
        seqs cost a one-pass load a noticeable share of its time
        (``bench/replay.py``), so ``verify`` does not keep them, and a divergence reads the run's
        records again to find its seq.
        """
        if self.reread is not None:
            self.seqs, self.reread = self.reread(), None
        return self.seqs[i]

    def next_seq(self) -> int | None:
        """Return the WAL seq of the next record to replay (None at the end of the journal)."""
        i = self.index
        seq = self.seq_of(i) if i < len(self.dispatches) else None
        if self.wakes and (seq is None or self.wakes[0][0] < seq):
            seq = self.wakes[0][0]
        return seq


class Replayer:
    """Replay runs from their cursors; go live (or fail) at the end of the journal.

    Args:
        sched: The scheduler the runs' tasks live in.
        ltid_of: Maps a global task id to its run-local id.
        restart: Starts a step again at go-live (the journal's step starter).
        allow_live: When false (``--verify``), running past the end of the
            journal is a divergence instead of going live.
    """

    def __init__(
        self,
        sched: Scheduler,
        ltid_of: Callable[[int], int | None],
        restart: Restart,
        *,
        allow_live: bool = True,
    ) -> None:
        self.sched = sched
        self.ltid_of = ltid_of
        self.restart = restart
        self.allow_live = allow_live
        self.runs: list[RunState] = []

    # -- per dispatch --------------------------------------------------------------

    def check_dispatch(self, run: RunState, cur: ReplayCursor, task: Task, yielded: Any) -> None:
        """Compare dispatch ``run.n`` of ``task`` with the next recorded one."""
        if yielded is None:
            kind: str = "yield"
            arg: Any = None
        else:
            kind, arg = describe(self.ltid_of, yielded)
        i = cur.index
        rec = cur.dispatches[i]
        cur.index = i + 1
        ltid = task.meta.ltid
        if rec.n != run.n or rec.ltid != ltid or rec.kind != kind or rec.arg != arg:
            raise self.divergence(run, task, cur.seq_of(i), rec, [run.n, ltid, kind, arg])

    def outcome(self, run: RunState, cur: ReplayCursor, task: Task, call: SystemCall) -> Any:
        """Return the recorded outcome of ``call`` (``Now()``...), or go live if the journal ends.

        Returns:
            The recorded value, or :data:`NotImplemented` when the run went
            live and the caller must produce (and record) the value itself.
        """
        ltid = task.meta.ltid
        found = cur.outcomes.get(run.n)
        if found is not None:
            seq, rec = found
            if rec.ltid == ltid and rec.kind == call.kind:
                return unpack_value(rec.value)
            raise self.divergence(run, task, seq, rec, [run.n, ltid, call.kind], what="outcome")
        if cur.index < len(cur.dispatches):
            raise self.divergence(
                run, task, cur.next_seq(), [], [run.n, ltid, call.kind], what="outcome"
            )
        self.go_live(run)  # the journal ends between a dispatch and its outcome
        return NotImplemented

    def park(self, task: Task, call: SystemCall, extra: Any, state: TaskState) -> Any:
        """Park ``task`` until its recorded wake-up (``extra``: a deadline or a step ordinal)."""
        cur = task.meta.run.replay
        assert cur is not None
        cur.parked[task] = (call, extra)
        return self.sched.park(task, call, state)

    def check_exit(self, run: RunState, cur: ReplayCursor, task: Task, fields: list[Any]) -> bool:
        """Check the task's end against its TASK_EXIT; False if none is recorded (record it)."""
        found = cur.exits.get(fields[1])
        if found is None:
            return False  # the journal ends right before this record (a torn pass)
        seq, rec = found
        if rec.state != fields[2] or (rec.state == "done" and not same(rec.value, task.result)):
            shown = [*fields[:3], task.result] if fields[2] == "done" else fields  # not packed
            raise self.divergence(run, task, seq, rec, shown, what="task exit")
        return True

    def check_end(self, run: RunState, cur: ReplayCursor, root: Task, value: Any) -> bool:
        """Check the run's end against its RUN_END; False if none is recorded (record it)."""
        end = cur.run_end
        if end is None:
            return False
        if end.status != run.status or (
            run.status == "succeeded" and not same(end.value, root.result)
        ):
            raise self.divergence(
                run, root, cur.end_seq, end, [run.status, root.result], what="run end"
            )
        return True

    # -- at wait stages --------------------------------------------------------------

    def inject(
        self,
        cancel: Callable[[RunState], None],
        signal: Callable[[RunState, int, Wake], None],
    ) -> None:
        """Deliver the wake-ups recorded at this point of each run; go live at the end.

        A run's own WAKEs (task 0) are a cancel (``cancel(run)``) or a
        signal (``signal(run, seq, record)``: the journal delivers it).
        """
        for run in list(self.runs):
            cur = run.replay
            if cur is not None:
                self._inject_run(run, cur, cancel, signal)

    def _inject_run(
        self,
        run: RunState,
        cur: ReplayCursor,
        cancel: Callable[[RunState], None],
        signal: Callable[[RunState, int, Wake], None],
    ) -> None:
        wakes = cur.wakes
        while wakes and wakes[0][1].at == run.n:
            seq, rec = wakes.popleft()
            if rec.cause == "cancel":
                cancel(run)
            elif rec.ltid == 0 and rec.cause == "signal":
                signal(run, seq, rec)
            else:
                self._deliver(run, cur, seq, rec)
        if wakes and wakes[0][1].at < run.n:
            seq, rec = wakes[0]
            raise self._stalled(run, seq, rec, "its dispatch count passed the wake-up")
        if cur.exhausted:
            self.go_live(run)
        elif not self.sched.ready_count:
            if not wakes:
                i = cur.index
                raise self._stalled(
                    run, cur.seq_of(i), cur.dispatches[i], "no task is ready for the next dispatch"
                )
            if wakes[0][1].at > run.n:
                seq, rec = wakes[0]
                raise self._stalled(run, seq, rec, "no task is ready before the wake-up")

    def _deliver(self, run: RunState, cur: ReplayCursor, seq: int, rec: Wake) -> None:
        ltid, cause, ok, value = rec.ltid, rec.cause, rec.ok, rec.value
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

    def go_live(self, run: RunState) -> None:
        """The replay reached the end of the journal: continue for real."""
        cur = run.replay
        if cur is None:
            return
        if not self.allow_live:
            self._refuse_live(run, cur)
        run.replay = None
        self.runs.remove(run)
        for task, (call, extra) in cur.parked.items():
            self._resume(task, call, extra, cur)
        log.info("replay.live", run_id=run.run_id, dispatches=run.n, resumed=len(cur.parked))

    def _refuse_live(self, run: RunState, cur: ReplayCursor) -> None:
        alive = [t for t in run.tasks.values() if not t.finished]
        if alive or cur.index < len(cur.dispatches) or cur.wakes:
            task = alive[0] if alive else run.root
            assert task is not None
            raise self.divergence(
                run,
                task,
                cur.next_seq(),
                ["end of journal"],
                [f"{len(alive)} task(s) still running"],
                what="replay end",
                ended=cur.exhausted,
            )

    def _resume(self, task: Task, call: SystemCall, extra: Any, cur: ReplayCursor) -> None:
        """Give a task parked by the replay what it waits on for real."""
        sched = self.sched
        cls = call.__class__
        if cls is Sleep or cls is WaitTask or (cls is Receive and extra is not None):
            remaining = max(0.0, float(extra) - sched.clock.time())
            sched.wake_at(task, sched.clock.monotonic() + remaining)
        elif cls is Receive:
            pass  # no timeout: it stays parked (among its run's receivers) until a signal
        elif isinstance(call, Step | RunInThread):
            attempt = cur.attempts.get((task.meta.ltid, extra), 0) + 1
            self.restart(task, call, extra, attempt)
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

    # -- errors ------------------------------------------------------------------------

    def divergence(
        self,
        run: RunState,
        task: Task,
        seq: int | None,
        expected: Record | list[Any],
        actual: list[Any],
        what: str = "dispatch",
        *,
        ended: bool = False,
    ) -> NondeterminismError:
        """Return (and log) the error for a replay that does not match its journal.

        ``seq`` is the WAL seq of the record it does not match (None: the
        journal holds none there, e.g. it ended while tasks still ran).
        ``ended``: every recorded dispatch and wake-up was replayed, and the
        code goes on (:class:`JournalEnded`).
        """
        if not isinstance(expected, list):
            expected = as_list(expected)
        meta = task.meta
        stack = task.frames()
        frames = [f"{fn} ({path}:{line})" for fn, path, line in stack]
        source = user_source(stack)
        at = f" at {source}" if source else ""
        hint = suspect_reads(task)
        err = (JournalEnded if ended else NondeterminismError)(
            f"run {run.run_id}: {what} #{run.n} of task {meta.ltid if meta else '?'} "
            f"({text_of(task.name)}){at} diverged from the journal (seq {seq}): expected "
            f"{stand_in_text(expected)}, got {stand_in_text(actual)}"
            + (f"; {hint}" if hint else ""),
            run_id=run.run_id,
            source=source,
            hint=hint,
            task=meta.ltid if meta else None,
            task_name=task.name,
            dispatch=run.n,
            seq=seq,
            what=what,
            expected=expected,
            actual=actual,
            stack=frames,
        )
        # The end of an unfinished run's journal is where a check of it stops
        # (a verifier decides whether that is a divergence): not an error here.
        (log.info if ended else log.error)(
            "replay.journal_ended" if ended else "replay.nondeterminism",
            **{k: v for k, v in err.fields.items() if k != "stack"},
            frames=frames,
        )
        return err

    def _stalled(self, run: RunState, seq: int, rec: Record, why: str) -> NondeterminismError:
        fields = as_list(rec)
        err = NondeterminismError(
            f"run {run.run_id}: replay stalled at dispatch #{run.n} ({why}); "
            f"next journal record seq {seq}: {fields!r}",
            run_id=run.run_id,
            dispatch=run.n,
            seq=seq,
            expected=fields,
            actual=None,
        )
        log.error("replay.stalled", **err.fields)
        return err
