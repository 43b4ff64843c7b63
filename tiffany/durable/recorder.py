"""The recorder: a live run's dispatches become WAL records, committed by policy.

The journal (``journal.py``) hands every dispatch of a live run here. The
recorder turns it into a record (or into nothing, when the record that
follows stands for it: see ``dispatch.py``), appends the records to the WAL
and decides when they are made durable: the group commit.

Invariants:

* Write-ahead: records are committed (one ``fdatasync`` under the
  ``batch`` policy) at the kernel's commit point (``before_wait``); the
  kernel releases thread jobs and inline steps only after that hook, and
  holds them while the recorder defers its commit to a later pass
  (``Scheduler.hold_effects``); a step's task starts in the next pass. So
  no effect leaves the process before the records that led to it are
  durable.
* Fail-stop: a WAL error propagates; the journal is a critical instrument,
  so it stops the kernel.
* Data never makes a hook raise: every record is encoded here, and what it
  holds that does not encode or fit (:data:`~tiffany.wire.values.ENCODE_ERRORS`)
  is decided by one rule. A value from outside a run (a step's result) is
  refused: the task gets :class:`~tiffany.errors.UnjournalableValue`
  (``journal.value``) and the WAKE records that error (:meth:`Recorder.woken`).
  A run's entry is refused to its submitter (:meth:`Recorder.start`). Text
  a record must hold anyway (a name, an error's message, a dispatch's
  argument) and values past the point of refusal (a task's result, an
  error's arguments) are kept in an encodable form (:func:`_kept`: lone
  surrogates escaped, stand-ins), and a task woken with an error kept so
  gets the error as the record keeps it, as its replay will.

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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import msgspec
import structlog

from tiffany.durable.dispatch import carried, describe
from tiffany.durable.records import pack_error, unpack_error
from tiffany.errors import UnjournalableValue
from tiffany.kernel import RETURNED, Scheduler, Task
from tiffany.wal import MAX_RECORD_BYTES, Log, Span
from tiffany.wire.records import (
    RUN_PREFIX,
    Dispatch,
    Record,
    RecordType,
    RunEnd,
    RunStart,
    TaskExit,
    Wake,
    decode_body,
    encode_body,
)
from tiffany.wire.values import (
    ENCODE_ERRORS,
    STAND_IN_CHARS,
    encodable,
    pack_value,
    stand_in,
    text_of,
)

if TYPE_CHECKING:
    from tiffany.durable.journal import RunState, TaskMeta

__all__ = ["GROUP_COMMIT_MAX_S", "MAX_BODY_BYTES", "Recorder"]

log = structlog.get_logger("tiffany.durable")

#: Commit at least this often while records are pending, even with no effect.
GROUP_COMMIT_MAX_S: Final = 0.010
#: Records whose effect leaves the process right after the commit: a step
#: starting, a run accepted or finished, a cancel acknowledged.
_SYNC_BEFORE_EFFECT: Final = frozenset(
    {RecordType.STEP_START, RecordType.RUN_START, RecordType.RUN_END}
)
_encode_body: Final = encode_body
#: The largest record body a run's record may have (the WAL's limit, less the run prefix).
MAX_BODY_BYTES: Final = MAX_RECORD_BYTES - RUN_PREFIX.size


def _fitted(rec: Record) -> tuple[bytes, str] | tuple[None, str]:
    """``(body, "")`` when ``rec`` encodes within a record; else ``(None, why not)``."""
    try:
        body = _encode_body(rec)
    except ENCODE_ERRORS as exc:
        return None, _reason(exc)
    if len(body) > MAX_BODY_BYTES:
        return None, _too_large(body)
    return body, ""


def _reason(exc: BaseException) -> str:
    """Why a value did not encode, as text a record can hold."""
    return f"{type(exc).__name__}: {text_of(exc)}"


def _too_large(body: bytes) -> str:
    return f"{len(body):,} bytes encoded"


def _field_kinds(cls: type[Record]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of ``cls``'s text fields, and of its fields that hold any value."""
    text, values = [], []
    for f in msgspec.structs.fields(cls):
        if f.type is str or f.type == (str | None):
            text.append(f.name)
        elif f.type is Any:
            values.append(f.name)
    return tuple(text), tuple(values)


_FIELD_KINDS: Final = {cls: _field_kinds(cls) for cls in Record.__args__}


def _kept(rec: Record, *, whole: bool = False) -> Record:
    """``rec`` in a form that encodes, whatever it holds (the records no one can refuse).

    Its text fields made text (:func:`~tiffany.wire.values.text_of`: lone
    surrogates escaped) and cut to ``STAND_IN_CHARS``; its value fields made
    :func:`~tiffany.wire.values.encodable`, or, ``whole``, their stand-ins (a
    record still too large).
    """
    text, values = _FIELD_KINDS[rec.__class__]
    changes: dict[str, Any] = {}
    for name in text:
        v = getattr(rec, name)
        if v is not None:
            changes[name] = text_of(v)[:STAND_IN_CHARS]
    for name in values:
        v = getattr(rec, name)
        changes[name] = stand_in(v) if whole else encodable(v)
    return msgspec.structs.replace(rec, **changes)


