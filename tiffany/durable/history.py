"""Reading runs back from the WAL: the run index and per-run histories.

:func:`load_many` walks the WAL once, decoding only ``RUN_START`` and
``RUN_END`` payloads (the type byte says which they are), builds the run
index (which runs exist, where each starts, whether it ended) and keeps the
records of the runs it was asked for, which become the
:class:`~tiffany.durable.replayer.ReplayCursor` a replay consumes;
:func:`scan` is the index alone, :func:`load` one run's cursor.

Given a :class:`~tiffany.durable.checkpoint.Checkpoint` at seq ``S``, the
walk starts from the index it holds and reads only what a start needs: the
records after ``S``, and before that only those of the runs the checkpoint
lists as unfinished (from the oldest one's first seq on). The index is then
partial: runs that ended before ``S`` are not in it (the store and the
archive have them). :func:`checkpoint_of` turns an index back into a
checkpoint: the same fold, so a checkpoint never says what a scan would not.

Invariants: a run's records all carry its 4-byte run number first, and its
first record is its RUN_START; run numbers grow with the seq.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tiffany.durable.checkpoint import (
    IDEMPOTENCY_WINDOW_S,
    Checkpoint,
    KeyEntry,
    OpenRun,
    keys_within,
)
from tiffany.durable.replayer import ReplayCursor
from tiffany.errors import TiffanyError
from tiffany.wal import Position, Source, Span, spans_of
from tiffany.wal.format import RECORD_HEADER_SIZE_BYTES
from tiffany.wire.entries import entry_kind
from tiffany.wire.records import (
    RUN_PREFIX,
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
    decode_body,
    decode_dispatch,
    run_of,
)
from tiffany.wire.runstate import run_end_status
from tiffany.wire.status import RunStatus

__all__ = [
    "Loaded",
    "RunIndex",
    "RunInfo",
    "UnknownRun",
    "checkpoint_of",
    "cursor_of",
    "decoded_records",
    "index_of",
    "load",
    "load_many",
    "load_run",
    "read_runs",
    "records_at",
    "scan",
]


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
    #: ``running`` until its RUN_END, then how it ended (:func:`_ended`).
    status: str = RunStatus.RUNNING.value
    ended_at: float | None = None
    result: Any = None
    records: int = 0
    #: The journal-compatibility version the run started under (RUN_START).
    compat: int = 1
    #: Its RUN_START payload, as the WAL holds it (what a checkpoint keeps).
    start: bytes = b""
    #: Its entry's kind (``plan``, ``workflow``...): kept when a finished run's entry is dropped.
    kind: str | None = None

    @property
    def finished(self) -> bool:
        """True once the run's end is in the WAL."""
        return self.status != RunStatus.RUNNING


@dataclass(slots=True)
class RunIndex:
    """The runs of a WAL (all of them, or those after a checkpoint and the unfinished ones).

    Attributes:
        runs: Run id -> run.
        by_no: Run number -> run.
        last_seq: The last seq read (or the checkpoint's, if none after it).
        max_run_no: The highest run number ever started.
        keys: Idempotency key -> the run it started (within its window;
            from an entry's ``idempotency`` field, ``{"key", "digest"}``).
        newest_start: The newest RUN_START's wall time (the key window's "now").
    """

    runs: dict[str, RunInfo] = field(default_factory=dict)
    by_no: dict[int, RunInfo] = field(default_factory=dict)
    last_seq: int = 0
    max_run_no: int = 0
    keys: dict[str, KeyEntry] = field(default_factory=dict)
    newest_start: float = 0.0

    def get(self, run_id: str) -> RunInfo:
        """Return the run, or raise UnknownRun."""
        try:
            return self.runs[run_id]
        except KeyError:
            raise UnknownRun(f"no run {run_id!r} in the WAL", run_id=run_id) from None

    def start_run(self, seq: int, payload: bytes) -> RunInfo:
        """Add the run a RUN_START record at ``seq`` starts."""
        run_no = run_of(payload)
        rec: RunStart = decode(RecordType.RUN_START, payload)  # type: ignore[assignment]
        run_id, entry, ts = rec.run_id, rec.entry, rec.ts
        kind = entry_kind(entry)
        info = RunInfo(
            run_no,
            run_id,
            rec.name,
            entry,
            ts,
            seq,
            compat=rec.compat,
            start=bytes(payload),
            kind=kind.value if kind is not None else None,
        )
        self.runs[run_id] = info
        self.by_no[run_no] = info
        self.max_run_no = max(self.max_run_no, run_no)
        self.newest_start = max(self.newest_start, ts)
        idem = entry.get("idempotency") if isinstance(entry, dict) else None
        if isinstance(idem, dict) and isinstance(idem.get("key"), str):
            key = idem["key"]
            self.keys[key] = KeyEntry(key, run_id, str(idem.get("digest")), ts, seq)
        return info

    def end_run(self, payload: bytes) -> RunInfo | None:
        """Mark the run a RUN_END record ends; None for one that ended before a checkpoint."""
        rec: RunEnd = decode(RecordType.RUN_END, payload)  # type: ignore[assignment]
        ended = self.by_no.get(run_of(payload))
        if ended is not None:
            _ended(ended, rec)
        return ended


