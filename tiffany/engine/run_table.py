"""What the engine remembers of runs: bounded, whatever history it has served.

:class:`RunTable` answers, on the scheduler thread and in O(1), the
questions the control channel asks of a run id before the store has it:
is it running, how did it end, which run did this ``Idempotency-Key``
start. It holds:

* every running run (they are in the journal's memory anyway);
* the last :data:`FINISHED_RUNS_KEPT` finished runs and their status, in
  an LRU; an older finished run is looked up in the store, which is the
  source of truth for finished runs (off the scheduler thread, see
  ``requests.py``);
* the idempotency keys of runs started within the key window
  (``TIFFANY_IDEMPOTENCY_WINDOW_S``, 24 h by default), oldest first, pruned
  as newer runs start; the checkpoint (``durable/checkpoint.py``) carries
  them across restarts. A key repeated within its window answers the same
  run (or 409 for another body); after the window it starts a new run.

An engine that ran 100,000 runs holds the running ones, 10,000 statuses and
the keys of one window: not 100,000 entries.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from tiffany.durable.checkpoint import IDEMPOTENCY_WINDOW_S, KeyEntry
from tiffany.durable.history import RunIndex

__all__ = ["FINISHED_RUNS_KEPT", "RunTable"]

#: Finished runs whose status the engine keeps in memory (the newest ones).
FINISHED_RUNS_KEPT: Final = 10_000


class RunTable:
    """Running runs, recently finished ones, idempotency keys in their window.

    Args:
        finished_kept: How many finished runs to remember.
        window_s: How long an idempotency key answers its run, in seconds.
    """

    def __init__(
        self, finished_kept: int = FINISHED_RUNS_KEPT, window_s: float = IDEMPOTENCY_WINDOW_S
    ) -> None:
        self.finished_kept = finished_kept
        self.window_s = window_s
        self.running: set[str] = set()
        self.finished: OrderedDict[str, str] = OrderedDict()
        self.keys: dict[str, KeyEntry] = {}  # in start order: the oldest first

    def __len__(self) -> int:
        """How many runs it holds (running and finished)."""
        return len(self.running) + len(self.finished)

    def status(self, run_id: str) -> str | None:
        """Return ``running`` or the finished status; None when not held."""
        if run_id in self.running:
            return "running"
        return self.finished.get(run_id)

    def started(self, run_id: str, key: KeyEntry | None = None) -> None:
        """Note a run that started (and its idempotency key)."""
        self.running.add(run_id)
        if key is not None:
            self.keys.pop(key.key, None)
            self.keys[key.key] = key
            self._prune_keys(key.started_at)

    def ended(self, run_id: str, status: str) -> None:
        """Note a run's end; forget the oldest finished one beyond the bound."""
        self.running.discard(run_id)
        self.finished[run_id] = status
        self.finished.move_to_end(run_id)
        while len(self.finished) > self.finished_kept:
            self.finished.popitem(last=False)

    def key(self, key: str, now: float) -> KeyEntry | None:
        """Return the run ``key`` started, if within its window at ``now``."""
        entry = self.keys.get(key)
        if entry is None or entry.started_at < now - self.window_s:
            return None
        return entry

    def load(self, index: RunIndex) -> None:
        """Take what the start-up index knows (runs after the checkpoint, keys in their window)."""
        for info in index.runs.values():
            if info.finished:
                self.ended(info.run_id, info.status)
            else:
                self.running.add(info.run_id)
        for entry in sorted(index.keys.values(), key=lambda k: k.started_at):
            self.keys[entry.key] = entry
        self._prune_keys(index.newest_start)

    def _prune_keys(self, now: float) -> None:
        keys = self.keys
        oldest = now - self.window_s
        while keys:
            first = next(iter(keys.values()))
            if first.started_at >= oldest:
                return
            del keys[first.key]
