"""Values the journal cannot record fail their step, never the engine.

A python tool returned an integer past 64 bits, a mapping with such a key,
or more than a record holds (``MAX_RECORD_BYTES``): the journal raised, the
kernel stopped on its critical instrument, and ``tiffany serve`` restarted an
engine that recovered the run, met the same value and died again, taking
every run on the engine with it. Now the step fails with
``journal.value`` (retries apply), a plan's outputs too large for one
record are kept as their stand-in, and both replay identically.

A value that does not encode inside a result that does (``{"x": object()}``,
a list or a dataclass holding one) is kept as a stand-in in place. The
replay rebuilds the result around the stand-in, which packs as itself: a
``replay --verify`` of such a run, and its recovery from a crash at any
record, used to end in a divergence at the worker's exit (the whole
``StepOutcome`` had been kept as the repr of the live object).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from walcut import cut_wal

from tiffany.agents.tools.python import register_function, unregister_function
from tiffany.config import Settings
from tiffany.durable import Runtime, verify
from tiffany.engine import build, replay_resolvers
from tiffany.errors import UnjournalableValue
from tiffany.wal import MAX_RECORD_BYTES, iter_records
from tiffany.wire.values import Unencodable


@dataclass
class _Holder:
    value: Any


_FUNCTIONS = {
    "test.huge_int": lambda: {"n": 2**100},
    "test.huge_key": lambda: {2**70: "x"},
    "test.too_large": lambda: "x" * MAX_RECORD_BYTES,
    "test.half": lambda: "y" * (MAX_RECORD_BYTES * 5 // 8),
    "test.small": lambda: 7,
    "test.object_in_dict": lambda: {"x": object(), "n": 1},
    "test.object_in_list": lambda: [1, object()],
    "test.object": object,
    "test.object_in_dataclass": lambda: _Holder({"x": object(), "t": (1, 2)}),
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


_STAND_INS = {
    "name": "stand-ins",
    "steps": [
        {"id": "d", "tool": "python", "args": {"function": "test.object_in_dict"}},
        {"id": "l", "tool": "python", "args": {"function": "test.object_in_list"}},
        {"id": "o", "tool": "python", "args": {"function": "test.object"}},
        {"id": "h", "tool": "python", "args": {"function": "test.object_in_dataclass"}},
        {
            "id": "t",
            "tool": "python",
            "timeout_s": 30,  # a tool task: its exit holds the bare result
            "args": {"function": "test.object_in_dict"},
            "after": ["d", "l", "o", "h"],
        },
    ],
    "outputs": {"n": "${steps.d.output.n}", "l": "${steps.l.output}"},
}


def test_a_result_holding_a_stand_in_replays_and_recovers_from_any_record(tmp_path):
    [(run_id, state)] = _run_all(tmp_path / "full", [_STAND_INS])
    assert state.status == "succeeded", state.error
    assert state.result["outputs"]["n"] == 1
    _verify(tmp_path / "full", run_id)
    # What the journal keeps: the structure, the object's repr in its place.
    from tiffany.durable import RecordType, scan
    from tiffany.durable.history import decoded_records

    info = scan(tmp_path / "full" / "wal").get(run_id)
    exits = [
        rec.value
        for _s, rtype, rec in decoded_records(tmp_path / "full" / "wal", info)
        if rtype == RecordType.TASK_EXIT and isinstance(rec.value, dict) and "ok" in rec.value
    ]
    outputs = {e["step_id"]: e["output"] for e in exits}
    assert outputs["d"]["n"] == 1
    assert isinstance(outputs["d"]["x"], Unencodable)
    assert outputs["d"]["x"].repr.startswith("<object object at 0x")
    assert isinstance(outputs["h"]["value"]["x"], Unencodable)

    # A crash after any record: the run recovers, finishes and verifies.
    n = sum(1 for _ in iter_records(tmp_path / "full" / "wal"))
    for keep in range(1, n):
        data = tmp_path / f"cut{keep}"
        cut_wal(tmp_path / "full" / "wal", data / "wal", keep)
        engine = build(Settings(data_dir=data), enabled_tools=["python"])
        with engine.runtime as rt:
            assert engine.recover_runs() == [run_id], keep
            rt.run()
            recovered = rt.status(run_id)
        assert recovered.status == "succeeded", (keep, recovered.error)
        _verify(data, run_id)


# -- data that makes encoding raise: lone surrogates, cycles, hostile reprs ----------------
#
# A result holding a lone surrogate (a JSON "\ud800" escape, decoded) raised
# UnicodeEncodeError, a ValueError the journal did not catch, in its
# task_woken hook: the engine stopped, recovery ran the step again and
# stopped again, for good. Every record is now encoded under one rule
# (durable/recorder.py): a value from outside is refused (journal.value),
# text a record must hold anyway is kept escaped.

_POISON = "x\ud800y"
_FUNCTIONS.update(
    {
        "test.surrogate": lambda: {"json": {"a": _POISON}},
        "test.surrogate_key": lambda: {_POISON: 1},
        "test.raise_surrogate": lambda: (_ for _ in ()).throw(ValueError(f"bad {_POISON}")),
    }
)


def _workflow(data_dir: Path, target: str) -> tuple[str, Any]:
    with Runtime(data_dir) as rt:
        run_id = rt.submit(target)
        rt.run()
        return run_id, rt.status(run_id)


@pytest.mark.parametrize("timeout_s", [None, 30], ids=["in-worker", "tool-task"])
def test_a_result_holding_a_lone_surrogate_fails_its_step_and_the_engine_goes_on(
    tmp_path, timeout_s
):
    extra = {} if timeout_s is None else {"timeout_s": timeout_s}
    plans = [
        _plan("test.surrogate", retries=1, backoff=0, **extra),
        _plan("test.surrogate_key", **extra),
        _plan("test.small", **extra),
    ]
    (value, s1), (key, s2), (small, s3) = _run_all(tmp_path / "data", plans)
    for state in (s1, s2):
        assert state.status == "failed"
        error = state.error.fields["steps"]["a"]["error"]
        assert error["code"] == "journal.value", error
        assert error["reason"].startswith("UnicodeEncodeError"), error
        assert "valid Unicode" in error["message"]
    assert len(s1.error.fields["steps"]["a"]["attempts"]) == 2  # its retries applied
    assert s3.status == "succeeded"
    for run_id in (value, key, small):
        _verify(tmp_path / "data", run_id)


def test_an_error_message_holding_a_lone_surrogate_is_kept_escaped(tmp_path):
    [(run_id, state)] = _run_all(tmp_path / "data", [_plan("test.raise_surrogate")])
    assert state.status == "failed"
    error = state.error.fields["steps"]["a"]["error"]
    assert error["code"] == "tool.python.error", error
    assert error["message"].endswith("ValueError: bad x\\ud800y"), error  # kept escaped
    _verify(tmp_path / "data", run_id)


def test_results_with_no_journaled_form_fail_their_step_in_a_workflow(tmp_path):
    run_id, state = _workflow(tmp_path / "data", "poison_workloads:poisoned_results")
    assert state.status == "succeeded", state.error
    assert state.result == [
        ["surrogate", "journal.value", "UnicodeEncodeError"],
        ["surrogate_key", "journal.value", "UnicodeEncodeError"],
        ["cyclic", "journal.value", "RecursionError"],
        ["deep", "journal.value", "RecursionError"],
    ]
    _verify(tmp_path / "data", run_id)


def test_errors_reach_the_task_as_the_journal_keeps_them(tmp_path):
    run_id, state = _workflow(tmp_path / "data", "poison_workloads:poisoned_errors")
    assert state.status == "succeeded", state.error
    surrogate, cyclic = state.result
    assert surrogate == "('bad x\\\\ud800y', {'k': 'x\\\\ud800y'})"  # what a replay sees
    assert cyclic.startswith("[1, [...]]")  # its argument: the stand-in of the list
    _verify(tmp_path / "data", run_id)


def test_a_repr_that_raises_or_holds_a_surrogate_makes_a_stand_in(tmp_path):
    run_id, state = _workflow(tmp_path / "data", "poison_workloads:stand_ins")
    assert state.status == "succeeded", state.error
    _verify(tmp_path / "data", run_id)
    from tiffany.durable import RecordType, scan
    from tiffany.durable.history import decoded_records

    info = scan(tmp_path / "data" / "wal").get(run_id)
    [end] = [
        rec.value
        for _s, rtype, rec in decoded_records(tmp_path / "data" / "wal", info)
        if rtype == RecordType.RUN_END
    ]
    assert end == {
        "bad": Unencodable("<BadRepr object: repr() raised RuntimeError>"),
        "sur": Unencodable("<SurrogateRepr x\\ud800y>"),
        "n": 1,
    }


def test_names_from_data_are_journaled_escaped_and_replay(tmp_path):
    run_id, state = _workflow(tmp_path / "data", "poison_workloads:poisoned_names")
    assert state.status == "succeeded", state.error
    assert state.result == 3
    _verify(tmp_path / "data", run_id)
    from tiffany.durable import RecordType, scan
    from tiffany.durable.history import decoded_records

    info = scan(tmp_path / "data" / "wal").get(run_id)
    names = [
        rec.name
        for _s, rtype, rec in decoded_records(tmp_path / "data" / "wal", info)
        if rtype in (RecordType.SPAWN, RecordType.STEP_START)
    ]
    assert "child-x\\ud800y" in names
    assert any(n.startswith("step-x\\ud800yzzz") for n in names)
    assert "<BadRepr object: str() raised RuntimeError>" in names


@pytest.mark.parametrize(
    ("target", "status"),
    [("poisoned_result", "succeeded"), ("poisoned_crash", "failed")],
)
def test_a_run_ending_with_a_surrogate_ends_and_replays(tmp_path, target, status):
    run_id, state = _workflow(tmp_path / "data", f"poison_workloads:{target}")
    assert state.status == status, state.error
    _verify(tmp_path / "data", run_id)


def test_an_entry_or_signal_with_no_journaled_form_is_refused_to_its_sender(tmp_path):
    import poison_workloads

    with Runtime(tmp_path / "data") as rt:
        with pytest.raises(UnjournalableValue) as info:
            rt.submit("poison_workloads:echo", _POISON)
        assert info.value.code == "journal.value"
        assert not rt.journal.runs  # nothing started, nothing journaled
        run_id = rt.submit("poison_workloads:waits_for_signal")
        for payload in ({"a": _POISON}, poison_workloads._cyclic(), 2**64):
            with pytest.raises(UnjournalableValue, match="cannot be journaled"):
                rt.journal.request_signal(run_id, "go", payload, "s1", lambda seq, ended: None)
        rt.journal.request_signal(run_id, "go", {"ok": 1}, "s2", lambda seq, ended: None)
        rt.run()
        assert rt.status(run_id).result == {"ok": 1}
    _verify(tmp_path / "data", run_id)


def test_poisoned_runs_recover_from_a_crash_at_any_record(tmp_path):
    full = tmp_path / "full"
    run_ids = []
    with Runtime(full) as rt:
        for target in ("poisoned_results", "poisoned_errors", "poisoned_names"):
            run_ids.append(rt.submit(f"poison_workloads:{target}"))
        rt.run()
        expected = {r: rt.status(r).result for r in run_ids}
    n = sum(1 for _ in iter_records(full / "wal"))
    for keep in range(1, n, 3):
        data = tmp_path / f"cut{keep}"
        cut_wal(full / "wal", data / "wal", keep)
        with Runtime(data) as rt:
            resumed = rt.recover()
            rt.run()
            for run_id in resumed:
                state = rt.status(run_id)
                assert (state.status, state.result) == ("succeeded", expected[run_id]), keep
        from tiffany.durable import scan

        for run_id in scan(data / "wal").runs:
            _verify(data, run_id)


def test_a_child_runs_outputs_too_large_for_its_end_signal_fail_the_parents_step(tmp_path):
    """A child plan's outputs fit its RUN_END only as a stand-in; sent whole to its
    parent as a signal they made a record past the WAL's limit, on the loop."""
    child = {
        "name": "halves",
        "steps": [
            {"id": "a", "tool": "python", "args": {"function": "test.half"}},
            {"id": "b", "tool": "python", "args": {"function": "test.half"}},
        ],
        "outputs": {"a": "${steps.a.output}", "b": "${steps.b.output}"},
    }
    parent = {
        "name": "parent",
        "steps": [{"id": "sub", "tool": "plan.run", "args": {"plan": child}}],
    }
    engine = build(Settings(data_dir=tmp_path / "data"), enabled_tools=["python", "plan.run"])
    with engine.runtime as rt:
        run_id = engine.submit_plan(parent)
        small = engine.submit_plan(_plan("test.small"))
        rt.run()
        state, other = rt.status(run_id), rt.status(small)
    assert other.status == "succeeded"
    assert state.status == "failed"
    error = state.error.fields["steps"]["sub"]["error"]
    assert error["code"] == "plan.child_failed", error
    assert "cannot be journaled" in error["message"]
    _verify(tmp_path / "data", run_id)
