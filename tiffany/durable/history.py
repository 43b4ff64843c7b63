"""Reading runs back from the WAL: the run index and per-run histories.

:func:`scan` walks the WAL once, decoding only ``RUN_START`` and ``RUN_END``
payloads (the type byte says which they are), and returns the run index:
which runs exist, where each starts, whether it ended. :func:`load` then
reads one run's records from its first sequence number, skipping other
runs by the 4-byte run prefix without decoding them, and builds the
:class:`~tiffany.durable.replayer.ReplayCursor` a replay consumes.

Rejected: a separate on-disk index file. The scan reads headers at about a
million records a second and the WAL is the only source of truth, so an
index that can disagree with it is not worth its failure modes yet.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiffany.durable.dispatch import MAX_ARG_CHARS
from tiffany.durable.records import RecordType, decode, decode_fields
from tiffany.durable.replayer import ReplayCursor
from tiffany.errors import TiffanyError
from tiffany.wal import Record, iter_records

__all__ = ["RunInfo", "UnknownRun", "decoded_records", "load", "load_many", "scan"]

_DISPATCH = int(RecordType.DISPATCH)
_RUN_START = int(RecordType.RUN_START)
_RUN_BOUNDS = frozenset({_RUN_START, int(RecordType.RUN_END)})


class UnknownRun(TiffanyError):
    """No run with that id in the WAL."""

    code = "run.unknown"


@dataclass(slots=True)
class RunInfo:
    """A run as the index knows it."""

    run_no: int
    run_id: str
    name: str
    entry: dict[str, Any]
    started_at: float
    first_seq: int
    status: str = "running"
    ended_at: float | None = None
    result: Any = None
    records: int = 0

    @property
    def finished(self) -> bool:
        """True once the run's end is in the WAL."""
        return self.status != "running"


@dataclass(slots=True)
class RunIndex:
    """All runs in a WAL."""

    runs: dict[str, RunInfo] = field(default_factory=dict)
    by_no: dict[int, RunInfo] = field(default_factory=dict)
    last_seq: int = 0
    max_run_no: int = 0

    def get(self, run_id: str) -> RunInfo:
        """Return the run, or raise UnknownRun."""
        try:
            return self.runs[run_id]
        except KeyError:
            raise UnknownRun(f"no run {run_id!r} in the WAL", run_id=run_id) from None


def scan(wal_dir: Path) -> RunIndex:
    """Build the run index with one pass over the WAL."""
    index = RunIndex()
    for rec in iter_records(wal_dir):
        index.last_seq = rec.seq
        if rec.rtype == RecordType.RUN_START:
            run_no, (run_id, name, entry, ts) = decode(rec.payload)
            info = RunInfo(run_no, run_id, name, entry, ts, rec.seq)
            index.runs[run_id] = info
            index.by_no[run_no] = info
            index.max_run_no = max(index.max_run_no, run_no)
        elif rec.rtype == RecordType.RUN_END:
            run_no, (status, value, ts) = decode(rec.payload)
            ended = index.by_no.get(run_no)
            if ended is not None:
                ended.status, ended.result, ended.ended_at = status, value, ts
    return index


def decoded_records(wal_dir: Path, info: RunInfo) -> Iterator[tuple[int, int, list[Any]]]:
    """Yield ``(seq, type, fields)`` of one run's records, in WAL order."""
    prefix = info.run_no.to_bytes(4, "little")
    for rec in iter_records(wal_dir, from_seq=info.first_seq):
        payload = rec.payload
        if payload[:4] != prefix or rec.rtype == RecordType.RUN_START:
            continue
        yield rec.seq, rec.rtype, decode_fields(payload)


def load_many(
    wal_dir: Path, wanted: set[str] | None = None, *, unfinished_only: bool = False
) -> tuple[RunIndex, dict[str, ReplayCursor]]:
    """Build the index and the cursors of the wanted runs in one pass over the WAL.

    Args:
        wal_dir: The WAL directory.
        wanted: Run ids to load (None: every run).
        unfinished_only: Skip runs whose end is in the WAL (recovery).

    Discussion: a run's first record is its RUN_START, so a single pass
    can decide, at that record, whether to keep the run's records; only the
    kept runs' payloads are held (undecoded) and decoded at the end.

    Discussion: the cyclic garbage collector is paused while the cursors
    are built (``_gc_paused``). Loading a million records makes a million
    lists, none of them garbage; with the collector on, its passes walk all
    of them again and again. Nothing here makes a reference cycle, so
    pausing frees nothing late.
    """
    with _gc_paused():
        index, keep = _scan_keeping(wal_dir, wanted, unfinished_only)
        cursors = {}
        for prefix, raw in keep.items():
            info = index.by_no[int.from_bytes(prefix, "little")]
            info.records = len(raw)
            cursors[info.run_id] = _cursor(raw)
    return index, cursors


