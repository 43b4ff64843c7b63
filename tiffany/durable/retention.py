"""Retention: advance the checkpoint, release the segments no one needs any more.

In the manner of etcd's snapshot + WAL segment release. A live segment is
released (docs/wal-format.md, "Checkpoints and retention") only when:

1. it is not the last segment (the writer appends to that one);
2. a checkpoint covers it: its last seq is at most the checkpoint's seq;
3. every run with a record in it had finished by then: its last seq is
   before the first seq of every run the checkpoint lists as unfinished;
4. the store has projected it: its last seq is at most the projector's
   watermark (``projector_state.last_seq``).

Policies (``TIFFANY_WAL_RETAIN``): ``all`` keeps every segment live (the
start still reads only the checkpoint's tail, but opening the WAL checks
every live segment); ``archive`` (the default) renames released segments
into ``wal/archive/``, where ``replay --verify``, ``wal dump`` and ``db
rebuild`` still read them; ``delete`` removes them (``db rebuild`` then
refuses, and a finished run's journal lives on only in the store's
``journal_records``).

:class:`Checkpointer` does this on a thread of its own, never on the
scheduler's: the loop only pokes it (an ``Event.set``) when the WAL rotates
to a new segment or after every :data:`CHECKPOINT_EVERY_RUNS` finished runs,
and once more when the engine stops. Each pass reads the durable records
after the last checkpoint (the same fold as a start-up,
:func:`~tiffany.durable.history.load_many`), writes the new checkpoint
atomically, then releases what it may, oldest segment first.

Each pass resumes its walk of the log where the last one stopped
(:data:`~tiffany.wal.Position`): it costs the records since the last pass,
not the whole live segment. The fold stays on this thread: in a worker
process (tried, with the process at ``SCHED_IDLE``) the loop's longest
dispatches fell, but starting the process cost the busy two cores a burst
of CPU, and read-your-writes under load got slower on both stores
(bench/HISTORY.md, ``api.py``).

Invariants: a failed pass is logged and changes nothing that a later pass
or a start-up cannot redo (observers fail soft); releasing is idempotent
(see :func:`~tiffany.wal.segments.release_segment`).
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, Protocol

import structlog

from tiffany.durable.checkpoint import (
    IDEMPOTENCY_WINDOW_S,
    Checkpoint,
    CheckpointStore,
    write_checkpoint,
)
from tiffany.durable.history import checkpoint_of, read_runs
from tiffany.wal import LogReader, Position
from tiffany.wal.segments import Segment, history_start, list_segments, release_segment

__all__ = [
    "CHECKPOINT_EVERY_RUNS",
    "Checkpointer",
    "Retain",
    "StreamLog",
    "fold",
    "releasable",
    "release",
    "release_bound",
    "released_note",
]

log = structlog.get_logger("tiffany.durable")

#: Finished runs between two checkpoints (besides one per segment rotation).
CHECKPOINT_EVERY_RUNS: Final = 1_000


class Retain(enum.StrEnum):
    """What happens to a segment once it may be released."""

    ALL = "all"  # nothing: keep it live
    ARCHIVE = "archive"  # rename it into wal/archive/
    DELETE = "delete"  # remove it


def released_note(source: object, first_seq: int) -> str:
    """What to add to "no run in the WAL" when retention deleted segments of ``source``.

    ``first_seq``: the seq the log numbers its first record with (engine
    ``i``'s journal: ``seq_base(i) + 1``). Empty when nothing was deleted
    (or ``source`` is not a file WAL).
    """
    if not isinstance(source, Path) or (start := history_start(source)) <= first_seq:
        return ""
    return (
        f" (its segments before seq {start} were deleted: TIFFANY_WAL_RETAIN=delete; "
        "a run there is in the store only: GET /api/runs/RUN_ID/events)"
    )


def release_bound(cp: Checkpoint, projected_seq: int) -> int:
    """The last seq a release may take: checkpointed, projected, and before every unfinished run."""
    return min(cp.seq, projected_seq, cp.oldest_needed - 1)


def releasable(wal_dir: Path, cp: Checkpoint, projected_seq: int) -> list[Segment]:
    """Return the live segments that may be released, oldest first (see the module docstring)."""
    bound = release_bound(cp, projected_seq)
    live = list_segments(wal_dir)
    out = []
    for seg, after in itertools.pairwise(live):
        if after.first_seq - 1 > bound:
            break
        out.append(seg)
    return out


def release(wal_dir: Path, cp: Checkpoint, projected_seq: int, retain: Retain) -> list[str]:
    """Release what :func:`releasable` allows under ``retain``; return the segment names."""
    if retain is Retain.ALL:
        return []
    done = []
    for seg in releasable(wal_dir, cp, projected_seq):
        release_segment(seg, archive=retain is Retain.ARCHIVE)
        done.append(seg.name)
    if done:
        log.info("wal.released", segments=done, retain=str(retain), checkpoint=cp.seq)
    return done


class StreamLog(LogReader, CheckpointStore, Protocol):
    """A log that is not a directory: read in seq order, keeping its own checkpoints."""

    def release_before(self, seq: int) -> int:
        """Delete the records below ``seq`` (finished, projected runs'); return how many."""
        ...


def fold(
    wal_dir: Path | StreamLog,
    base: Checkpoint,
    upto: int,
    window_s: float,
    at: Position | None = None,
    ends: Mapping[str, int] | None = None,
) -> tuple[Checkpoint, Position | None]:
    """Return the checkpoint at ``upto`` (``base`` plus the records after it) and where it stopped.

    ``at``: where the previous fold stopped (a file WAL is read from there,
    not from the head of the segment: :func:`~tiffany.wal.iter_spans`);
    ``ends``: how much of each segment to read (the writer's ``durable_ends``).
    """
    loaded = read_runs(wal_dir, set(), base=base, until=upto, at=at, ends=ends)
    return checkpoint_of(loaded.index, window_s), loaded.position


class Checkpointer:
    """A thread that writes checkpoints and releases segments when poked.

    Args:
        wal_dir: The WAL directory, or a PostgreSQL stream (checkpoints only).
        base: The checkpoint as of the end of recovery (the index the start built).
        durable_seq: Returns the WAL's durable seq (any thread).
        durable_ends: Returns where the WAL's live segment's records end
            (``Wal.durable_ends``, any thread), or None: segments are read whole.
        projected_seq: Returns the store's projected seq (any thread).
        retain: The retention policy.
        window_s: The idempotency key window.
    """

    def __init__(
        self,
        wal_dir: Path | StreamLog,
        base: Checkpoint,
        *,
        durable_seq: Callable[[], int],
        projected_seq: Callable[[], int],
        retain: Retain = Retain.ARCHIVE,
        window_s: float = IDEMPOTENCY_WINDOW_S,
        durable_ends: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.wal_dir = wal_dir
        self._at: Position | None = None  # where the last fold stopped
        self.checkpoint = base
        self.retain = retain
        self.window_s = window_s
        self.released = 0
        self._written = -1
        self._released_upto = 0  # a stream's records deleted up to here (Retain.DELETE)
        self._durable_seq = durable_seq
        self._durable_ends = durable_ends
        self._projected_seq = projected_seq
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="tiffany-checkpointer", daemon=True)

    def start(self) -> None:
        """Start the thread; its first pass writes the base checkpoint."""
        self._wake.set()
        self._thread.start()

    def poke(self, *_: object) -> None:
        """Ask for a pass soon (O(1), never blocks: safe on the scheduler thread)."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread after one last pass (the WAL closed, the projector stopped)."""
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def step(self) -> None:
        """One pass: advance and write the checkpoint, then release segments."""
        upto = self._durable_seq()
        if upto > self.checkpoint.seq:
            # After upto: where the records end now covers every record up to it.
            ends = None if self._durable_ends is None else self._durable_ends()
            self.checkpoint, self._at = fold(
                self.wal_dir, self.checkpoint, upto, self.window_s, self._at, ends
            )
        if self.checkpoint.seq != self._written:
            write_checkpoint(self.wal_dir, self.checkpoint)
            self._written = self.checkpoint.seq
        if isinstance(self.wal_dir, Path):
            gone = release(self.wal_dir, self.checkpoint, self._projected_seq(), self.retain)
            self.released += len(gone)
        elif self.retain is Retain.DELETE:  # a stream has no archive: ``all``/``archive`` keep
            bound = release_bound(self.checkpoint, self._projected_seq())
            if bound > self._released_upto:
                deleted = self.wal_dir.release_before(bound + 1)
                self._released_upto = bound
                if deleted:
                    log.info("wal.released", records=deleted, upto=bound, retain=str(self.retain))

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            last = self._stop  # a stop during this pass gets a pass of its own
            try:
                self.step()
            except Exception:
                log.exception("checkpoint.failed", wal=str(self.wal_dir))
            if last:
                return
