"""The durable runtime: a scheduler, a WAL and a journal, wired together.

:class:`Runtime` is what an engine (or a test, or ``tiffany replay``) uses:

* ``submit(target, *args)`` starts a run whose root task is an importable
  generator function (``module:qualname``) called with JSON-able arguments,
  so that the run can be re-created from its first record;
* ``recover()`` replays every run the WAL shows unfinished and lets each go
  live where its journal ends;
* ``run()`` drives the scheduler until no task is left.

:func:`verify` replays a finished run in a scheduler of its own, with no
WAL, and reports whether it replayed identically (``tiffany replay
--verify``). Nothing is written and no step runs: the replay must reach the
run's recorded end on recorded outcomes alone.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Final, cast

import structlog

from tiffany.durable.checkpoint import (
    IDEMPOTENCY_WINDOW_S,
    Checkpoint,
    CheckpointStore,
    read_checkpoint,
)
from tiffany.durable.dispatch import describe
from tiffany.durable.history import (
    Loaded,
    RunIndex,
    RunInfo,
    checkpoint_of,
    load_run,
    read_runs,
)
from tiffany.durable.journal import JournalInstrument, RunState, TaskMeta
from tiffany.durable.replayer import JournalEnded, ReplayCursor, call_site
from tiffany.errors import (
    InstrumentFailure,
    KernelInternalError,
    NondeterminismError,
    TiffanyError,
)
from tiffany.kernel import Clock, Instrument, Scheduler, Task
from tiffany.wal import FsyncPolicy, Log, Source, Wal
from tiffany.wal.segments import history_start
from tiffany.wal.state import lease_clock
from tiffany.wire.entries import CallableEntry, Entry, EntryKind, read_entry
from tiffany.wire.records import JOURNAL_COMPAT

__all__ = [
    "EntryError",
    "JournalTooNew",
    "Resolver",
    "Runtime",
    "VerifyReport",
    "resolve_callable",
    "verify",
    "verify_loaded",
]

log = structlog.get_logger("tiffany.durable")

#: Builds a run's root coroutine from the entry recorded in RUN_START (read
#: once: ``tiffany/wire/entries.py``), the run id and the journal-compatibility
#: version the run started under (its code keeps the dispatch sequence of that
#: version: docs/wal-format.md, "Versions"). The runtime keeps one per
#: ``runner``: ``callable``, and ``workflow`` (plan runs too: a plan run is the
#: built-in workflow ``plan``).
Resolver = Callable[[Entry, str, int], Generator[Any, Any, Any]]


class JournalTooNew(TiffanyError):
    """A run started under a journal version newer than this code replays."""

    code = "run.journal_too_new"


class EntryError(TiffanyError):
    """A run's entry point cannot be resolved (not importable, not a generator)."""

    code = "run.entry"