def _scan_keeping(
    wal_dir: Path, wanted: set[str] | None, unfinished_only: bool
) -> tuple[RunIndex, dict[bytes, list[Record]]]:
    """Build the index and keep the (undecoded) records of the wanted runs, by run prefix."""
    index = RunIndex()
    keep: dict[bytes, list[Record]] = {}
    get, bounds = keep.get, _RUN_BOUNDS
    seq = 0
    for rec in iter_records(wal_dir):
        seq, rtype, payload, _segment, _offset = rec
        if rtype in bounds:  # RUN_START or RUN_END: rare, decoded
            if rtype == _RUN_START:
                _start(index, rec, keep, wanted)
                continue
            if _end(index, payload, keep, unfinished_only):
                continue
        buf = get(payload[:4])
        if buf is not None:
            buf.append(rec)
    index.last_seq = seq
    return index, keep


def _start(
    index: RunIndex, rec: Record, keep: dict[bytes, list[Record]], wanted: set[str] | None
) -> None:
    run_no, (run_id, name, entry, ts) = decode(rec.payload)
    info = RunInfo(run_no, run_id, name, entry, ts, rec.seq)
    index.runs[run_id] = info
    index.by_no[run_no] = info
    index.max_run_no = max(index.max_run_no, run_no)
    if wanted is None or run_id in wanted:
        keep[rec.payload[:4]] = []


def _end(
    index: RunIndex, payload: bytes, keep: dict[bytes, list[Record]], unfinished_only: bool
) -> bool:
    """Note a RUN_END; True if its run's records are dropped (recovery skips finished runs)."""
    run_no, (status, value, ts) = decode(payload)
    ended = index.by_no.get(run_no)
    if ended is not None:
        ended.status, ended.result, ended.ended_at = status, value, ts
    if unfinished_only:
        keep.pop(payload[:4], None)
        return True
    return False


def load(wal_dir: Path, info: RunInfo) -> ReplayCursor:
    """Read one run's history into a replay cursor (from its first record on)."""
    prefix = info.run_no.to_bytes(4, "little")
    with _gc_paused():
        records = [
            rec
            for rec in iter_records(wal_dir, from_seq=info.first_seq)
            if rec.payload[:4] == prefix and rec.rtype != RecordType.RUN_START
        ]
        info.records = len(records)
        return _cursor(records)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector; what it made goes to the oldest generation.

    Discussion: ``freeze`` then ``unfreeze`` moves every tracked object to
    the oldest generation in two list splices. Without it, the first young
    collection after the pause walks the million lists just built, and two
    more walks follow as they age (about 0.3 s per million records).
    Objects in the oldest generation are still collected, by the full
    collections the interpreter runs as the heap grows.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()


def _cursor(records: Iterable[Record]) -> ReplayCursor:
    """Sort one run's records (in WAL order) into what the replayer consumes."""
    dispatches: list[list[Any]] = []
    seqs: list[int] = []
    outcomes: dict[int, list[Any]] = {}
    wakes: deque[tuple[int, list[Any]]] = deque()
    exits: dict[int, list[Any]] = {}
    attempts: dict[tuple[int, int], int] = {}
    run_end: list[Any] | None = None
    last_n = 0  # the last dispatch seen: a carrying record above it is the next one
    decode, add_dispatch, add_seq = decode_fields, dispatches.append, seqs.append  # hot loop
    for seq, rtype, payload, _segment, _offset in records:
        fields = decode(payload)
        if rtype == _DISPATCH:
            add_dispatch(fields)
            add_seq(seq)
            last_n = fields[0]
        elif rtype == RecordType.OUTCOME:
            outcomes[fields[0]] = fields
            if fields[0] > last_n:  # Now() / Random(): the OUTCOME is the dispatch
                last_n = fields[0]
                dispatches.append([last_n, fields[1], fields[2], None])
                seqs.append(seq)
        elif rtype == RecordType.WAKE:
            wakes.append((seq, fields))
        elif rtype == RecordType.TASK_EXIT:
            exits[fields[1]] = fields
            if fields[0] > last_n:  # the task's final return: the TASK_EXIT is the dispatch
                last_n = fields[0]
                dispatches.append([last_n, fields[1], "return", None])
                seqs.append(seq)
        elif rtype == RecordType.STEP_START:
            key = (fields[1], fields[2])
            attempts[key] = max(attempts.get(key, 0), fields[4])
            if fields[0] > last_n:  # a Step: its first start is the dispatch
                last_n = fields[0]
                dispatches.append([last_n, fields[1], "step", fields[3][:MAX_ARG_CHARS]])
                seqs.append(seq)
        elif rtype == RecordType.SPAWN:
            if fields[0] > last_n:  # a NewTask: the SPAWN is the parent's dispatch
                last_n = fields[0]
                dispatches.append([last_n, fields[2], "new_task", fields[3][:MAX_ARG_CHARS]])
                seqs.append(seq)
        elif rtype == RecordType.RUN_END:
            run_end = fields
    return ReplayCursor(dispatches, seqs, outcomes, wakes, exits, attempts, run_end)
