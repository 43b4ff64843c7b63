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

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiffany.durable.dispatch import MAX_ARG_CHARS
from tiffany.durable.records import RecordType, decode, decode_fields
from tiffany.durable.replayer import ReplayCursor
from tiffany.errors import TiffanyError
from tiffany.wal import iter_records

__all__ = ["RunInfo", "UnknownRun", "decoded_records", "load", "load_many", "scan"]


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
    """
    index = RunIndex()
    keep: dict[bytes, list[tuple[int, int, bytes]]] = {}
    for rec in iter_records(wal_dir):
        index.last_seq = rec.seq
        rtype = rec.rtype
        payload = rec.payload
        if rtype == RecordType.RUN_START:
            run_no, (run_id, name, entry, ts) = decode(payload)
            info = RunInfo(run_no, run_id, name, entry, ts, rec.seq)
            index.runs[run_id] = info
            index.by_no[run_no] = info
            index.max_run_no = max(index.max_run_no, run_no)
            if wanted is None or run_id in wanted:
                keep[payload[:4]] = []
            continue
        buf = keep.get(payload[:4])
        if rtype == RecordType.RUN_END:
            run_no, (status, value, ts) = decode(payload)
            ended = index.by_no.get(run_no)
            if ended is not None:
                ended.status, ended.result, ended.ended_at = status, value, ts
            if unfinished_only:
                keep.pop(payload[:4], None)
                continue
        if buf is not None:
            buf.append((rec.seq, rtype, payload))
    cursors = {}
    for prefix, raw in keep.items():
        info = index.by_no[int.from_bytes(prefix, "little")]
        info.records = len(raw)
        cursors[info.run_id] = _cursor((seq, rtype, decode_fields(p)) for seq, rtype, p in raw)
    return index, cursors


def load(wal_dir: Path, info: RunInfo) -> ReplayCursor:
    """Read one run's history into a replay cursor (from its first record on)."""
    records = list(decoded_records(wal_dir, info))
    info.records = len(records)
    return _cursor(records)


def _cursor(records: Iterable[tuple[int, int, list[Any]]]) -> ReplayCursor:
    dispatches: list[list[Any]] = []
    seqs: list[int] = []
    outcomes: dict[int, list[Any]] = {}
    wakes: deque[tuple[int, list[Any]]] = deque()
    exits: dict[int, list[Any]] = {}
    attempts: dict[tuple[int, int], int] = {}
    run_end: list[Any] | None = None
    last_n = 0  # the last dispatch seen: a carrying record above it is the next one
    for seq, rtype, fields in records:
        if rtype == RecordType.DISPATCH:
            dispatches.append(fields)
            seqs.append(seq)
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