def index_of(cp: Checkpoint) -> RunIndex:
    """Return the (partial) index a checkpoint holds."""
    index = RunIndex(last_seq=cp.seq, max_run_no=cp.max_run_no)
    for run in cp.runs:
        index.start_run(run.first_seq, run.start)
    index.keys = {k.key: k for k in cp.keys}
    index.newest_start = max([k.started_at for k in cp.keys] + [index.newest_start])
    return index


def checkpoint_of(index: RunIndex, window_s: float = IDEMPOTENCY_WINDOW_S) -> Checkpoint:
    """Return the checkpoint of ``index`` at its ``last_seq``: unfinished runs, max run, keys."""
    runs = [OpenRun(i.first_seq, i.start) for i in index.runs.values() if not i.finished]
    keys = keys_within(index.keys.values(), index.newest_start, window_s)
    return Checkpoint(index.last_seq, index.max_run_no, runs, keys)


def scan(wal_dir: Source, base: Checkpoint | None = None, until: int | None = None) -> RunIndex:
    """Build the run index with one pass over the WAL (after ``base``, up to ``until``)."""
    return load_many(wal_dir, set(), base=base, until=until)[0]


def records_at(source: Source, seqs: Iterable[int]) -> dict[int, Record | Unknown]:
    """Return the records with these seqs that the log still holds, decoded, by seq.

    One walk from the lowest seq to the highest (a file WAL's archived
    segments included, ``wal/archive/``); a seq the log no longer holds
    (retention released it) or never held is left out. Blocking: for a
    control thread, never the scheduler's (a re-run's reused outputs).
    """
    wanted = set(seqs)
    out: dict[int, Record | Unknown] = {}
    if not wanted:
        return out
    last = max(wanted)
    for seq, rtype, data, start, end, _ in spans_of(source, from_seq=min(wanted)):
        if seq > last:
            break
        if seq in wanted:
            out[seq] = decode(rtype, data[start:end])
    return out


def decoded_records(wal_dir: Source, info: RunInfo) -> Iterator[tuple[int, int, Record | Unknown]]:
    """Yield ``(seq, type, record)`` of one run's records after its RUN_START, in WAL order."""
    prefix = info.run_no.to_bytes(4, "little")
    for seq, rtype, data, start, end, _ in spans_of(wal_dir, from_seq=info.first_seq):
        if data[start : start + 4] != prefix or rtype == RecordType.RUN_START:
            continue
        yield seq, rtype, decode(rtype, data[start:end])


