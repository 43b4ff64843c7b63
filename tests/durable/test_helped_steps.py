"""A lone step that blocks hands the loop over, and the journal still holds."""

from __future__ import annotations

import threading

import durable_workloads as w

from tiffany.durable import RecordType, Runtime, scan, verify
from tiffany.durable.history import decoded_records


def test_a_step_taken_over_is_journaled_as_a_workers_and_replays_identically(tmp_path):
    w.RELEASED["event"] = threading.Event()
    with Runtime(tmp_path / "data") as rt:
        run_id = rt.submit("durable_workloads:blocked_step_beside_timers")
        rt.run()
        state = rt.status(run_id)
        sysmon = rt.sched._sysmon
        assert sysmon is not None
        assert sysmon.takeovers == 1  # the loop went on elsewhere
    assert state.status == "succeeded", state.error
    assert state.result == ["released", 5]
    info = scan(tmp_path / "data" / "wal").get(run_id)
    wakes = [
        f.value
        for _, rtype, f in decoded_records(tmp_path / "data" / "wal", info)
        if rtype == RecordType.WAKE and f.cause == "step"
    ]
    assert "released" in wakes  # its end recorded, as a worker's end is
    report = verify(tmp_path / "data", run_id)
    assert report.ok, report.divergence
