"""Reading runs back from the WAL: the run index and per-run histories.

:func:`scan` walks the WAL once, decoding only ``RUN_START`` and ``RUN_END``
payloads (the type byte says which they are), and returns the run index:
which runs exist, where each starts, whether it ended. :func:`load` then
reads one run's records from its first sequence number, skipping other
runs by the 4-byte run prefix without decoding them, and builds the
:class:`~tiffany.durable.journal.ReplayCursor` a replay consumes.

Rejected: a separate on-disk index file. The scan reads headers at about a
million records a second and the WAL is the only source of truth, so an
index that can disagree with it is not worth its failure modes yet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiffany.durable.journal import ReplayCursor
from tiffany.durable.records import RecordType, decode, run_of
from tiffany.errors import TiffanyError
from tiffany.wal import iter_records

__all__ = ["RunInfo", "UnknownRun", "decoded_records", "load", "scan"]


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
        yield rec.seq, rec.rtype, decode(payload)[1]


def load(wal_dir: Path, info: RunInfo) -> ReplayCursor:
    """Read one run's history into a replay cursor."""
    dispatches: list[tuple[int, list[Any]]] = []
    outcomes: dict[int, list[Any]] = {}
    wakes: deque[tuple[int, list[Any]]] = deque()
    exits: dict[int, list[Any]] = {}
    attempts: dict[tuple[int, int], int] = {}
    run_end: list[Any] | None = None
    count = 0
    for seq, rtype, fields in decoded_records(wal_dir, info):
        count += 1
        if rtype == RecordType.DISPATCH:
            dispatches.append((seq, fields))
        elif rtype == RecordType.OUTCOME:
            outcomes[fields[0]] = fields
        elif rtype == RecordType.WAKE:
            wakes.append((seq, fields))
        elif rtype == RecordType.TASK_EXIT:
            exits[fields[1]] = fields
        elif rtype == RecordType.STEP_START:
            key = (fields[1], fields[2])
            attempts[key] = max(attempts.get(key, 0), fields[4])
        elif rtype == RecordType.RUN_END:
            run_end = fields
    info.records = count
    return ReplayCursor(dispatches, outcomes, wakes, exits, attempts, run_end)


def first_run_of(payload: bytes) -> int:
    """Return the run number a payload belongs to (for dump tools)."""
    return run_of(payload)
