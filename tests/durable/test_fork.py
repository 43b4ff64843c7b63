"""A journal fork at every record boundary of a finished run (``tiffany/durable/fork.py``).

A fork's new run begins with a copy of the earlier run's records up to a
cut, replays it, and goes live: for every cut, the new run ends as the
earlier one did, the steps whose results the copy holds are not called
again (the others are called once more), and the new run verifies alone.
The same property as recovery from every WAL prefix (``test_journal.py``),
for a run with concurrent tasks, a queue, sleeps, ``Now`` and ``Random``.
"""

from __future__ import annotations

from pathlib import Path

import durable_workloads as wl
import pytest

from tiffany.durable import RecordType, Runtime, scan, verify
from tiffany.durable.fork import read_run_records
from tiffany.durable.history import UnknownRun


@pytest.mark.parametrize(
    ("target", "args"), [("durable_workloads:fan_in", (4,)), ("durable_workloads:killer", ())]
)
def test_a_fork_at_every_record_replays_the_copy_and_ends_as_the_run_did(
    tmp_path: Path, target: str, args: tuple[int, ...]
) -> None:
    wl.CALLS.clear()
    with Runtime(tmp_path) as rt:
        first = rt.submit(target, *args)
        rt.run()
        status, expected = rt.status(first).status, rt.status(first).result
    calls = len(wl.CALLS)
    start = scan(tmp_path / "wal").get(first).first_seq
    held = read_run_records(tmp_path / "wal", start, first)
    assert held.ended
    assert held.records[-1][1] == RecordType.RUN_END
    for cut in range(len(held.records)):
        wl.CALLS.clear()
        prefix = held.prefix(cut)
        done = sum(
            1
            for _, rtype, _, rec in held.records[:cut]
            if rtype == RecordType.WAKE and getattr(rec, "cause", None) == "step"
        )
        with Runtime(tmp_path) as rt:
            forked = rt.submit_entry(held.entry, name="fork", fork=prefix, compat=held.compat)
            rt.run()
            state = rt.status(forked)
        assert (state.status, state.result) == (status, expected), cut
        # Steps whose result the copy holds are not called again; the others once.
        assert len(wl.CALLS) == calls - done, cut
        report = verify(tmp_path, forked)
        assert report.ok, (cut, report.to_dict())
        again = read_run_records(
            tmp_path / "wal", scan(tmp_path / "wal").get(forked).first_seq, forked
        )
        copied = [(rtype, body) for _, rtype, body, _ in again.records[: len(prefix)]]
        assert copied == prefix, cut  # the copy is the earlier run's bodies, byte for byte


def test_reading_a_run_the_journal_does_not_hold_at_that_seq_is_refused(tmp_path: Path) -> None:
    with Runtime(tmp_path) as rt:
        first = rt.submit("durable_workloads:fan_in", 2)
        rt.run()
    start = scan(tmp_path / "wal").get(first).first_seq
    with pytest.raises(UnknownRun, match="no longer holds"):
        read_run_records(tmp_path / "wal", start + 1, first)
    with pytest.raises(UnknownRun):
        read_run_records(tmp_path / "wal", start, "run-other")
