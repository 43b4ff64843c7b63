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
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from tiffany.durable.history import RunIndex, load_many
from tiffany.durable.journal import Journal, RunState
from tiffany.durable.records import RecordType
from tiffany.errors import InstrumentFailure, NondeterminismError, TiffanyError
from tiffany.kernel import Clock, Instrument, Scheduler
from tiffany.wal import FsyncPolicy, Wal, iter_records

__all__ = ["EntryError", "Resolver", "Runtime", "VerifyReport", "resolve_callable", "verify"]

log = structlog.get_logger("tiffany.durable")

#: Builds a run's root coroutine from the entry recorded in RUN_START and the run id.
Resolver = Callable[[dict[str, Any], str], Generator[Any, Any, Any]]


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


def resolve_callable(entry: dict[str, Any], run_id: str = "") -> Generator[Any, Any, Any]:
    """Import ``entry['target']`` and call it with the recorded arguments."""
    target = str(entry.get("target", ""))
    module_name, _, qualname = target.partition(":")
    if not module_name or not qualname:
        raise EntryError(f"entry target {target!r} is not module:qualname", target=target)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise EntryError(f"cannot import {target!r}: {exc}", target=target) from exc
    coro = obj(*entry.get("args", ()), **entry.get("kwargs", {}))
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
        }


class Runtime:
    """A scheduler whose runs are journaled into a WAL under ``data_dir``.

    Args:
        data_dir: Where the WAL lives (``data_dir/wal``).
        fsync: The WAL's fsync policy.
        clock: The scheduler's clock.
        seed: The scheduler's random seed.
        instruments: More observers (activity log, watchdog...).
        resolvers: Entry kinds besides ``callable`` (the agents layer adds ``plan``).
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
    ) -> None:
        self.data_dir = Path(data_dir)
        self.wal_dir = self.data_dir / "wal"
        policy = fsync if isinstance(fsync, FsyncPolicy) else FsyncPolicy(fsync)
        kwargs: dict[str, Any] = {}
        if segment_size_bytes is not None:
            kwargs["segment_size_bytes"] = segment_size_bytes
        self.wal = Wal.open(self.wal_dir, fsync=policy, **kwargs)
        self.sched = Scheduler(clock=clock, seed=seed, instruments=instruments)
        self.journal = Journal(self.wal, self.sched)
        # Run numbers are unique per data dir, whoever starts the run (a CLI
        # run, a server, recovery): new runs are numbered above the WAL's,
        # learnt by recover()'s scan or, without one, at the first submission.
        self._run_nos_known = False
        self.resolvers: dict[str, Resolver] = {"callable": resolve_callable, **(resolvers or {})}
        self.index: RunIndex | None = None

    # -- runs ----------------------------------------------------------------

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
    ) -> str:
        """Start a run from an entry record (``{"kind": ..., ...}``)."""
        run_id = run_id or f"run-{uuid.uuid4().hex[:12]}"
        coro = self._resolve(entry, run_id)
        if not self._run_nos_known:
            self.journal.reserve_run_no(max_run_no(self.wal_dir))
            self._run_nos_known = True
        self.journal.start_run(run_id, name or str(entry.get("kind")), entry, coro, on_end=on_end)
        return run_id

    def recover(self, only: Iterable[str] | None = None) -> list[str]:
        """Replay unfinished runs from the WAL; each goes live where its journal ends."""
        wanted = set(only) if only is not None else None
        index, cursors = load_many(self.wal_dir, wanted, unfinished_only=True)
        self.index = index
        self.journal.reserve_run_no(index.max_run_no)
        self._run_nos_known = True
        resumed = []
        for run_id, cursor in cursors.items():
            info = index.get(run_id)
            coro = self._resolve(info.entry, info.run_id)
            self.journal.start_run(
                info.run_id, info.name, info.entry, coro, run_no=info.run_no, replay=cursor
            )
            resumed.append(info.run_id)
        if wanted is not None:
            for run_id in wanted - set(resumed):
                index.get(run_id)  # raises UnknownRun for a bad id
        if resumed:
            log.info("recovery.started", runs=len(resumed))
        return resumed

    def run(self) -> None:
        """Run the scheduler until no task is left; commit the WAL."""
        try:
            self.sched.run()
        except InstrumentFailure as exc:
            if isinstance(exc.__cause__, NondeterminismError):
                raise exc.__cause__ from None
            raise

    def status(self, run_id: str) -> RunState:
        """Return the journal's state of a run started or recovered here."""
        return self.journal.runs[run_id]

    def close(self) -> None:
        """Stop the scheduler's helpers and close the WAL (committing it)."""
        try:
            self.sched.close()
        finally:
            self.wal.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------

    def _resolve(self, entry: dict[str, Any], run_id: str) -> Generator[Any, Any, Any]:
        resolver = self.resolvers.get(str(entry.get("kind")))
        if resolver is None:
            raise EntryError(f"unknown entry kind {entry.get('kind')!r}", kind=entry.get("kind"))
        return resolver(entry, run_id)


def max_run_no(wal_dir: Path) -> int:
    """Return the highest run number a RUN_START in the WAL holds (0 for none).

    Discussion: this pass reads each record's type byte and, for a
    RUN_START only, the 4-byte run number in front of its payload: nothing
    is decoded, so it costs the WAL reader's CRC pass. Without it every
    ``tiffany run`` numbered its run 1 (the journal counts from 1 unless
    recovery scanned the WAL), and the store refused the second one.

    ``Runtime`` runs it at the first submission, and only when ``recover``
    (whose scan learns the same number) did not run first: a recovering
    engine reads its WAL once.
    """
    run_start = RecordType.RUN_START
    top = 0
    for rec in iter_records(wal_dir):
        if rec.rtype == run_start:
            top = max(top, int.from_bytes(rec.payload[:4], "little"))
    return top


def verify(
    data_dir: str | Path,
    run_id: str,
    resolvers: dict[str, Resolver] | None = None,
) -> VerifyReport:
    """Replay finished run ``run_id`` without side effects; report divergences."""
    wal_dir = Path(data_dir) / "wal"
    index, cursors = load_many(wal_dir, {run_id})
    info = index.get(run_id)
    cursor = cursors[run_id]
    report = VerifyReport(run_id, False, info.status, len(cursor.dispatches), info.records)
    if not info.finished:
        report.problems.append("the run has not finished; resume it with `tiffany replay RUN_ID`")
        return report
    all_resolvers: dict[str, Resolver] = {"callable": resolve_callable, **(resolvers or {})}
    resolver = all_resolvers.get(str(info.entry.get("kind")))
    if resolver is None:
        report.problems.append(f"unknown entry kind {info.entry.get('kind')!r}")
        return report
    with Scheduler() as sched:
        journal = Journal(None, sched, allow_live=False)
        run = journal.start_run(
            info.run_id,
            info.name,
            info.entry,
            resolver(info.entry, info.run_id),
            run_no=info.run_no,
            replay=cursor,
        )
        try:
            sched.run()
        except InstrumentFailure as exc:
            cause = exc.__cause__
            if isinstance(cause, NondeterminismError):
                report.divergence = cause.to_dict()
                return report
            raise
    if run.status != info.status:
        report.problems.append(f"replay ended {run.status}, the journal says {info.status}")
    if cursor.index < len(cursor.dispatches):
        left = len(cursor.dispatches) - cursor.index
        report.problems.append(f"{left} journaled dispatches were not replayed")
    if cursor.wakes:
        report.problems.append(f"{len(cursor.wakes)} journaled wake-ups were not replayed")
    report.ok = not report.problems
    return report