def callable_entry(
    target: str | Callable[..., Any], args: Iterable[Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Return the RUN_START entry for an importable generator function."""
    if not isinstance(target, str):
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", None)
        if not module or not qualname or "<locals>" in qualname:
            raise EntryError(
                f"{target!r} is not importable by name; a durable run needs module:qualname",
                target=repr(target),
            )
        target = f"{module}:{qualname}"
    return {"kind": "callable", "target": target, "args": list(args), "kwargs": dict(kwargs)}


def resolve_callable(
    entry: Entry | Mapping[str, Any], run_id: str = "", compat: int = JOURNAL_COMPAT
) -> Generator[Any, Any, Any]:
    """Import the entry's ``target`` and call it with the recorded arguments.

    (A callable's dispatch sequence is its own code's: ``compat`` changes nothing.)
    """
    typed = read_entry(entry)
    if not isinstance(typed, CallableEntry):
        raise EntryError(f"a {typed.kind} run's entry is not a callable's", kind=typed.kind.value)
    target = typed.target
    module_name, _, qualname = target.partition(":")
    if not module_name or not qualname:
        raise EntryError(f"entry target {target!r} is not module:qualname", target=target)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise EntryError(f"cannot import {target!r}: {exc}", target=target) from exc
    coro = obj(*typed.args, **typed.kwargs)
    if not isinstance(coro, Generator):
        raise EntryError(f"{target} did not return a generator", target=target)
    return coro


@dataclass(slots=True)
class VerifyReport:
    """What ``verify`` found."""

    run_id: str
    ok: bool
    status: str
    dispatches: int
    records: int
    divergence: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    #: The run had not finished: the replay checked its journal up to where it ends.
    partial: bool = False
    #: Where the user's code made each workflow call and step the replay
    #: reproduced (:func:`~tiffany.durable.replayer.call_site`), the first
    #: :data:`MAX_CALL_SITES`: ``{"dispatch", "task", "call", "source"}``.
    calls: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-able data."""
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "status": self.status,
            "dispatches": self.dispatches,
            "records": self.records,
            "divergence": self.divergence,
            "problems": self.problems,
            "partial": self.partial,
            "calls": self.calls,
        }


#: The most call sites a verify report lists (a run of a million steps lists its first ones).
MAX_CALL_SITES: Final = 1000


class _CallSites(Instrument):
    """Collect where a replayed workflow's code made its calls and steps (a verify's report).

    Source lines are not journaled (a line is not part of what a replay
    compares): a replay against the code as it is now is where they come
    from for a finished run. Only tasks of role ``task`` (a workflow's
    function and the tasks it spawned) pay for the walk of their frames.
    """

    def __init__(
        self, out: list[dict[str, Any]], ltid_of: Callable[[int], int | None], sched: Scheduler
    ) -> None:
        self.out = out
        self.ltid_of = ltid_of
        self.sched = sched

    def after_dispatch(self, task: Task, yielded: Any) -> None:
        meta = task.meta
        if not isinstance(meta, TaskMeta) or meta.label.role != "task":
            return
        if len(self.out) >= MAX_CALL_SITES:
            self.sched.remove_instrument(self)  # the rest of the replay pays nothing
            return
        source = call_site(task, yielded)
        if source is not None:
            kind, arg = describe(self.ltid_of, yielded)
            call = f"{kind} {arg}" if arg is not None else kind
            self.out.append(
                {"dispatch": meta.run.n, "task": meta.ltid, "call": call, "source": source}
            )


class Runtime:
    """A scheduler whose runs are journaled into a WAL under ``data_dir``.

    Args:
        data_dir: Where the WAL lives (``data_dir/wal``).
        fsync: The WAL's fsync policy.
        clock: The scheduler's clock.
        seed: The scheduler's random seed.
        instruments: More observers (activity log, watchdog...).
        resolvers: Runners besides ``callable``, by name (the engine adds
            ``workflow``, which resolves plan runs too).
        segment_size_bytes: The WAL's rotation size (tests shrink it).
        key_window_s: How long idempotency keys are remembered (checkpoint.py).
        log: An open log to journal into instead of the WAL under ``data_dir``
            (a PostgreSQL stream, ``tiffany.wal.pg``, which keeps its
            checkpoints itself: a :class:`CheckpointStore`); the runtime closes it.
        seqs: The WAL's first seq and the bound its seqs stay below (None:
            none): an engine's range (``tiffany/wire/shards.py``).
        preallocate: Zero-fill the WAL's next segment ahead
            (``Wal.open``'s, docs/wal-format.md "Preallocation").
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        fsync: FsyncPolicy | str = FsyncPolicy.BATCH,
        clock: Clock | None = None,
        seed: int = 0,
        instruments: Iterable[Instrument] = (),
        resolvers: dict[str, Resolver] | None = None,
        segment_size_bytes: int | None = None,
        key_window_s: float = IDEMPOTENCY_WINDOW_S,
        log: Log | None = None,
        seqs: tuple[int, int | None] = (1, None),
        preallocate: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.wal_dir = self.data_dir / "wal"
        if log is None:
            policy = fsync if isinstance(fsync, FsyncPolicy) else FsyncPolicy(fsync)
            kwargs: dict[str, Any] = {}
            if segment_size_bytes is not None:
                kwargs["segment_size_bytes"] = segment_size_bytes
            log = Wal.open(
                self.wal_dir,
                fsync=policy,
                first_seq=seqs[0],
                limit_seq=seqs[1],
                preallocate=preallocate,
                **kwargs,
            )
        self.wal: Log = log
        #: Where readers find this runtime's log: the WAL directory, or the log itself.
        self.source: Source = self.wal_dir if isinstance(log, Wal) else log
        self.sched = Scheduler(clock=clock, seed=seed, instruments=instruments)
        # Fail-stop starts nothing: the moment the log cannot write (disk
        # full, fenced), the scheduler starts no effect and stops.
        self.wal.on_failed = self.sched.stop
        if self.wal.lease_deadline is not None:  # a leased stream (PostgreSQL)
            self.sched.gate_effects(self._lease_held)
            self.wal.on_renewed = self.sched.reopen_effects
        self.journal = JournalInstrument(self.wal, self.sched)
        #: The newest usable checkpoint (docs/wal-format.md): a start reads the WAL after it.
        self.checkpoint: Checkpoint | None = read_checkpoint(
            self.wal_dir if isinstance(log, Wal) else cast(CheckpointStore, log), log.durable_seq
        )
        # One pass over the log: the index, and where the unfinished runs'
        # records are (recover() decodes them; a first submit lets them go).
        self._unfinished: Loaded | None = _read_opened(
            self.source,
            self.checkpoint,
            seqs[0],
            log.durable_seq,
            log.checked,
            # A preallocated live segment's zero fill is not read again.
            log.durable_ends() if isinstance(log, Wal) else None,
        )
        #: The log as this open found it, as a checkpoint at its last seq.
        self.opened = checkpoint_of(self._unfinished.index, key_window_s)
        # Run numbers are unique per data dir, whoever starts the run (a CLI
        # run, a server, recovery): new runs are numbered above the WAL's.
        self.journal.reserve_run_no(self.opened.max_run_no)
        self.resolvers: dict[str, Resolver] = _runners(resolvers)
        self.index: RunIndex | None = None
        self._closing: list[Callable[[], None]] = []
        #: Unfinished runs recovery left alone: a newer engine started them.
        self.too_new: list[JournalTooNew] = []
        #: Unfinished runs recovery left alone: their entry does not resolve here
        #: (a workflow whose module was not imported).
        self.unresolved: list[str] = []

    # -- runs ----------------------------------------------------------------

    def _lease_held(self) -> bool:
        """True while the log's lease is surely held (a thread job may start)."""
        deadline = self.wal.lease_deadline
        return deadline is None or lease_clock() < deadline

    def submit(
        self,
        target: str | Callable[..., Any],
        *args: Any,
        run_id: str | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Start a run of an importable generator function; return its id."""
        entry = callable_entry(target, args, kwargs)
        return self.submit_entry(entry, run_id=run_id, name=name or entry["target"])

    def submit_entry(
        self,
        entry: dict[str, Any],
        *,
        run_id: str | None = None,
        name: str | None = None,
        on_end: Callable[[RunState], None] | None = None,
        fork: Iterable[tuple[int, bytes]] | None = None,
        compat: int = JOURNAL_COMPAT,
    ) -> str:
        """Start a run from an entry record (``{"kind": ..., ...}``).

        ``fork``: the run's journal begins with these records of another run
        (a prefix of it: ``fork.py``), which it replays before it goes live;
        ``compat`` is that run's journal version.
        """
        run_id = run_id or f"run-{uuid.uuid4().hex[:12]}"
        self._unfinished = None  # recover() reads the log again if it comes later
        typed = read_entry(entry)
        coro = self._resolve(typed, run_id, compat)
        self.journal.start_run(
            run_id,
            name or typed.kind.value,
            entry,
            coro,
            on_end=on_end,
            fork=fork,
            compat=compat,
        )
        return run_id

    def recover(self, only: Iterable[str] | None = None) -> list[str]:
        """Replay unfinished runs from the WAL; each goes live where its journal ends.

        Without ``only``, reads only the records of the runs unfinished when
        the WAL was opened (``self.opened``, from their first seq on): the
        index is then partial (see ``history.load_many``); with it, the whole
        WAL, so that a run that ended long ago is told apart from an unknown one.
        """
        wanted = set(only) if only is not None else None
        loaded, self._unfinished = self._unfinished, None
        if loaded is None or wanted is not None:
            base = self.opened if wanted is None else None
            until = self.opened.seq if base is not None else None  # the log as opened
            loaded = read_runs(self.source, wanted, unfinished_only=True, base=base, until=until)
        index, cursors = loaded.index, loaded.cursors()
        self.index = index
        self.too_new = []
        self.unresolved = []
        self.journal.reserve_run_no(index.max_run_no)
        resumed = []
        for run_id, cursor in cursors.items():
            info = index.get(run_id)
            if info.compat > JOURNAL_COMPAT:
                # Started by a newer engine (a downgrade): left as it is, for that engine.
                err = JournalTooNew(
                    f"run {run_id} started under journal version {info.compat}; this "
                    f"engine replays up to {JOURNAL_COMPAT}: upgrade to resume it",
                    run_id=run_id,
                    compat=info.compat,
                )
                log.error("recovery.too_new", **err.fields)
                self.too_new.append(err)
                continue
            try:
                coro = self._resolve(info.entry, info.run_id, info.compat)
            except TiffanyError as exc:
                if wanted is not None:  # asked for by name: say why it cannot resume
                    raise
                # Its code is not here (a workflow whose module this engine did
                # not import): left unfinished, for an engine that has it.
                log.error("recovery.unresolved", run_id=info.run_id, error=str(exc))
                self.unresolved.append(info.run_id)
                continue
            self.journal.start_run(
                info.run_id,
                info.name,
                info.entry,
                coro,
                run_no=info.run_no,
                replay=cursor,
                compat=info.compat,
            )
            resumed.append(info.run_id)
        if wanted is not None:
            for run_id in wanted - set(resumed):
                index.get(run_id)  # raises UnknownRun for a bad id
            for err in self.too_new:
                raise err
        if resumed:
            log.info("recovery.started", runs=len(resumed))
        return resumed

    def run(self) -> None:
        """Run the scheduler until no task is left or it is stopped.

        Raises:
            WalFailedError: The log failed (fail-stop) and stopped the loop.
            NondeterminismError: A run's replay diverged.
            InstrumentFailure: Another critical instrument failed.
        """
        try:
            self.sched.run()
        except InstrumentFailure as exc:
            if isinstance(exc.__cause__, NondeterminismError):
                raise exc.__cause__ from None
            raise
        if self.wal.failed:  # it stopped the loop (on_failed) before a commit point saw it
            self.wal.commit()  # a failed log refuses: raises its WalFailedError

    def status(self, run_id: str) -> RunState:
        """Return the journal's state of a run started or recovered here."""
        return self.journal.runs[run_id]

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` as the runtime closes, after its threads' jobs and the WAL.

        For what the engine opened beside the runtime and its tools use from
        the thread pool (the MemoryStore: ``tiffany/engine/memory.py``). A
        callback that raises is logged; the others still run.
        """
        self._closing.append(callback)

    def close(self) -> None:
        """Stop the scheduler's helpers, close the WAL (committing it), then :meth:`on_close`'s."""
        try:
            self.sched.close()
        finally:
            try:
                self.wal.close()
            finally:
                closing, self._closing = self._closing, []
                for callback in closing:
                    try:
                        callback()
                    except Exception as exc:  # noqa: BLE001 - logged; the rest still close
                        log.warning("runtime.close_callback_failed", error=repr(exc))

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------

    def _resolve(
        self, entry: Entry | dict[str, Any], run_id: str, compat: int
    ) -> Generator[Any, Any, Any]:
        typed = read_entry(entry)
        resolver = self.resolvers.get(typed.runner)
        if resolver is None:
            raise EntryError(
                f"no resolver for {typed.kind} runs here ({typed.runner!r})", kind=typed.kind.value
            )
        return resolver(typed, run_id, compat)


def _runners(resolvers: Mapping[str, Resolver] | None) -> dict[str, Resolver]:
    """The runtime's resolvers by runner: ``callable``'s, and those given.

    Raises:
        ValueError: A resolver keyed ``plan``: plan runs are the ``workflow``
            resolver's (a plan run is the built-in workflow ``plan``).
    """
    given = dict(resolvers or {})
    if EntryKind.PLAN.value in given:
        raise ValueError(
            "a plan run is the built-in workflow 'plan': give the workflow resolver "
            "(tiffany.workflows.workflow_resolver), keyed 'workflow'"
        )
    return {EntryKind.CALLABLE.value: resolve_callable, **given}


def _read_opened(
    wal_dir: Source,
    base: Checkpoint | None,
    first_seq: int,
    last_seq: int,
    checked: Mapping[str, int],
    ends: Mapping[str, int] | None = None,
) -> Loaded:
    """Read the log as opened: ``base`` advanced over the records after it, unfinished runs kept.

    ``first_seq``: the seq the log numbers its first record with (1; engine
    ``i``'s: ``seq_base(i) + 1``, tiffany/wire/shards.py). Without a checkpoint
    the read starts from an empty one just before the first record on disk,
    so the log as opened is a checkpoint at a seq of this log even when it
    holds no record (engine 1's empty journal is at ``seq_base(1)``, not 0).

    Discussion: one pass, over the records after the checkpoint and those of
    the runs it lists as unfinished (or over the whole history, archive
    included, when there is none). The index it builds numbers new runs
    above every run in the log: without it every ``tiffany run`` numbered
    its run 1 (the journal counts from 1 unless recovery scanned the WAL),
    and the store refused the second one. The unfinished runs' records are
    found in the same pass, so recovery reads nothing again (a 1 M-record
    run was read twice). When retention deleted segments and no checkpoint
    is usable, the run numbers in the deleted segments are unknown: that is
    logged loudly (keep the checkpoints, or use ``archive``).
    """
    if base is None:
        start = first_seq
        if isinstance(wal_dir, str | PathLike):  # a file WAL: what retention left on disk
            start = max(start, history_start(Path(str(wal_dir))))
        if start > first_seq:
            log.error(
                "checkpoint.missing",
                wal=str(wal_dir),
                first_seq=start,
                note="segments were deleted and no checkpoint checks out: run numbers are "
                "reserved above those still on disk only",
            )
        base = Checkpoint(start - 1, 0)
    return read_runs(
        wal_dir, None, unfinished_only=True, base=base, until=last_seq, checked=checked, ends=ends
    )


def verify(
    data_dir: str | Path,
    run_id: str,
    resolvers: dict[str, Resolver] | None = None,
    *,
    log: Source | None = None,
) -> VerifyReport:
    """Replay finished run ``run_id`` without side effects; report divergences.

    The run is read from ``data_dir``'s WAL, or from ``log`` when given (a
    PostgreSQL stream).
    """
    wal_dir = log if log is not None else Path(data_dir) / "wal"
    info, cursor = load_run(wal_dir, run_id)
    return verify_loaded(info, cursor, resolvers)


def verify_loaded(
    info: RunInfo,
    cursor: ReplayCursor,
    resolvers: dict[str, Resolver] | None = None,
    *,
    unfinished: bool = False,
) -> VerifyReport:
    """:func:`verify` of a run read already: many runs read in one pass (``load_many``).

    Reading one run is a pass over the log from its start, so verifying
    every run of a log one by one reads the log once per run; ``load_many``
    reads the cursors of a batch of runs in one pass.

    ``unfinished``: a run whose end is not in its journal is checked up to
    where its journal ends (an export of a run in flight: the code must
    reproduce every recorded dispatch; what it does after them is not
    known yet), and the report says ``partial``. Without it such a run is
    refused (resume it instead).
    """
    run_id = info.run_id
    report = VerifyReport(run_id, False, info.status, len(cursor.dispatches), info.records)
    if not info.finished and not unfinished:
        report.problems.append("the run has not finished; resume it with `tiffany replay RUN_ID`")
        return report
    report.partial = not info.finished
    try:
        entry = read_entry(info.entry)
    except TiffanyError as exc:
        report.problems.append(exc.message)
        return report
    resolver = _runners(resolvers).get(entry.runner)
    if resolver is None:
        report.problems.append(f"no resolver for {entry.kind} runs ({entry.runner!r})")
        return report
    if info.compat > JOURNAL_COMPAT:
        report.problems.append(
            f"journal version {info.compat} is newer than this code's ({JOURNAL_COMPAT})"
        )
        return report
    try:
        root = resolver(entry, info.run_id, info.compat)
    except TiffanyError as exc:  # its code is not here (a workflow whose module is not imported)
        report.problems.append(exc.message)
        return report
    with Scheduler() as sched:
        journal = JournalInstrument(None, sched, allow_live=False)
        if entry.kind is EntryKind.WORKFLOW:  # after the journal: its dispatch counted
            sched.add_instrument(_CallSites(report.calls, journal.ltid_of, sched))
        run = journal.start_run(
            info.run_id,
            info.name,
            info.entry,
            root,
            run_no=info.run_no,
            replay=cursor,
            compat=info.compat,
        )
        try:
            sched.run()
        except (InstrumentFailure, KernelInternalError, NondeterminismError) as exc:
            # A dispatch's check fails in the journal's hook (an instrument),
            # an outcome's (``Now()`` past the journal's end) in its handler,
            # the end of the journal at a wait stage in its injector (raised as is).
            cause = exc if isinstance(exc, NondeterminismError) else exc.__cause__
            if isinstance(cause, JournalEnded) and report.partial:
                report.ok = True  # every recorded dispatch reproduced; the rest is to come
                return report
            if isinstance(cause, NondeterminismError):
                report.divergence = cause.to_dict()
                return report
            raise
    if report.partial:
        # The code ended the run where its journal stops (the end was not written yet).
        report.ok = not (cursor.index < len(cursor.dispatches) or cursor.wakes)
        if not report.ok:
            report.problems.append("the run ended before its journal did")
        return report
    if run.status != info.status:
        report.problems.append(f"replay ended {run.status}, the journal says {info.status}")
    if cursor.index < len(cursor.dispatches):
        left = len(cursor.dispatches) - cursor.index
        report.problems.append(f"{left} journaled dispatches were not replayed")
    if cursor.wakes:
        report.problems.append(f"{len(cursor.wakes)} journaled wake-ups were not replayed")
    report.ok = not report.problems
    return report
