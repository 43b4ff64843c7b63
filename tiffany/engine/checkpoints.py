"""The checkpointer's fold, in a worker process when it is large.

Each checkpoint pass folds every WAL record since the last one into the
run index (``durable/retention.py``): a Python loop over some 33,000
records per 1,000 small runs. On the checkpointer's thread it held the GIL
against the scheduler thread, in 5 ms slices, for as long as it lasted: at
500 submissions a second (one pass every two seconds) the loop's longest
dispatches were 27-42 ms, 13-21 ms with the fold in a worker
(bench/README.md, ``api.py``).

:class:`WorkerFold` sends a fold of at least :data:`OFFLOAD_MIN_RECORDS`
records of a WAL directory to a :class:`~tiffany.engine.workers.WorkerPool`
of one process at the lowest CPU priority (``SCHED_IDLE``: in its own
process the fold still cost the busy two cores a burst of CPU every pass,
and the slowest answers waited on that instead): the base checkpoint goes
as its file bytes, the worker reads the segments itself and answers the new
checkpoint's bytes. Smaller folds,
and those of a PostgreSQL stream (whose connection stays here), run on the
checkpointer's thread, as does any fold whose worker failed (logged): a
checkpoint is never skipped for want of a worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import structlog

from tiffany.config import Settings
from tiffany.durable.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from tiffany.durable.retention import StreamLog, fold
from tiffany.engine.workers import WorkerPool
from tiffany.wal import Position

__all__ = ["OFFLOAD_MIN_RECORDS", "WorkerFold"]

log = structlog.get_logger(__name__)

#: The fewest records a fold must cover to go to the worker (below: this thread).
OFFLOAD_MIN_RECORDS: Final = 2_000
#: What the fork server imports once.
_PRELOAD: Final = ["tiffany.durable"]


def _fold_in_worker(
    wal_dir: str, base: bytes, upto: int, window_s: float, at: Position | None
) -> tuple[bytes, Position | None]:
    """:func:`~tiffany.durable.retention.fold` in the worker, checkpoints as file bytes."""
    cp, where = fold(Path(wal_dir), decode_checkpoint(base), upto, window_s, at)
    return encode_checkpoint(cp), where


class WorkerFold:
    """A :data:`~tiffany.durable.retention.Fold` that runs large folds in a worker process.

    Args:
        settings: The engine's settings (the worker gets them without secrets).
        min_records: The fewest records a fold must cover to leave this process.
    """

    def __init__(self, settings: Settings, *, min_records: int = OFFLOAD_MIN_RECORDS) -> None:
        self.pool = WorkerPool(settings, 1, _PRELOAD, background=True)
        self.min_records = min_records
        #: Folds done in the worker, and those that fell back to this thread after it failed.
        self.offloaded = 0
        self.fallbacks = 0

    def __call__(
        self,
        wal_dir: Path | StreamLog,
        base: Checkpoint,
        upto: int,
        window_s: float,
        at: Position | None = None,
    ) -> tuple[Checkpoint, Position | None]:
        """Return the checkpoint at ``upto`` and where the fold stopped (module docstring)."""
        small = upto - base.seq < self.min_records
        if small or not isinstance(wal_dir, Path) or self.pool.closed:
            return fold(wal_dir, base, upto, window_s, at)
        try:
            fut = self.pool.submit(
                _fold_in_worker, str(wal_dir), encode_checkpoint(base), upto, window_s, at
            )
            data, where = fut.result()
        except Exception as exc:  # noqa: BLE001 - the same fold here says what is wrong, if anything
            self.fallbacks += 1
            log.warning("checkpoint.worker_failed", error=repr(exc)[:500], upto=upto)
            return fold(wal_dir, base, upto, window_s, at)
        self.offloaded += 1
        return decode_checkpoint(data), where

    def close(self) -> None:
        """Stop the worker (later folds run on the caller's thread)."""
        self.pool.close()