class Recorder:
    """Append a run's records to the WAL and commit them by the group-commit policy.

    Args:
        wal: The open WAL; None records nothing (a replay that must not go live).
        sched: The scheduler whose effects it holds while a commit is deferred.
        ltid_of: Maps a global task id to its run-local id (for joins and kills).
    """

    def __init__(
        self, wal: Log | None, sched: Scheduler, ltid_of: Callable[[int], int | None]
    ) -> None:
        self.wal = wal
        self.sched = sched
        self.ltid_of = ltid_of
        #: True between the commit point and the next pass: wake-ups then come
        #: from outside the run (timers, I/O, steps) and are recorded.
        self.in_wait = False
        self._dirty = False
        self._need_sync = False
        self._sync_now = False  # an effect starts next pass whatever the kernel holds
        self._last_commit = time.monotonic()

    # -- records -------------------------------------------------------------------

    def append(self, run: RunState, rec: Record) -> None:
        """Append one record of ``run`` (committed at the next commit point).

        A record that does not encode or fit as it is is appended as
        :func:`_kept` makes it (see :meth:`body`).
        """
        wal = self.wal
        if wal is not None:
            rtype = rec.rtype
            try:
                body = _encode_body(rec)  # records.encode, inlined
            except ENCODE_ERRORS:
                body = self.body(run, rec)[0]
            else:
                if len(body) > MAX_BODY_BYTES:
                    body = self.body(run, rec)[0]
            wal.append(rtype, run.prefix + body)
            self._dirty = True
            if rtype in _SYNC_BEFORE_EFFECT:
                self._need_sync = True

    def body(self, run: RunState, rec: Record) -> tuple[bytes, bool]:
        """Return ``(body, kept)``: ``rec`` encoded, or (``kept``) its :func:`_kept` form.

        Never raises on what the record holds. The kept form is logged
        (``journal.record_kept``): its text or values are not what the run had.
        """
        body, why = _fitted(rec)
        if body is not None:
            return body, False
        kept = _kept(rec)
        body, _ = _fitted(kept)
        if body is None:
            body = _encode_body(_kept(kept, whole=True))
        log.warning(
            "journal.record_kept",
            run_id=run.run_id,
            record=rec.__class__.__name__,
            reason=why,
        )
        return body, True

    @staticmethod
    def fits(rec: Record) -> tuple[bytes, str] | tuple[None, str]:
        """``(body, "")`` when ``rec`` encodes within a record; else ``(None, why not)``."""
        return _fitted(rec)

    def start(self, run: RunState, rec: RunStart) -> None:
        """Append a run's RUN_START, or refuse the run: its entry cannot be journaled.

        Raises:
            UnjournalableValue: The entry (the plan and its inputs, a
                workflow's arguments) or the run's name does not encode or
                fit a record; nothing is appended.
        """
        body, why = _fitted(rec)
        if body is None:
            raise UnjournalableValue(
                f"run {text_of(rec.run_id)} cannot be journaled: {why} (its entry must be "
                f"JSON-like, its text valid Unicode, its integers within 64 bits, and "
                f"encode to at most {MAX_BODY_BYTES:,} bytes)",
                run_id=text_of(rec.run_id),
                reason=why,
            )
        self._append_body(run, rec.rtype, body)

    def copy(self, run: RunState, records: Iterable[tuple[int, bytes]]) -> list[Span]:
        """Append another run's records under ``run``'s prefix (a journal fork: ``fork.py``).

        ``records``: ``(type, body)``, each body as the other run's record
        holds it, without its prefix. Returns each copy as a
        :data:`~tiffany.wal.Span` of this log (its seq, type and payload),
        which the fork's replay cursor is read from.
        """
        wal = self.wal
        if wal is None:
            raise UnjournalableValue("a journal fork needs a log to copy into", run_id=run.run_id)
        spans: list[Span] = []
        for rtype, body in records:
            payload = run.prefix + body
            seq = wal.append(rtype, payload)
            spans.append((seq, rtype, payload, 0, len(payload), ""))
        if spans:
            self._dirty = True
            self._need_sync = True  # the run is accepted once its copy is durable
        return spans

    def _append_body(self, run: RunState, rtype: int, body: bytes) -> None:
        """:meth:`append` of a record already encoded (``encode_body``)."""
        wal = self.wal
        if wal is not None:
            wal.append(rtype, run.prefix + body)
            self._dirty = True
            if rtype in _SYNC_BEFORE_EFFECT:
                self._need_sync = True

    def append_result(self, run: RunState, rec: TaskExit | RunEnd, result: Any) -> Any:
        """Append a TASK_EXIT or RUN_END holding a task's ``result``; return the value recorded.

        That is ``rec.value`` (``result`` packed), or, when the record would
        be too large or does not encode, ``result``'s stand-in
        (:func:`~tiffany.wire.values.stand_in`, its repr cut), which a replay
        compares as such. Each step's result fit a record (see :meth:`woken`),
        but a task may put several together (a plan's outputs).
        """
        body, why = _fitted(rec)
        if body is not None:
            self._append_body(run, rec.rtype, body)
            return rec.value
        value = stand_in(result)
        log.warning(
            "journal.result_cut",
            run_id=run.run_id,
            record=rec.__class__.__name__,
            reason=why,
            kept_chars=STAND_IN_CHARS,
        )
        self.append(run, msgspec.structs.replace(rec, value=value))
        return value

    def dispatch(self, run: RunState, meta: TaskMeta, task: Task, yielded: Any) -> None:
        """Record dispatch ``run.n`` of ``task``, unless the record that follows carries it."""
        # A dispatch the next record carries has no record of its own; nor
        # has a task's final return, which its TASK_EXIT carries (not the root's).
        if yielded is RETURNED:
            if not task.stack and task is not run.root:
                return
        elif carried(yielded):
            return
        kind, arg = describe(self.ltid_of, yielded)
        self.append(run, Dispatch(run.n, meta.ltid, kind, arg))

    def woken(self, meta: TaskMeta, task: Task, value: Any) -> None:
        """Record a wake-up that came from outside the run (at a wait stage).

        A value that cannot be journaled is refused (:meth:`_refuse`); an
        error whose record had to be kept (:meth:`body`: its message holds a
        lone surrogate, say) reaches the task as the record keeps it, rebuilt
        from the record as a replay rebuilds it.
        """
        if not self.in_wait:
            return
        run = meta.run
        call = task.blocked_on
        cause = call.kind if call is not None else "?"
        err = task.pending_error
        if err is not None:
            body, kept = self.body(run, Wake(run.n, meta.ltid, cause, False, pack_error(err)))
            if kept:
                wake = decode_body(RecordType.WAKE, body)
                self.sched.refuse_wake(task, unpack_error(wake.value))  # type: ignore[union-attr]
            self._append_body(run, RecordType.WAKE, body)
            return
        try:
            body = _encode_body(Wake(run.n, meta.ltid, cause, True, pack_value(value)))
        except ENCODE_ERRORS as exc:
            body = self._refuse(run, task, call, _reason(exc))
        else:
            if len(body) > MAX_BODY_BYTES:
                body = self._refuse(run, task, call, _too_large(body))
        self._append_body(run, RecordType.WAKE, body)

    def _refuse(self, run: RunState, task: Task, call: Any, why: str) -> bytes:
        """The value ``task`` was woken with cannot be recorded: it gets an error instead.

        The task raises :class:`UnjournalableValue` at its yield (a step's
        failure, which its worker reports), and the error is what the WAKE
        records, so a replay hands the task the same failure. Rejected:
        failing the journal, as for a WAL error: a value is the run's data,
        not the engine's health, and the recovered engine met the same value
        again (a restart loop taking every run on the engine with it).
        """
        name = text_of(getattr(call, "name", None) or (call.kind if call is not None else "?"))
        err = UnjournalableValue(
            f"the result of {name} cannot be journaled: {why} (a result must be JSON-like, "
            f"its text valid Unicode, its integers within 64 bits, and encode to at most "
            f"{MAX_BODY_BYTES:,} bytes)",
            step=name,
            reason=why,
        )
        self.sched.refuse_wake(task, err)
        cause = call.kind if call is not None else "?"
        return self.body(run, Wake(run.n, task.meta.ltid, cause, False, pack_error(err)))[0]

    # -- commits -------------------------------------------------------------------

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

    def sync_next(self) -> None:
        """Commit at the next commit point whatever is ready: an effect the kernel cannot hold."""
        self._sync_now = True

    def commit_point(self, timeout: float | None) -> None:
        """Group commit: make the records durable before any effect leaves.

        Commits when the loop is about to block (``timeout`` not 0), when
        the last commit is older than ``GROUP_COMMIT_MAX_S``, or when an
        effect waits for the commit (a step starts, a run starts or ends:
        ``_need_sync``) and no other task is ready. With tasks still ready,
        an effect's commit is deferred to a later pass (at most
        ``GROUP_COMMIT_MAX_S`` after the last one) and the kernel holds the
        effects until then (``hold_effects``). Only effects the kernel can
        hold are deferred (thread jobs and inline steps): a generator step
        runs as a task from the next pass, so it commits at once
        (``sync_next``).

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
        self.in_wait = True
