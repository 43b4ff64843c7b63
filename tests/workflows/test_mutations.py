"""Mutation suite: a workflow recorded, its code changed, the run replayed (``--verify``).

Each change that alters the yields is a divergence naming the run, the
task, the seq, the expected and actual call, and the user's file:line of
the yield; a change guarded by ``patched`` is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiffany.durable.runtime import verify
from tiffany.engine import build, replay_resolvers
from tiffany.kernel import NewTask, Sleep, Step, WaitTask
from tiffany.workflows import patched, register, tool, unregister

NAME = "tests.mutant"
HERE = Path(__file__).resolve()


def a(x: int) -> int:
    return x + 1


def b(x: int) -> int:
    return x + 2


def c(x: int) -> int:
    return x + 3


def original():
    x = yield Step(a, 1)
    y = yield Step(b, 2)
    yield tool("sleep", seconds=0)
    return {"x": x, "y": y}


def reordered():
    y = yield Step(b, 2)
    x = yield Step(a, 1)
    yield tool("sleep", seconds=0)
    return {"x": x, "y": y}


def changed_arguments():
    x = yield Step(a, 1)
    y = yield Step(b, 2)
    yield tool("sleep", seconds=0.001)
    return {"x": x, "y": y}


def extra_step():
    x = yield Step(a, 1)
    yield Step(c, 0)
    y = yield Step(b, 2)
    yield tool("sleep", seconds=0)
    return {"x": x, "y": y}


def removed_step():
    x = yield Step(a, 1)
    yield tool("sleep", seconds=0)
    return {"x": x, "y": 4}


def _line_of(fn: Callable[..., Any], text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return first + i
    raise AssertionError(f"{text!r} not in {fn.__name__}")


def _record(settings, fn: Callable[..., Any], inputs: dict[str, Any] | None = None) -> str:
    unregister(NAME)
    register(NAME, fn)
    engine = build(settings, enabled_tools=["sleep"])
    try:
        entry, name = engine.prepare_workflow(NAME, inputs or {})
        run_id = engine.start_entry(entry, name=name)
        engine.runtime.run()
        assert engine.runtime.status(run_id).status == "succeeded"
    finally:
        engine.runtime.close()
    return run_id


def _verify(settings, run_id: str, fn: Callable[..., Any]) -> Any:
    unregister(NAME)
    register(NAME, fn)
    try:
        return verify(settings.data_dir, run_id, replay_resolvers(settings))
    finally:
        unregister(NAME)


def test_the_unchanged_code_replays_identically(settings) -> None:
    run_id = _record(settings, original)
    report = _verify(settings, run_id, original)
    assert report.ok, report.to_dict()


@pytest.mark.parametrize(
    ("mutant", "marker", "expected", "actual"),
    [
        (reordered, "y = yield Step(b, 2)", ":a", ":b"),
        (changed_arguments, 'yield tool("sleep", seconds=0.001)', "tool:sleep#", "tool:sleep#"),
        (extra_step, "yield Step(c, 0)", ":b", ":c"),
    ],
    ids=["reordered", "changed-arguments", "extra-step"],
)
def test_a_change_of_the_yields_is_named_with_its_source_line(
    settings, mutant, marker, expected, actual
) -> None:
    run_id = _record(settings, original)
    report = _verify(settings, run_id, mutant)
    assert not report.ok
    div = report.divergence
    assert div is not None, report.to_dict()
    fields = div
    assert fields["run_id"] == run_id
    assert fields["task"] == 1
    assert isinstance(fields["seq"], int)
    assert fields["seq"] > 0
    assert fields["source"].startswith(f"{HERE}:{_line_of(mutant, marker)} ")
    message = div["message"]
    assert f"run {run_id}:" in message
    assert f"at {HERE}:{_line_of(mutant, marker)} ({mutant.__name__})" in message
    assert f"(seq {fields['seq']})" in message
    assert expected in str(fields["expected"])
    assert actual in str(fields["actual"])
    assert fields["expected"] != fields["actual"]


def test_a_removed_step_is_a_divergence_at_the_runs_end(settings) -> None:
    run_id = _record(settings, original)
    report = _verify(settings, run_id, removed_step)
    assert not report.ok
    div = report.divergence
    assert div is not None, report.to_dict()
    assert div["run_id"] == run_id
    assert "diverged from the journal" in div["message"]
    assert f"at {HERE}:{_line_of(removed_step, 'yield tool')}" in div["message"]
    assert "step" in str(div["expected"])


_START = time.time()  # noqa: TID251 - the mistake this test makes on purpose


def wall_clock():
    # The mistake: time read outside a system call. Recorded and replayed
    # at different times, the Sleep's argument differs.
    yield Sleep(round(time.time() - _START, 6))  # noqa: TID251
    return {}


def test_a_wall_clock_read_is_a_divergence_at_the_yield_it_changes(settings) -> None:
    global _START
    # From now: the recorded Sleep is a few ms, and the replay's (later) longer.
    # From the module's import it was as long as the suite had run (once > 300 s).
    _START = time.time()  # noqa: TID251
    run_id = _record(settings, wall_clock)
    report = _verify(settings, run_id, wall_clock)
    assert not report.ok
    fields = report.divergence
    assert fields["expected"][2] == "sleep"
    assert fields["actual"][2] == "sleep"
    assert fields["expected"][3] != fields["actual"][3]
    assert fields["source"].startswith(f"{HERE}:{_line_of(wall_clock, 'yield Sleep')} ")
    # The hint names the function and the fix (read from its code when the error is made).
    assert "wall_clock uses time (use yield Now())" in fields["hint"]
    assert fields["hint"] in fields["message"]


def test_a_divergence_with_no_suspect_read_has_no_hint(settings) -> None:
    run_id = _record(settings, original)
    assert _verify(settings, run_id, reordered).divergence["hint"] is None


def before_patch():
    x = yield Step(a, 1)
    return {"x": x}


def after_patch():
    x = yield Step(a, 1)
    if (yield patched("add-c")):
        x = yield Step(c, x)
    return {"x": x}


def test_patched_is_false_replaying_a_run_recorded_before_it_and_true_in_new_runs(
    settings,
) -> None:
    old_run = _record(settings, before_patch)
    report = _verify(settings, old_run, after_patch)
    assert report.ok, report.to_dict()
    new_run = _record(settings, after_patch)
    assert _verify(settings, new_run, after_patch).ok
    # The new run recorded the marker: the old code no longer replays it.
    report = _verify(settings, new_run, before_patch)
    assert not report.ok
    assert "patched" in str(report.divergence["expected"])


def patched_branch(tag: str):
    x = yield Step(a, 1)
    yield Sleep(0.001)
    if (yield patched("fan")):
        x = yield Step(c, x)
    return x


def fanned_before():
    tids = []
    for t in ("p", "q"):
        tids.append((yield NewTask(_old_branch(t), name=f"branch-{t}")))
    out = []
    for tid in tids:
        out.append((yield WaitTask(tid)))
    return {"r": out}


def _old_branch(tag: str):
    x = yield Step(a, 1)
    yield Sleep(0.001)
    return x


def fanned_after():
    tids = []
    for t in ("p", "q"):
        tids.append((yield NewTask(patched_branch(t), name=f"branch-{t}")))
    out = []
    for tid in tids:
        out.append((yield WaitTask(tid)))
    return {"r": out}


def test_patched_markers_under_a_fan_out_of_tasks(settings) -> None:
    old_run = _record(settings, fanned_before)
    assert _verify(settings, old_run, fanned_after).ok
    new_run = _record(settings, fanned_after)
    assert _verify(settings, new_run, fanned_after).ok


def test_verify_of_a_workflow_whose_module_is_not_imported_says_so(settings) -> None:
    run_id = _record(settings, original)
    unregister(NAME)
    report = verify(settings.data_dir, run_id, replay_resolvers(settings))
    assert not report.ok
    assert report.problems
    assert f"unknown workflow {NAME!r}" in report.problems[0]
    assert "--import" in report.problems[0]
