"""The live projector: the SQL store follows the WAL, off the scheduler thread.

The WAL calls :meth:`LiveProjector.on_commit` on the scheduler thread after
each group commit with the committed frames; that costs one ``deque.append``
and one ``Event.set``. The projector's own thread splits and decodes the
frames and applies them with :class:`~tiffany.store.Projector`, one
transaction per wake-up (so per group commit, or several when it lags).

Nothing is lost and memory stays bounded:

* at start, the thread first catches up from the WAL on disk (everything
  after the store's mark), then applies what the listener handed it; the
  projector's mark skips what both saw;
* when more than ``max_pending`` records wait (the database is slow or
  down), the listener stops keeping frames and the thread catches up from
  disk once it can: committed records are on disk before the listener runs,
  so the disk holds everything that was dropped;
* a failed transaction (database restarting) is retried with backoff, and
  nothing is marked applied that was not.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Final

import structlog

from tiffany.durable.records import decode
from tiffany.engine.projection import decoded_batches
from tiffany.store import Projector, make_engine
from tiffany.store.migrate import upgrade
from tiffany.wal import split_frames

__all__ = ["LiveProjector"]

log = structlog.get_logger(__name__)

#: Bytes of frames held in memory for the projector before it falls back to the disk.
MAX_PENDING_BYTES: Final = 64 * 1024 * 1024
#: Records applied per transaction at most.
BATCH_RECORDS: Final = 5_000
#: Longest wait between retries after a database error, in seconds.
MAX_BACKOFF_S: Final = 5.0


class LiveProjector:
    """Keeps the SQL store up to date with the WAL (see the module docstring).

    Args:
        database_url: The store's SQLAlchemy URL (migrated on start).
        wal_dir: The WAL directory (for catching up from disk).
        max_pending_bytes: Frames held in memory before falling back to the disk.
    """

    def __init__(
        self, database_url: str, wal_dir: Path, *, max_pending_bytes: int = MAX_PENDING_BYTES
    ) -> None:
        self.database_url = database_url
        self.wal_dir = wal_dir
        self.max_pending_bytes = max_pending_bytes
        self._pending: deque[tuple[int, bytearray]] = deque()
        self._pending_bytes = 0
        self._accepting = True
        self._behind = True  # catch up from disk first
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread: threading.Thread | None = None
        #: The last WAL sequence number applied to the store.
        self.last_seq = 0
        #: The last sequence number the WAL made durable (seen by the listener).
        self.durable_seq = 0
        self.errors = 0
        self.applied = 0

    # -- scheduler thread --------------------------------------------------------

    def hand_over(self, first_seq: int, last_seq: int, frames: bytearray) -> None:
        """Take committed records ``first_seq..last_seq`` (O(1), never blocks).

        Called by the WAL's commit listener on the scheduler thread.
        """
        self.durable_seq = last_seq
        if self._accepting:
            self._pending.append((first_seq, frames))
            self._pending_bytes += len(frames)
            if self._pending_bytes > self.max_pending_bytes:
                # Stop holding frames; the thread reads them back from disk.
                self._accepting = False
                self._behind = True
        self._idle.clear()
        self._wake.set()

    # -- lifecycle --------------------------------------------------------------------

    def migrate(self) -> bool:
        """Bring the store's schema up to date now; False (logged) if the database is down.

        The thread migrates again before projecting, so a database that comes
        up later is migrated then.
        """
        try:
            engine = make_engine(self.database_url)
            try:
                upgrade(engine)
            finally:
                engine.dispose()
        except Exception as exc:  # noqa: BLE001 - reported; the thread retries
            log.warning("projector.migrate_failed", error=repr(exc))
            return False
        return True

    def start(self) -> None:
        """Start the projector's thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tiffany-projector", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Apply what is pending (best effort within ``timeout``), then stop."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wait_idle(self, timeout: float) -> bool:
        """Wait until everything handed over so far is applied (tests, shutdown)."""
        return self._idle.wait(timeout)

    @property
    def lag_records(self) -> int:
        """Records durable in the WAL but not yet in the store (an estimate)."""
        return max(0, self.durable_seq - self.last_seq)

    # -- projector thread ---------------------------------------------------------------

    def _run(self) -> None:
        engine = None
        backoff = 0.1
        while True:
            try:
                if engine is None:
                    engine = make_engine(self.database_url)
                    upgrade(engine)
                    projector = Projector(engine)
                    self.last_seq = projector.last_seq
                self._step(projector)
                backoff = 0.1
            except Exception as exc:  # noqa: BLE001 - a database error: retry
                self.errors += 1
                log.warning("projector.failed", error=repr(exc), retry_in_s=backoff)
                if engine is not None:
                    engine.dispose()
                    engine = None
                if self._stop.wait(backoff):
                    break
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if self._stop.is_set() and not self._pending and not self._behind:
                break
            if not self._pending and not self._behind:
                self._idle.set()
                self._wake.wait(0.5)
                self._wake.clear()
        if engine is not None:
            engine.dispose()

    def _step(self, projector: Projector) -> None:
        if self._behind:
            # Accept new frames again first: whatever is committed from here
            # on reaches the deque, and everything before is on disk.
            self._pending.clear()
            self._pending_bytes = 0
            self._accepting = True
            self._behind = False
            for from_disk in decoded_batches(self.wal_dir, BATCH_RECORDS, self.last_seq + 1):
                self._apply(projector, from_disk)
        batch: list[tuple[int, int, int, list[Any]]] = []
        pending = self._pending
        while pending:
            first, frames = pending[0]
            for i, (rtype, payload) in enumerate(split_frames(frames)):
                seq = first + i
                if seq <= self.last_seq:
                    continue
                run_no, fields = decode(payload)
                batch.append((seq, rtype, run_no, fields))
            if len(batch) >= BATCH_RECORDS:
                self._apply(projector, batch)
                batch = []
            pending.popleft()
            self._pending_bytes -= len(frames)
        if batch:
            self._apply(projector, batch)

    def _apply(self, projector: Projector, batch: list[tuple[int, int, int, list[Any]]]) -> None:
        t0 = time.perf_counter()
        report = projector.apply(batch)
        self.last_seq = max(self.last_seq, report.last_seq)
        self.applied += report.applied
        log.debug(
            "projector.applied",
            records=len(batch),
            last_seq=self.last_seq,
            ms=round((time.perf_counter() - t0) * 1000, 2),
        )
