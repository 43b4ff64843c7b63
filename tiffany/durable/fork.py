"""A journal fork: a new run whose journal begins with a prefix of an earlier run's records.

A workflow run is re-run from a failed call (``POST /api/runs/{id}/rerun``,
``tiffany/workflows/rerun.py``) by forking its journal there: the new run's
journal is its own RUN_START, then a copy of the earlier run's records up
to (not including) the record that carries the failed call's dispatch. The
new run replays that copy (the workflow's code runs again and every call
whose result the copy holds is answered from it, never made again) and goes
live where the copy ends: the failed call and what follows run for real.

Why that is sound: a prefix of one run's records is exactly what the
journal holds after a crash at that point (the WAL is cut at a record
boundary, and a run's records are appended in the order their events
happened), so the fork's start is recovery's: the replay reaches the end
of the copy, the run goes live, a step another task had in flight there is
started again (at-least-once, marked so), a sleep gets its timer back.

Invariants:

* The copy is the earlier run's record bodies, byte for byte, under the
  new run's 4-byte prefix (``tiffany/wire/records.py``): no record is
  re-encoded, so the values a replay is fed are the ones recorded.
* The new run's journal stands alone: it replays and verifies
  (``tiffany replay RUN --verify``) without the earlier run's.
* Nothing is copied from the earlier run after the cut, its RUN_END included.

Cost: the earlier run's records are read on a control thread
(:func:`read_run_records`); the copy is appended on the loop when the new
run starts, in one go (a run of N records costs N appends of the bytes it
already had, and the replay of N records, as a recovery of it would).
Before that, the engine replays the copy against the code as it is now in
its verify pool (``engine/verifier.py``, ``verify_fork``), so a fork whose
replay would diverge is refused instead of started.

Rejected: pointing the new run at the earlier run's journal (a cursor read
from it at every replay) instead of copying. The new run's verify and its
export would then need a run the retention may have released, and the
store would project a run whose records start mid-way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tiffany.durable.history import UnknownRun
from tiffany.wal import Source, spans_of
from tiffany.wire.records import RUN_PREFIX, Record, RecordType, RunStart, Unknown, decode_body

__all__ = ["ForkRecords", "RunRecords", "read_run_records"]

#: The records a fork copies: ``(type, body)``, the body without its run prefix.
ForkRecords = Sequence[tuple[int, bytes]]


@dataclass(slots=True)
class RunRecords:
    """One finished run's records as its journal holds them, RUN_START aside.

    ``records``: ``(seq, type, body, decoded)`` in WAL order, the body
    without the run's 4-byte prefix; ``ended``: its RUN_END was found.
    """

    run_id: str
    run_no: int
    start_seq: int
    compat: int
    entry: Any
    records: list[tuple[int, int, bytes, Record | Unknown]] = field(default_factory=list)
    ended: bool = False

    def prefix(self, cut: int) -> list[tuple[int, bytes]]:
        """The records before index ``cut`` (RUN_END never), as a fork copies them."""
        end = int(RecordType.RUN_END)
        return [(rtype, body) for _, rtype, body, _ in self.records[:cut] if rtype != end]


def read_run_records(source: Source, start_seq: int, run_id: str) -> RunRecords:
    """Read run ``run_id``'s records from ``source``, from its RUN_START at ``start_seq``.

    Blocking (a control thread's). Reads from ``start_seq`` to the run's
    RUN_END (or the end of the log).

    Raises:
        UnknownRun: The log does not hold the run's RUN_START at ``start_seq``
            (retention released it, or it is another engine's log).
    """
    spans = iter(spans_of(source, from_seq=start_seq))
    first = next(spans, None)
    run_start = int(RecordType.RUN_START)
    if first is None or first[0] != start_seq or first[1] != run_start:
        raise UnknownRun(
            f"the journal no longer holds run {run_id!r} (its first record, seq {start_seq})",
            run_id=run_id,
        )
    _, _, data, start, end, _ = first
    payload = bytes(data[start:end])
    head: Any = decode_body(run_start, memoryview(payload)[4:])
    if not isinstance(head, RunStart) or head.run_id != run_id:
        raise UnknownRun(f"seq {start_seq} is not run {run_id!r}'s start", run_id=run_id)
    prefix = payload[:4]
    out = RunRecords(run_id, RUN_PREFIX.unpack(prefix)[0], start_seq, head.compat, head.entry)
    run_end = int(RecordType.RUN_END)
    for seq, rtype, data, start, end, _ in spans:
        if data[start : start + 4] != prefix or rtype == run_start:
            continue
        body = bytes(data[start + 4 : end])
        out.records.append((seq, rtype, body, decode_body(rtype, memoryview(body))))
        if rtype == run_end:
            out.ended = True
            break
    return out
