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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiffany.durable.journal import ReplayCursor
from tiffany.errors import TiffanyError
from tiffany.records import (
    Dispatch,
    Outcome,
    Record,
    RecordType,
    RunEnd,
    RunStart,
    StepStart,
    TaskExit,
    Unknown,
    Wake,
    carried,
    decode,
)
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
    #: The journal-compatibility version the run started under (RUN_START).
    compat: int = 1

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

    def started(self, seq: int, payload: bytes) -> RunInfo:
        """Index the run a RUN_START record (at ``seq``) begins."""
        run_no = int.from_bytes(payload[:4], "little")
        rec: RunStart = decode(RecordType.RUN_START, payload)  # type: ignore[assignment]
        info = RunInfo(run_no, rec.run_id, rec.name, rec.entry, rec.ts, seq, compat=rec.compat)
        self.runs[rec.run_id] = info
        self.by_no[run_no] = info
        self.max_run_no = max(self.max_run_no, run_no)
        return info

    def ended(self, payload: bytes) -> None:
        """Note the end of the run a RUN_END record closes."""
        rec: RunEnd = decode(RecordType.RUN_END, payload)  # type: ignore[assignment]
        info = self.by_no.get(int.from_bytes(payload[:4], "little"))
        if info is not None:
            info.status, info.result, info.ended_at = rec.status, rec.value, rec.ts


def scan(wal_dir: Path) -> RunIndex:
    """Build the run index with one pass over the WAL."""
    index = RunIndex()
    for rec in iter_records(wal_dir):
        index.last_seq = rec.seq
        if rec.rtype == RecordType.RUN_START:
            index.started(rec.seq, rec.payload)
        elif rec.rtype == RecordType.RUN_END:
            index.ended(rec.payload)
    return index


def decoded_records(wal_dir: Path, info: RunInfo) -> Iterator[tuple[int, int, Record | Unknown]]:
    """Yield ``(seq, type, record)`` of one run's records after its RUN_START, in WAL order."""
    prefix = info.run_no.to_bytes(4, "little")
    for rec in iter_records(wal_dir, from_seq=info.first_seq):
        payload = rec.payload
        if payload[:4] != prefix or rec.rtype == RecordType.RUN_START:
            continue
        yield rec.seq, rec.rtype, decode(rec.rtype, payload)


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
            info = index.started(rec.seq, payload)
            if wanted is None or info.run_id in wanted:
                keep[payload[:4]] = []
            continue
        buf = keep.get(payload[:4])
        if rtype == RecordType.RUN_END:
            index.ended(payload)
            if unfinished_only:
                keep.pop(payload[:4], None)
                continue
        if buf is not None:
            buf.append((rec.seq, rtype, payload))
    cursors = {}
    for prefix, raw in keep.items():
        info = index.by_no[int.from_bytes(prefix, "little")]
        info.records = len(raw)
        cursors[info.run_id] = _cursor((seq, rtype, decode(rtype, p)) for seq, rtype, p in raw)
    return index, cursors


def load(wal_dir: Path, info: RunInfo) -> ReplayCursor:
    """Read one run's history into a replay cursor (from its first record on)."""
    records = list(decoded_records(wal_dir, info))
    info.records = len(records)
    return _cursor(records)


def _cursor(records: Iterable[tuple[int, int, Record | Unknown]]) -> ReplayCursor:
    """Sort a run's records into what its replay consumes (carried dispatches made explicit)."""
    dispatches: list[tuple[int, Dispatch]] = []
    outcomes: dict[int, Outcome] = {}
    wakes: deque[tuple[int, Wake]] = deque()
    exits: dict[int, TaskExit] = {}
    attempts: dict[tuple[int, int], int] = {}
    run_end: RunEnd | None = None
    last_n = 0  # the last dispatch seen: a carrying record above it is the next one
    for seq, _rtype, rec in records:
        cls = rec.__class__
        if cls is Dispatch:
            dispatches.append((seq, rec))  # type: ignore[arg-type]
            last_n = rec.n  # type: ignore[union-attr]
            continue
        if cls is Wake:
            wakes.append((seq, rec))  # type: ignore[arg-type]
        elif cls is Outcome:
            outcomes[rec.n] = rec  # type: ignore[union-attr, assignment]
        elif cls is TaskExit:
            exits[rec.ltid] = rec  # type: ignore[union-attr, assignment]
        elif cls is StepStart:
            key = (rec.ltid, rec.ordinal)  # type: ignore[union-attr]
            attempts[key] = max(attempts.get(key, 0), rec.attempt)  # type: ignore[union-attr]
        elif cls is RunEnd:
            run_end = rec  # type: ignore[assignment]
            continue
        implied = carried(rec, last_n)  # type: ignore[arg-type]
        if implied is not None:
            dispatches.append((seq, implied))
            last_n = implied.n
    return ReplayCursor(dispatches, outcomes, wakes, exits, attempts, run_end)
