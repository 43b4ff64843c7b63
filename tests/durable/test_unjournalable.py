"""Values the journal cannot record fail their step, never the engine.

A python tool returned an integer past 64 bits, a mapping with such a key,
or more than a record holds (``MAX_RECORD_BYTES``): the journal raised, the
kernel stopped on its critical instrument, and ``tiffany serve`` restarted an
engine that recovered the run, met the same value and died again, taking
every run on the engine with it. Now the step fails with
``journal.value`` (retries apply), a plan's outputs too large for one
record are kept as their stand-in, and both replay identically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tiffany.agents.tools.python import register_function, unregister_function
from tiffany.config import Settings
from tiffany.durable import verify
from tiffany.engine import build, replay_resolvers
from tiffany.records import Unencodable
from tiffany.wal import MAX_RECORD_BYTES

_FUNCTIONS = {
    "test.huge_int": lambda: {"n": 2**100},
    "test.huge_key": lambda: {2**70: "x"},
    "test.too_large": lambda: "x" * MAX_RECORD_BYTES,
    "test.half": lambda: "y" * (MAX_RECORD_BYTES * 5 // 8),
    "test.small": lambda: 7,
}


@pytest.fixture(autouse=True)
def _functions():
    for name, fn in _FUNCTIONS.items():
        register_function(name, fn, replace=True)
    yield
    for name in _FUNCTIONS:
        unregister_function(name)


def _plan(function: str, **step: Any) -> dict[str, Any]:
    return {
        "name": "unjournalable",
        "steps": [{"id": "a", "tool": "python", "args": {"function": function}, **step}],
        "outputs": {"a": "${steps.a.output}"},
    }


def _run_all(data_dir: Path, plans: list[dict[str, Any]]) -> list[Any]:
    engine = build(Settings(data_dir=data_dir), enabled_tools=["python"])
    with engine.runtime as rt:
        run_ids = [engine.submit_plan(plan) for plan in plans]
        rt.run()
        return [(run_id, rt.status(run_id)) for run_id in run_ids]


def _verify(data_dir: Path, run_id: str) -> None:
    report = verify(data_dir, run_id, resolvers=replay_resolvers(Settings(data_dir=data_dir)))
    assert report.ok, report.to_dict()


@pytest.mark.parametrize("timeout_s", [None, 30], ids=["in-worker", "tool-task"])
def test_a_result_the_journal_cannot_encode_fails_its_step_and_the_engine_goes_on(
    tmp_path, timeout_s
):
    extra = {} if timeout_s is None else {"timeout_s": timeout_s}
    plans = [
        _plan("test.huge_int", retries=1, backoff=0, **extra),
        _plan("test.huge_key", **extra),
        _plan("test.small", **extra),  # the engine's other runs are not affected
    ]
    (huge, s1), (key, s2), (small, s3) = _run_all(tmp_path / "data", plans)
    for state in (s1, s2):
        assert state.status == "failed"
        step = state.error.fields["steps"]["a"]
        assert step["error"]["code"] == "journal.value", step
        assert "cannot be journaled" in step["error"]["message"]
        assert "ints < -2**63" in step["error"]["message"]
    assert len(s1.error.fields["steps"]["a"]["attempts"]) == 2  # its retries applied
    assert s3.status == "succeeded"
    assert s3.result["outputs"] == {"a": 7}
    for run_id in (huge, key, small):
        _verify(tmp_path / "data", run_id)


def test_a_result_larger_than_a_record_fails_its_step_naming_its_size(tmp_path):
    [(run_id, state)] = _run_all(tmp_path / "data", [_plan("test.too_large")])
    assert state.status == "failed"
    error = state.error.fields["steps"]["a"]["error"]
    assert error["code"] == "journal.value"
    assert "bytes encoded" in error["reason"]
    assert f"{MAX_RECORD_BYTES - 4:,} bytes" in error["message"]
    _verify(tmp_path / "data", run_id)


def test_outputs_that_fit_one_by_one_but_not_together_keep_a_stand_in(tmp_path):
    plan = {
        "name": "two-halves",
        "steps": [
            {"id": "a", "tool": "python", "args": {"function": "test.half"}},
            {"id": "b", "tool": "python", "args": {"function": "test.half"}},
        ],
        "outputs": {"a": "${steps.a.output}", "b": "${steps.b.output}"},
    }
    [(run_id, state)] = _run_all(tmp_path / "data", [plan])
    assert state.status == "succeeded"
    _verify(tmp_path / "data", run_id)
    from tiffany.durable import RecordType, scan
    from tiffany.durable.history import decoded_records

    info = scan(tmp_path / "data" / "wal").get(run_id)
    [end] = [
        rec
        for _s, rtype, rec in decoded_records(tmp_path / "data" / "wal", info)
        if rtype == RecordType.RUN_END
    ]
    assert isinstance(end.value, Unencodable)
    assert end.value.repr.startswith("{'outputs': {'a': 'yyy")
