"""Concurrency limits: at most ``limit`` runs of a key run at once, the others queue (FIFO).

A plan's ``concurrency: {key: "${inputs.user}", limit: 2}`` is resolved at
submission into its run's entry (``{"key": "alice", "limit": 2}``). Such a
run's planner first waits for the signal ``concurrency.slot``
(``tiffany/agents/planner.py``): this module sends it, on the engine's loop,
to each run as a slot of its key frees up, oldest run first. The slot is a
journaled signal like any other, so a replay reproduces exactly when the run
started its work, and a kill -9 loses no place in the queue:

* a run holds a slot from the moment its slot signal is requested until it
  ends (any way: cancelled while queued included);
* at start-up the engine reads which recovered runs had their slot signal
  journaled (they hold slots again) and queues the others by their RUN_START
  seq, then fills the free slots.

Until the slot comes the run is ``pending`` in the store (the projector
reads the entry's ``concurrency``), and ``running`` from its slot signal on.

Gaps (documented in docs/engines.md): a limit holds per engine; with several
engines (``serve --engines N``) each admits up to ``limit`` runs of a key.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from tiffany.agents.refs import resolve
from tiffany.wire.entries import Entry, RunConcurrency
from tiffany.wire.plan import ConcurrencySpec
from tiffany.wire.records import SLOT_SIGNAL

__all__ = ["SLOT_SIGNAL", "Slots", "entry_concurrency", "spec_of"]

log = structlog.get_logger("tiffany.engine")

#: ``request(run_id, signal_id)``: journal the slot signal for a run (on the loop).
Request = Callable[[str, dict[str, Any], str], bool]


def entry_concurrency(spec: ConcurrencySpec, values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``concurrency`` field of a new run's entry: ``spec``'s key resolved now.

    One rule for a plan and a workflow: ``values`` are the run's inputs over
    their defaults (a plan's ``inputs``, a function's parameters').

    Raises:
        RefError: The key references what ``values`` lack.
    """
    key = resolve(spec.key, values, {})
    return {"key": str(key), "limit": spec.limit}


def spec_of(entry: Entry) -> tuple[str, int] | None:
    """The ``(key, limit)`` a plan or workflow run's entry holds, or None (no limit)."""
    spec: RunConcurrency | None = getattr(entry, "concurrency", None)
    if spec is None or spec.limit < 1:
        return None
    return spec.key, spec.limit


@dataclass(slots=True)
class _Key:
    holders: set[str] = field(default_factory=set)
    queue: deque[tuple[str, int]] = field(default_factory=deque)  # (run id, limit)


class Slots:
    """The slots of every key, on the engine's loop only.

    Args:
        request: Journals the slot signal for a run (the journal's
            ``request_signal``, bound); False if the run has ended.
    """

    def __init__(self, request: Request) -> None:
        self._request = request
        self._keys: dict[str, _Key] = {}
        self._of_run: dict[str, str] = {}  # run id -> key (queued or holding)

    def admit(self, run_id: str, key: str, limit: int) -> bool:
        """A new (or recovered, not yet admitted) run: give it a slot, or queue it.

        Returns True if it got a slot now.
        """
        state = self._keys.setdefault(key, _Key())
        self._of_run[run_id] = key
        if len(state.holders) < limit and not state.queue:
            return self._give(state, run_id, key, limit)
        state.queue.append((run_id, limit))
        log.info("run.queued", run_id=run_id, key=key, limit=limit, ahead=len(state.queue) - 1)
        return False

    def holding(self, run_id: str, key: str) -> None:
        """A recovered run whose slot signal is in its journal: it holds its slot again."""
        self._keys.setdefault(key, _Key()).holders.add(run_id)
        self._of_run[run_id] = key

    def release(self, run_id: str) -> None:
        """A run ended: free its slot (or its place in the queue) and admit the next."""
        key = self._of_run.pop(run_id, None)
        if key is None:
            return
        state = self._keys[key]
        state.holders.discard(run_id)
        self._fill(state, key)
        if not state.holders and not state.queue:
            del self._keys[key]

    def recover(self, runs: Iterable[tuple[str, str, int, bool]]) -> None:
        """Rebuild from the recovered runs: ``(run id, key, limit, has its slot)``.

        Runs come in RUN_START order: those without a slot queue in it.
        """
        waiting = []
        for run_id, key, limit, holds in runs:
            if holds:
                self.holding(run_id, key)
            else:
                waiting.append((run_id, key, limit))
        for run_id, key, limit in waiting:
            state = self._keys.setdefault(key, _Key())
            self._of_run[run_id] = key
            state.queue.append((run_id, limit))
        for key, state in list(self._keys.items()):
            self._fill(state, key)

    def status(self) -> dict[str, Any]:
        """Per key: how many runs hold a slot and how many wait (the engine's status)."""
        keys = list(self._keys.items())  # any thread: one atomic copy of the loop's dict
        return {k: {"running": len(s.holders), "queued": len(s.queue)} for k, s in sorted(keys)}

    def _fill(self, state: _Key, key: str) -> None:
        while state.queue:
            run_id, limit = state.queue[0]
            if run_id not in self._of_run:  # ended while queued (cancelled)
                state.queue.popleft()
                continue
            if len(state.holders) >= limit:
                return
            state.queue.popleft()
            self._give(state, run_id, key, limit)

    def _give(self, state: _Key, run_id: str, key: str, limit: int) -> bool:
        payload = {"key": key, "limit": limit}
        if not self._request(run_id, payload, f"{SLOT_SIGNAL}:{run_id}"):
            self._of_run.pop(run_id, None)  # the run ended before its slot came
            return False
        state.holders.add(run_id)
        return True