@dataclass
class Loaded:
    """What one pass over the WAL found: the run index and the kept runs' records.

    Attributes:
        index: The run index (partial when the pass started from a checkpoint).
        spans: Per kept run (its 4-byte prefix), where its records are in the
            segments read (:data:`~tiffany.wal.Span`), RUN_START excluded;
            nothing is decoded or copied until :meth:`cursors`.
        position: Where the next pass may resume (``read_runs(at=...)``).
    """

    index: RunIndex
    spans: dict[bytes, list[Span]]
    #: Where the pass stopped: the end of the last record it read (None: none read).
    position: Position | None = None

    def cursors(self) -> dict[str, ReplayCursor]:
        """Decode the kept runs' records into replay cursors, by run id."""
        index = self.index
        out: dict[str, ReplayCursor] = {}
        if not self.spans:  # nothing kept (the checkpointer's pass): nothing to pause for
            return out
        with _gc_paused():
            for prefix, spans in self.spans.items():
                info = index.by_no[int.from_bytes(prefix, "little")]
                out[info.run_id], info.records = _cursor(spans)
        return out


def load_many(
    wal_dir: Source,
    wanted: set[str] | None = None,
    *,
    unfinished_only: bool = False,
    base: Checkpoint | None = None,
    until: int | None = None,
) -> tuple[RunIndex, dict[str, ReplayCursor]]:
    """Build the index and the cursors of the wanted runs in one pass over the WAL.

    :func:`read_runs`, then :meth:`Loaded.cursors`.
    """
    loaded = read_runs(wal_dir, wanted, unfinished_only=unfinished_only, base=base, until=until)
    return loaded.index, loaded.cursors()


def read_runs(
    wal_dir: Source,
    wanted: set[str] | None = None,
    *,
    unfinished_only: bool = False,
    base: Checkpoint | None = None,
    until: int | None = None,
    checked: Mapping[str, int] | None = None,
    at: Position | None = None,
    ends: Mapping[str, int] | None = None,
) -> Loaded:
    """Build the index and find the wanted runs' records in one pass over the WAL.

    Args:
        wal_dir: The WAL directory, or another log (:data:`~tiffany.wal.Source`).
        wanted: Run ids to keep (None: every run).
        unfinished_only: Skip runs whose end is in the WAL (recovery).
        base: Start from this checkpoint's index instead of seq 1.
        until: Stop after this seq (a checkpointer reads only what is durable;
            a start knows where the log ends, and reads nothing when the
            checkpoint is there).
        checked: What the writer's open verified (:func:`~tiffany.wal.iter_spans`).
        at: Where an earlier pass over this log stopped (its
            :attr:`Loaded.position`): a file WAL is read from there.
        ends: How much of a file WAL's segments to read
            (:meth:`Wal.durable_ends <tiffany.wal.writer.Wal.durable_ends>`).

    Discussion: a run's first record is its RUN_START, so a single pass
    can decide, at that record, whether to keep the run's records; only
    where the kept runs' records are is held (the spans of
    :func:`~tiffany.wal.iter_spans`, into the segments' bytes), and they
    are decoded in place by :meth:`Loaded.cursors`: a million-record run
    loads without a million payload copies.
    """
    index = index_of(base) if base is not None else RunIndex()
    after = index.last_seq
    kept = [i for i in index.runs.values() if wanted is None or i.run_id in wanted]
    keep: dict[bytes, list[Span]] = {RUN_PREFIX.pack(i.run_no): [] for i in kept}
    first = min([i.first_seq for i in kept] + [after + 1])
    spans = spans_of(wal_dir, first, checked, at, ends) if until is None or first <= until else ()
    run_start, run_end = RecordType.RUN_START, RecordType.RUN_END
    last = after
    name, start, end, seq = "", 0, 0, 0
    position: Position | None = None
    for span in spans:
        seq, rtype, data, start, end, name = span
        if until is not None and seq > until:
            position = name, start - RECORD_HEADER_SIZE_BYTES, seq  # where it starts
            break
        if seq <= after:  # before the checkpoint: only its unfinished runs' records
            if rtype != run_start and (buf := keep.get(data[start : start + 4])) is not None:
                buf.append(span)
            continue
        last = seq
        if rtype == run_start:
            payload = data[start:end]
            info = index.start_run(seq, payload)
            if wanted is None or info.run_id in wanted:
                keep[payload[:4]] = []
            continue
        prefix = data[start : start + 4]
        if rtype == run_end:
            ended = index.end_run(data[start:end])
            if unfinished_only:
                keep.pop(prefix, None)
            if ended is not None and prefix not in keep:
                # Not wanted: a full scan of 100,000 runs need not hold their plans.
                # A child run keeps the link to its parent (its end, and the
                # tree's counts, are read from it at start-up: engine/children.py).
                parent = ended.entry.get("parent") if isinstance(ended.entry, dict) else None
                ended.entry, ended.start = {"parent": parent} if parent else {}, b""
            if unfinished_only:
                continue
        if (buf := keep.get(prefix)) is not None:
            buf.append(span)
    if position is None and name:  # read to the end: where the next record will start
        position = name, end, seq + 1
    index.last_seq = last
    return Loaded(index, keep, position)


