"""What a run waits for: a client's signal, or an operator's tool or function.

A run that can go on only when someone acts needs attention: the store
shows it ``waiting`` (not ``running``) and lists what it waits for in
``waiting_for``. :class:`RunWaits` is the one rule, fed a run's journal
records in order: the store's projection (``fold.py``) keeps one per
unfinished run, and ``tiffany runs`` folds the WAL's unfinished runs
through it (``tiffany/cli/durable.py``).

The rule:

* A plan run is ``waiting`` when it has live steps and every one of them
  waits: a task serving the step (its worker, or its tool task) is parked
  on a client's signal (``signal.wait``), or is held by the engine
  because its tool is disabled there or its python function is not
  registered (a HOLD record: an operator must enable or install it).
* A code run (``@workflow``) is ``waiting`` when one of its live tasks
  waits so and every other live task is parked joining another task
  (``WaitTask``: it waits on those).
* Anything else is ``running``: a step sleeping (a ``sleep`` step, a
  retry's backoff), running its tool, or waiting for a sub-plan (the
  engine's own signal ``child:...``: the child run is the one that waits,
  and shows ``waiting`` itself). A run queued for its concurrency slot is
  ``pending`` (the projection's, before any step starts).

Each entry of ``waiting_for`` is one waiting task: ``{"kind": "signal",
"name": SIGNAL, "step": STEP, "task": LTID, "reason": null}``, or for a held step
``{"kind": "tool" | "function", "name": TOOL_OR_FUNCTION, "step",
"task", "reason"}`` (the HOLD's reason, what the operator reads). A code
run's entries have ``"step": null``. The list is kept while other steps
run too: ``waiting_for`` says who waits, ``status`` whether all do.

Invariants:

* Pure: no I/O, no clock; the same records give the same answer, in the
  live projection, a rebuild and the CLI.
* A client's signal goes to the oldest task parked on its name, else it
  is kept for the next one that asks (as ``tiffany/durable/journal.py``
  delivers it): a wait that takes a kept signal never parks, so it is
  never listed.

Discussion: kept signals are counted from the records, so a projector
that reloads a run's context from the rows (``RunWaits.reloaded``) no
longer knows them; a wait that then takes one is listed until its task's
next dispatch, which as a rule is in the same group commit.
Rejected: deriving the status from the step rows at each read (the runs
list's ``status=waiting`` filter and its counts would have to join the
steps of every run listed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from tiffany.wire.records import (
    MAX_ARG_CHARS,
    Dispatch,
    Hold,
    Record,
    RunEnd,
    Spawn,
    StepStart,
    TaskExit,
    Unknown,
    Wake,
    carried,
    held_for,
    reserved_signal,
)

__all__ = ["WAIT_KINDS", "RunWaits", "waits_of"]

#: What an entry of ``waiting_for`` waits for: a signal, or an operator's tool or function.
WAIT_KINDS: Final = ("signal", "tool", "function")


@dataclass(slots=True)
class RunWaits:
    """Who in one run waits for a person, folded from its records (the module docstring).

    Args:
        plan: A plan run (its live steps count), or a code run (its tasks).
        root: The role of a root SPAWN that names none (``records.root_role``).

    Attributes:
        changed: Set when what :meth:`waiting_for` or :meth:`waiting`
            answer may have changed; the reader clears it.
    """

    plan: bool
    root: str = "task"
    #: The live tasks that count: a plan's workers (-> their step), a code run's every task.
    live: dict[int, str | None] = field(default_factory=dict)
    #: The plan step each live task serves (a worker's tool task too).
    steps: dict[int, str | None] = field(default_factory=dict)
    #: A code run's tasks parked on ``WaitTask``.
    joining: set[int] = field(default_factory=set)
    #: The waiting tasks, oldest wait first: ltid -> its ``waiting_for`` entry.
    entries: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Clients' signals journaled and not received yet, by name.
    kept: dict[str, int] = field(default_factory=dict)
    changed: bool = False

    @classmethod
    def reloaded(
        cls,
        plan: bool,
        root: str,
        tasks: Iterable[tuple[int, str, str | None, str, str | None]],
        waiting_for: Any,
    ) -> RunWaits:
        """A run's waits as its rows hold them (a projector without its context).

        ``tasks``: ``(ltid, kind, step_id, state, blocked_on)`` of its
        unfinished tasks; ``waiting_for``: the run row's list (what
        :meth:`waiting_for` wrote).
        """
        waits = cls(plan, root)
        for ltid, kind, step_id, state, blocked_on in tasks:
            waits.steps[ltid] = step_id
            if not plan or kind == "worker":
                waits.live[ltid] = step_id
            if not plan and state == "blocked_join" and (blocked_on or "").startswith("wait_task"):
                waits.joining.add(ltid)
        for entry in waiting_for if isinstance(waiting_for, list) else ():
            task = entry.get("task") if isinstance(entry, Mapping) else None
            if isinstance(task, int) and task in waits.steps:
                waits.entries[task] = dict(entry)
        return waits

    # -- records ---------------------------------------------------------------------

    def apply(self, rec: Record | Unknown, implied: Dispatch | None) -> None:
        """Fold one record of the run; ``implied``: the DISPATCH it carries (``carried``)."""
        if implied is not None:
            self._dispatch(implied.ltid, implied.kind, implied.arg)
        cls = rec.__class__
        if cls is Dispatch:
            self._dispatch(rec.ltid, rec.kind, rec.arg)  # type: ignore[union-attr]
        elif cls is Spawn:
            self._spawn(rec)  # type: ignore[arg-type]
        elif cls is Wake:
            self._wake(rec)  # type: ignore[arg-type]
        elif cls is Hold:
            self._hold(rec)  # type: ignore[arg-type]
        elif cls is StepStart:
            entry = self.entries.get(rec.ltid)  # type: ignore[union-attr]
            if entry is not None and entry["kind"] != "signal":  # a held step started
                self._unlist(rec.ltid)  # type: ignore[union-attr]
        elif cls is TaskExit:
            self._exit(rec.ltid)  # type: ignore[union-attr]
        elif cls is RunEnd:
            self.changed = self.changed or bool(self.entries)
            self.live.clear()
            self.steps.clear()
            self.joining.clear()
            self.entries.clear()
            self.kept.clear()

    def _spawn(self, rec: Spawn) -> None:
        role = rec.role if rec.role is not None else self.root
        step = rec.step_id if self.plan else None
        step = None if step is None else str(step)
        self.steps[rec.ltid] = step
        if not self.plan or role == "worker":
            self.live[rec.ltid] = step
            self.changed = self.changed or bool(self.entries)

    def _dispatch(self, ltid: int, kind: str, arg: Any) -> None:
        if ltid not in self.steps:
            return
        entry = self.entries.get(ltid)
        if entry is not None and entry["kind"] == "signal":
            self._unlist(ltid)  # it runs again
        if not self.plan:
            if kind == "wait_task":
                if ltid not in self.joining:
                    self.joining.add(ltid)
                    self.changed = self.changed or bool(self.entries)
            elif ltid in self.joining:
                self.joining.discard(ltid)
                self.changed = self.changed or bool(self.entries)
        if kind != "receive" or not isinstance(arg, str) or reserved_signal(arg) is not None:
            return
        if self.kept.get(arg):  # it takes a signal kept for it: it does not park
            self.kept[arg] -= 1
            return
        step = self.steps[ltid]
        self.entries[ltid] = {
            "kind": "signal",
            "name": arg,
            "step": step,
            "task": ltid,
            "reason": None,
        }
        self.changed = True

    def _wake(self, rec: Wake) -> None:
        if rec.ltid != 0:  # the task woke (a wait's timeout, a cancel): it runs again
            entry = self.entries.get(rec.ltid)
            if entry is not None and entry["kind"] == "signal":
                self._unlist(rec.ltid)
            return
        value = rec.value
        if rec.cause != "signal" or not isinstance(value, list | tuple) or not value:
            return
        name = value[0]
        if not isinstance(name, str) or reserved_signal(name) is not None:
            return
        listed = name[:MAX_ARG_CHARS]  # as the receive's DISPATCH names it
        for ltid, entry in self.entries.items():  # the oldest wait for it takes it
            if entry["kind"] == "signal" and entry["name"] == listed:
                self._unlist(ltid)
                return
        self.kept[listed] = self.kept.get(listed, 0) + 1

    def _hold(self, rec: Hold) -> None:
        if rec.ltid not in self.steps:
            return
        kind, what = held_for(str(rec.name), str(rec.reason))
        self.entries[rec.ltid] = {
            "kind": kind,
            "name": what,
            "step": self.steps[rec.ltid],
            "task": rec.ltid,
            "reason": str(rec.reason),
        }
        self.changed = True

    def _exit(self, ltid: int) -> None:
        if self.steps.pop(ltid, ...) is ...:
            return
        if self.live.pop(ltid, ...) is not ... and self.entries:
            self.changed = True
        self.joining.discard(ltid)
        self._unlist(ltid)

    def _unlist(self, ltid: int) -> None:
        if self.entries.pop(ltid, None) is not None:
            self.changed = True

    # -- answers ---------------------------------------------------------------------

    def waiting_for(self) -> list[dict[str, Any]]:
        """The waiting tasks' entries, oldest wait first (the module docstring)."""
        return [dict(e) for e in self.entries.values()]

    def waiting(self) -> bool:
        """True when the run can go on only when someone acts (the module docstring)."""
        entries = self.entries
        if not entries or not self.live:
            return False
        if self.plan:
            waited = {e["step"] for e in entries.values()}
            return all(step in waited for step in self.live.values())
        return all(t in entries or t in self.joining for t in self.live)


def waits_of(
    plan: bool, root: str, records: Iterable[Record | Unknown], dispatches: int = 0
) -> RunWaits:
    """A run's waits after ``records`` (its records after RUN_START, in order).

    ``dispatches``: the run's dispatch count before the first of them.
    """
    waits = RunWaits(plan, root)
    n = dispatches
    for rec in records:
        implied = None if isinstance(rec, Unknown) else carried(rec, n)
        if implied is not None:
            n = implied.n
        elif isinstance(rec, Dispatch) and rec.n > n:
            n = rec.n
        waits.apply(rec, implied)
    return waits
