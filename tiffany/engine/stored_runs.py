"""What the engine reads of the store: the runs it no longer holds (control threads only).

The engine keeps the newest finished runs (``run_table.py``); the store
(the projection of the journal, in SQL) is the source of truth for older
ones. :class:`StoredRuns` answers the control requests' questions about
them: a finished run's status, a signal's first delivery (a signal sent
again to a run that has since finished), and a re-run's source (its plan,
inputs and the outputs it reuses, those read from the journals).

Invariants:

- SQL runs only on control threads: never on the loop, never on a
  connection's thread (``requests.py``'s :func:`~tiffany.engine.requests.quick`
  names none of these reads).
- Before a read that must see what the journal holds (a re-run's source,
  a signal's first delivery), the store is let catch up with it, for a
  bounded wait.
- The store's SQLAlchemy engine is made on first use and let go by
  :meth:`StoredRuns.close`, at the engine's stop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

from tiffany.agents import PlanError
from tiffany.config import Settings
from tiffany.engine.inbox import DurableWaits
from tiffany.errors import EngineNotReady, InvalidCommand, RunNotFinished, RunNotFound
from tiffany.wire.control import Rerun
from tiffany.wire.entries import MalformedEntry, PlanEntry, WorkflowEntry, read_entry
from tiffany.wire.shards import engine_of
from tiffany.wire.status import TERMINAL

if TYPE_CHECKING:
    from tiffany.projector.link import ProjectorLink

__all__ = ["RERUN_SOURCE_WAIT_S", "SIGNAL_LOOKUP_WAIT_S", "RerunSource", "StoredRuns"]

log = structlog.get_logger(__name__)

#: How long a signal sent again to a finished run waits for the store to hold
#: the run's end before its first delivery is looked up there, in seconds.
SIGNAL_LOOKUP_WAIT_S: Final = 5.0
#: How long a re-run waits for the store to hold what the journal has
#: written (the earlier run's end) before it reads the run there, in seconds.
RERUN_SOURCE_WAIT_S: Final = 5.0


#: What a workflow's fork keeps of the earlier run's entry: what its replay reads.
_FORK_KEEPS: Final = frozenset({"kind", "workflow", "inputs", "concurrency", "budget"})
_ABSENT: Final = object()


@dataclass(slots=True)
class RerunSource:
    """What a re-run starts: a plan (with the outputs it reuses) or a workflow's fork.

    ``rerun``: the entry's ``rerun_of`` and ``reuse`` (a plan), or
    ``rerun_of`` and ``entry``, the earlier run's entry fields a fork keeps
    (a workflow). ``fork``: the records the workflow's new run begins with
    (``tiffany/durable/fork.py``), ``compat`` their journal version.
    """

    plan: Any
    inputs: dict[str, Any]
    rerun: dict[str, Any]
    workflow: str | None = None
    fork: list[tuple[int, bytes]] | None = None
    compat: int | None = None
    #: The earlier run's id, number, name, entry, first seq and journal
    #: version, and the copy with its seqs (``(seq, type, body)``): what
    #: the copy's replay check reads (``verifier.py``, ``verify_fork``).
    head: dict[str, Any] | None = None
    copied: list[tuple[int, int, bytes]] | None = None


class StoredRuns:
    """The store's answers about runs the engine no longer holds (control threads only).

    Args:
        settings: The engine's settings (its database URL, its journals).
        runtime: The engine's runtime (the WAL's next seq: what is written).
        durable: The waits for the WAL to be durable (the seq durable now).
        projector: The projector process (how far the store has caught up).
    """

    def __init__(
        self, settings: Settings, runtime: Any, durable: DurableWaits, projector: ProjectorLink
    ) -> None:
        self.settings = settings
        self.runtime = runtime
        self.durable = durable
        self.projector = projector
        self._store: Any = None  # the store's SQLAlchemy engine, made on first use
        self._store_lock = threading.Lock()

    def close(self) -> None:
        """Let the store's connections go (at the engine's stop, after the loop)."""
        if self._store is not None:
            self._store.dispose()

    def status(self, run_id: str) -> str | None:
        """The store's status of a run the engine no longer holds (control threads only).

        The engine keeps the newest finished runs (``run_table.py``); the
        store is the source of truth for older ones. Never on the loop: SQL.
        """
        from tiffany.store import queries, session_factory

        with session_factory(self._engine())() as session:
            run = queries.get_run(session, run_id)
            return None if run is None else str(run.status)

    def _engine(self) -> Any:
        """The store's SQLAlchemy engine, made on first use (control threads only)."""
        from tiffany.store import make_engine

        with self._store_lock:
            if self._store is None:
                self._store = make_engine(self.settings.database_url)
            return self._store

    def signal_sent(self, run_id: str, signal_id: str) -> tuple[int, str] | None:
        """A finished run's signal ``signal_id``: ``(seq, name)`` from the store, or None.

        Control threads only (SQL). The store is first let catch up with what
        is durable now (the run's end, and so the signal before it), for
        :data:`SIGNAL_LOOKUP_WAIT_S` at most.
        """
        from tiffany.store import session_factory
        from tiffany.store.journal import signal_record

        self.projector.when_projected(self.durable.seq, SIGNAL_LOOKUP_WAIT_S).result()
        with session_factory(self._engine())() as session:
            return signal_record(session, run_id, signal_id)

    def rerun_source(self, command: Rerun) -> RerunSource:
        """A re-run's plan, inputs and reuse (``tiffany/agents/rerun.py``), from the store.

        Control threads only (SQL). The earlier run must be finished and in
        the store; ``inputs`` given here override its inputs. A workflow
        run's re-run is a fork of its journal instead (:meth:`_workflow_fork`).
        """
        from tiffany.agents.rerun import journal_reuse, rerun_reuse
        from tiffany.store import queries, session_factory

        source_id, from_step, inputs = command.rerun_of, command.from_step, command.inputs
        if not source_id:
            raise InvalidCommand("rerun_of must be a run id", field="rerun_of")
        # The store is let catch up with what the journal has written first: a
        # run whose end was just on the feed (`tiffany tail`, the dashboard) is
        # finished there too, not "not found" or "not finished" for a few ms.
        written = self.runtime.wal.next_seq - 1
        caught = self.projector.when_projected(written, RERUN_SOURCE_WAIT_S).result()
        if not caught["reached"]:
            raise EngineNotReady(
                f"the store is at seq {caught['last_seq']} and did not reach seq {written} "
                f"within {RERUN_SOURCE_WAIT_S:g} s; retry",
                detail={"min_seq": written, "store_seq": caught["last_seq"]},
            )
        with session_factory(self._engine())() as session:
            source = queries.rerun_source(session, source_id)
        if source is None:
            raise RunNotFound(f"no run {source_id!r}")
        status, entry = source["status"], source["entry"]
        if status not in TERMINAL:
            raise RunNotFinished(
                f"run {source_id} has not finished ({status}); re-run a finished run",
                detail={"status": status},
            )
        try:
            typed = read_entry(entry)
        except MalformedEntry as exc:
            raise InvalidCommand(f"run {source_id}: {exc.message}", field="rerun_of") from None
        # The one twin left of the two kinds: a plan's re-run reuses its steps'
        # outputs by step id (a journal that stands alone); a workflow's forks
        # its journal (its calls have no ids a new run could settle by).
        if isinstance(typed, WorkflowEntry):
            return self._workflow_fork(source_id, source, typed, command)
        if not isinstance(typed, PlanEntry):
            raise InvalidCommand(
                f"run {source_id} is neither a plan run nor a workflow run", field="rerun_of"
            )
        try:
            reuse, restart = rerun_reuse(source["after"], source["steps"], from_step, source_id)
        except PlanError as exc:
            raise InvalidCommand(exc.message, field="from_step", detail=exc.errors) from None
        # The outputs themselves come from the journal, not the store's projection.
        reuse, projected = journal_reuse(reuse, self._settling_records(reuse))
        if projected:
            log.warning(
                "rerun.projected_outputs",
                run_id=source_id,
                steps=projected,
                reason="the journal no longer holds their records (TIFFANY_WAL_RETAIN)",
            )
        merged = {**typed.inputs, **inputs}
        return RerunSource(
            typed.plan,
            merged,
            {
                "rerun_of": {"run_id": source_id, "restart": restart},
                "reuse": reuse,
            },
        )

    def _workflow_fork(
        self, source_id: str, source: dict[str, Any], typed: WorkflowEntry, command: Rerun
    ) -> RerunSource:
        """A workflow run's re-run: its journal forked before the call to restart from.

        Control threads only (reads the journal). ``tiffany/workflows/rerun.py``
        says where the cut is, ``tiffany/durable/fork.py`` why it is sound.
        """
        from tiffany.durable.fork import read_run_records
        from tiffany.durable.history import UnknownRun
        from tiffany.engine import journal_source
        from tiffany.workflows.rerun import RerunRefused, fork_point

        entry = source["entry"]
        given = typed.inputs
        changed = sorted(k for k, v in command.inputs.items() if given.get(k, _ABSENT) != v)
        if changed:
            msg = (
                f"a workflow's re-run replays run {source_id}'s calls with its inputs; "
                f"submit a new run to change {', '.join(changed)}"
            )
            raise InvalidCommand(
                msg, field="inputs", detail=[{"loc": f"inputs.{changed[0]}", "msg": msg}]
            )
        start_seq = source.get("start_seq")
        if not isinstance(start_seq, int):
            raise InvalidCommand(f"run {source_id} has no start in the store", field="rerun_of")
        try:
            journal = journal_source(self.settings.for_engine(engine_of(start_seq)))
            held = read_run_records(journal, start_seq, source_id)
        except (UnknownRun, FileNotFoundError) as exc:
            msg = (
                f"the journal no longer holds run {source_id}'s records (TIFFANY_WAL_RETAIN "
                f"released them): a workflow's re-run replays them ({exc})"
            )
            raise InvalidCommand(msg, field="rerun_of") from None
        decoded = [rec for _, _, _, rec in held.records]
        try:
            cut, call = fork_point(source_id, decoded, command.from_step)
        except RerunRefused as exc:
            raise InvalidCommand(exc.message, field="from_step", detail=exc.errors) from None
        fork = held.prefix(cut)
        copied = [(seq, rtype, body) for seq, rtype, body, _ in held.records[:cut]]
        head = {
            "run_id": source_id,
            "run_no": held.run_no,
            "name": typed.workflow,
            "entry": entry,
            "start_seq": start_seq,
            "compat": held.compat,
        }
        kept = {k: v for k, v in entry.items() if k in _FORK_KEEPS}
        rerun = {
            "rerun_of": {
                "run_id": source_id,
                "restart": [call],
                # Where the copy ends in the earlier run: the first record not copied.
                "fork": {"seq": held.records[cut][0], "records": len(fork)},
            },
            "entry": kept,
        }
        return RerunSource(
            None,
            dict(given),
            rerun,
            workflow=typed.workflow,
            fork=fork,
            compat=held.compat,
            head=head,
            copied=copied,
        )

    def _settling_records(self, reuse: dict[str, dict[str, Any]]) -> dict[int, Any]:
        """The journal records that settled the reused steps, by seq (control threads only).

        A seq names the engine whose journal wrote it (``tiffany/wire/shards.py``):
        each engine's journal is read once, from its lowest wanted seq to its
        highest, archived segments included. A journal that is not there
        (an engine directory removed) reads as holding none of them.
        """
        from tiffany.durable.history import records_at
        from tiffany.engine import journal_source

        by_engine: dict[int, list[int]] = {}
        for given in reuse.values():
            seq = given.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0:
                by_engine.setdefault(engine_of(seq), []).append(seq)
        found: dict[int, Any] = {}
        for engine, seqs in sorted(by_engine.items()):
            source = journal_source(self.settings.for_engine(engine))
            try:
                found.update(records_at(source, seqs))
            except FileNotFoundError:
                continue
        return found