def load(wal_dir: Source, info: RunInfo) -> ReplayCursor:
    """Read one run's history into a replay cursor (from its first record on)."""
    with _gc_paused():
        spans = spans_of(wal_dir, from_seq=info.first_seq)
        cursor, info.records = _cursor(spans, RUN_PREFIX.pack(info.run_no))
    return cursor


def load_run(wal_dir: Source, run_id: str) -> tuple[RunInfo, ReplayCursor]:
    """Find run ``run_id`` and read its history into a replay cursor, in one pass.

    What ``load_many(wal_dir, {run_id})`` gives of that run, for a reader
    that wants it alone (``verify``). The records before its RUN_START are
    checked and passed over (RUN_START payloads aside: the run's id is in
    them); from there on the run's records are decoded as they are read.

    Discussion: :func:`read_runs` keeps where a run's records are and
    decodes them after the pass (:meth:`Loaded.cursors`), because whether
    it keeps a run is known only at the run's end (recovery drops finished
    runs). Here the run is wanted whatever its end, so the spans are not
    kept: one loop over the records instead of two, and a million span
    tuples less (a visible share of ``bench/replay.py``'s verify). Nor
    are the dispatches' seqs, which only an error names: the cursor reads
    them again if it needs one (:meth:`ReplayCursor.seq_of`).

    Raises:
        UnknownRun: No run ``run_id`` in the log.
    """
    index = RunIndex()
    spans = iter(spans_of(wal_dir))
    run_start = RecordType.RUN_START
    for seq, rtype, data, start, end, _ in spans:
        if rtype == run_start:
            info = index.start_run(seq, data[start:end])
            if info.run_id == run_id:
                break
    else:
        raise UnknownRun(f"no run {run_id!r} in the WAL", run_id=run_id)
    prefix, first = RUN_PREFIX.pack(info.run_no), info.first_seq
    with _gc_paused():
        cursor, info.records = _cursor(spans, prefix, seqs=False)
    cursor.reread = lambda: _cursor(spans_of(wal_dir, first), prefix)[0].seqs
    ended = cursor.run_end
    if ended is not None:
        _ended(info, ended)
    return info, cursor


def _ended(info: RunInfo, rec: RunEnd) -> None:
    """Mark ``info`` ended as its RUN_END says (``tiffany/wire/runstate.py`` reads the status).

    A status no run ends with is kept as journaled: the run is finished all
    the same (its end is in the WAL).
    """
    final = run_end_status(rec.status)
    info.status = final.value if final is not None else rec.status
    info.result, info.ended_at = rec.value, rec.ts


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector; what it made goes out of the young generations.

    Discussion: ``freeze`` then ``unfreeze`` moves every tracked object to
    the oldest generation in two list splices. Without it, the first young
    collection after the pause walks the million lists just built, and two
    more walks follow as they age (bench/README.md, "Figures behind design
    choices in the code").
    Objects in the oldest generation are still collected, by the full
    collections the interpreter runs as the heap grows.

    In a process that froze its start-up heap already (the engine, after it
    built everything: ``tiffany/engine/__init__.py``), ``unfreeze`` would
    give all of it back to the collector: every full collection then walked
    every object of the engine's modules and schemas again (measured: long
    pauses of the scheduler thread, a full collection every second under a
    re-run load). There the records stay frozen with it: they are plain
    data, freed by reference counting when the replay is done with them.
    """
    enabled = gc.isenabled()
    frozen = gc.get_freeze_count()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if not frozen:
            gc.unfreeze()
        if enabled:
            gc.enable()


def cursor_of(spans: Iterable[Span]) -> ReplayCursor:
    """The replay cursor of one run's records, every span the run's (a fork's copy: ``fork.py``)."""
    with _gc_paused():
        return _cursor(spans)[0]


def _cursor(
    spans: Iterable[Span], prefix: bytes | None = None, *, seqs: bool = True
) -> tuple[ReplayCursor, int]:
    """Decode a run's records into what its replay consumes (carried dispatches made explicit).

    Returns the cursor and how many records went into it. With ``prefix``,
    ``spans`` may hold other runs' records: only those of the run whose
    4-byte prefix it is are read (without it, every span is the run's).
    ``seqs`` false: the cursor's dispatches' seqs are not kept (the caller
    sets :attr:`ReplayCursor.reread`).

    The records are decoded in place (``memoryview`` slices of the segments);
    a DISPATCH, most of any run and a few bytes long (its argument is cut to
    ``MAX_ARG_CHARS``), takes the short way.
    """
    dispatches: list[Dispatch] = []
    kept: list[int] = []  # the WAL seq of each dispatch (for errors)
    keep_seqs = seqs
    outcomes: dict[int, tuple[int, Outcome]] = {}
    wakes: deque[tuple[int, Wake]] = deque()
    exits: dict[int, tuple[int, TaskExit]] = {}
    attempts: dict[tuple[int, int], int] = {}
    run_end: RunEnd | None = None
    end_seq: int | None = None
    add_dispatch, add_seq = dispatches.append, kept.append  # hot loop
    dispatch_type = int(RecordType.DISPATCH)
    run_start = int(RecordType.RUN_START)
    segment: bytes = b""
    view = memoryview(segment)
    others = implied_n = 0  # records other than DISPATCH; dispatches they carry
    for seq, rtype, data, start, end, _ in spans:
        if rtype == dispatch_type:
            if prefix is None or data[start : start + 4] == prefix:
                # A copy of a few bytes costs less than a memoryview slice.
                add_dispatch(decode_dispatch(data[start + 4 : end]))
                if keep_seqs:
                    add_seq(seq)
            continue
        if prefix is not None and (data[start : start + 4] != prefix or rtype == run_start):
            continue
        if data is not segment:
            segment, view = data, memoryview(data)
        others += 1
        rec = decode_body(rtype, view[start + 4 : end])
        cls = rec.__class__
        if cls is Wake:
            wakes.append((seq, rec))  # type: ignore[arg-type]
        elif cls is Outcome:
            outcomes[rec.n] = (seq, rec)  # type: ignore[union-attr, assignment]
        elif cls is TaskExit:
            exits[rec.ltid] = (seq, rec)  # type: ignore[union-attr, assignment]
        elif cls is StepStart:
            key = (rec.ltid, rec.ordinal)  # type: ignore[union-attr]
            attempts[key] = max(attempts.get(key, 0), rec.attempt)  # type: ignore[union-attr]
        elif cls is RunEnd:
            run_end, end_seq = rec, seq  # type: ignore[assignment]
            continue
        # The last dispatch seen: a carrying record above it is the next one.
        implied = carried(rec, dispatches[-1].n if dispatches else 0)  # type: ignore[arg-type]
        if implied is not None:
            add_dispatch(implied)
            if keep_seqs:
                add_seq(seq)
            implied_n += 1
    cursor = ReplayCursor(dispatches, kept, outcomes, wakes, exits, attempts, run_end, end_seq)
    return cursor, len(dispatches) - implied_n + others
