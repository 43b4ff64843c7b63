"""Child runs (``plan.run``): bounded trees, and a cancel that closes a tree before it cancels it.

In-process engines (``tiffany.engine.build``), the loop run until it has
nothing left to do: a run waiting for a signal stays waiting, and the test
acts between two passes, as the control channel's queued calls do.
"""

from __future__ import annotations

from typing import Any

import pytest

from tiffany.engine import build
from tiffany.engine.children import ChildLimits, RunTree
from tiffany.errors import LimitExceeded
from tiffany.kernel import Sleep

TOOLS = ["plan.run", "signal.wait", "file.write", "sleep"]
KID = {
    "name": "kid",
    "steps": [{"id": "gate", "tool": "signal.wait", "args": {"name": "go"}}],
    "outputs": {"by": "${steps.gate.output.by}"},
}
PARENT = {
    "name": "parent",
    "steps": [{"id": "sub", "tool": "plan.run", "args": {"plan": KID}}],
    "outputs": {"by": "${steps.sub.output.by}"},
}


@pytest.fixture
def engine(settings):
    engine = build(settings.model_copy(update={"max_children": 3}), enabled_tools=TOOLS)
    yield engine
    engine.runtime.close()


def _statuses(engine: Any, *run_ids: str) -> list[str]:
    return [engine.runtime.status(r).status for r in run_ids]


#: Wait stages a test lets pass before it looks (a run that never ends fails it, not hangs).
MAX_TICKS = 5_000


def _until_ended(engine: Any, *run_ids: str) -> None:
    """Run the loop with wait stages coming (the engine's inbox does that) until the runs end."""
    runs = engine.runtime.journal.runs

    def ticker() -> Any:
        for _ in range(MAX_TICKS):
            if all(runs[r].status != "running" for r in run_ids):
                return
            yield Sleep(0.002)

    engine.runtime.sched.spawn(ticker(), name="ticker")
    engine.runtime.run()


def test_a_cancel_stops_the_tree_growing_before_it_reaches_any_task(engine) -> None:
    parent = engine.submit_plan(PARENT)
    engine.runtime.run()  # until the child waits for "go"
    child = f"{parent}.sub.1"
    assert _statuses(engine, parent, child) == ["running", "running"]
    assert engine.cancel(parent)
    # Nothing of the cancel has reached a task yet (that is the next wait stage),
    # yet neither the parent nor the child starts a child any more.
    for under in (parent, child):
        refused = engine.start_child(under, "more", f"{under}.more.1", KID, {})
        assert refused["refused"]["code"] == "plan.tree_closed", refused
        assert f"{under}.more.1" not in engine.runtime.journal.runs
    _until_ended(engine, parent, child)
    assert _statuses(engine, parent, child) == ["cancelled", "cancelled"]
    assert len(engine.tree) == 0  # a finished tree leaves nothing behind


def test_a_run_starts_no_more_children_than_its_bound(engine) -> None:
    parent = engine.submit_plan(PARENT)
    engine.runtime.run()
    answers = [engine.start_child(parent, "more", f"{parent}.more.{i}", KID, {}) for i in (1, 2, 3)]
    assert [a.get("run_id") for a in answers[:2]] == [f"{parent}.more.1", f"{parent}.more.2"]
    refused = answers[2]["refused"]
    assert refused["code"] == "limit.max_children"
    assert (refused["setting"], refused["limit"]) == ("TIFFANY_MAX_CHILDREN", 3)
    assert "TIFFANY_MAX_CHILDREN (3)" in refused["message"]
    assert f"{parent}.more.3" not in engine.runtime.journal.runs
    engine.cancel(parent)
    _until_ended(engine, parent, f"{parent}.more.1", f"{parent}.more.2")


def test_the_engines_own_signals_end_a_child_and_a_clients_signal_id_cannot_swallow_them(
    engine,
) -> None:
    parent = engine.submit_plan(PARENT)
    engine.runtime.run()
    child = f"{parent}.sub.1"
    journal = engine.runtime.journal
    # A client's signal that borrows the id the engine gives the child's end.
    assert journal.request_signal(parent, "note", 1, f"end:{child}", lambda seq, ended: None)
    assert journal.request_signal(child, "go", {"by": "alice"}, "go-1", lambda seq, ended: None)
    _until_ended(engine, parent)
    state = engine.runtime.status(parent)
    assert state.status == "succeeded", state.error
    assert state.result["outputs"] == {"by": "alice"}


def _tree(**limits: int) -> tuple[RunTree, list[tuple[str, str]]]:
    cancels: list[tuple[str, str]] = []
    bounds = {"max_child_depth": 2, "max_children": 10, "max_descendants": 10, **limits}
    tree = RunTree(ChildLimits(**bounds), lambda run, why: cancels.append((run, why)))
    return tree, cancels


def _start(tree: RunTree, parent: str, child: str) -> dict[str, Any]:
    fields = tree.admit(parent)
    tree.started(parent, child, fields)
    return fields


def test_depth_and_descendants_are_counted_over_the_whole_tree() -> None:
    tree, _ = _tree(max_descendants=4)
    assert _start(tree, "r", "r.a.1") == {"root": "r", "depth": 1, "descendant": 1}
    assert _start(tree, "r.a.1", "r.a.1.b.1") == {"root": "r", "depth": 2, "descendant": 2}
    with pytest.raises(LimitExceeded) as deep:
        tree.admit("r.a.1.b.1")
    assert deep.value.code == "limit.max_child_depth"
    assert deep.value.fields["setting"] == "TIFFANY_MAX_CHILD_DEPTH"
    _start(tree, "r", "r.c.1")
    _start(tree, "r.c.1", "r.c.1.d.1")
    with pytest.raises(LimitExceeded) as wide:
        tree.admit("r.c.1")
    assert wide.value.code == "limit.max_descendants"
    assert "TIFFANY_MAX_DESCENDANTS (4)" in wide.value.message


def test_a_restarted_engine_counts_on_from_the_entries_and_cancels_orphans() -> None:
    tree, _ = _tree(max_descendants=4)
    runs = [
        ("r", None, True),
        ("r.a.1", {"run_id": "r", "root": "r", "depth": 1, "descendant": 1}, False),
        ("r.b.1", {"run_id": "r", "root": "r", "depth": 1, "descendant": 2}, True),
        ("r.b.1.c.1", {"run_id": "r.b.1", "root": "r", "depth": 2, "descendant": 3}, True),
        # An entry written before entries carried the counts: its parent's.
        ("r.b.1.d.1", {"run_id": "r.b.1", "step": "d"}, False),
        ("gone.x.1", {"run_id": "gone", "root": "gone", "depth": 1, "descendant": 1}, True),
    ]
    assert tree.recover(runs) == ["gone.x.1"]  # its parent ended: the caller cancels it
    with pytest.raises(LimitExceeded) as wide:
        tree.admit("r")  # 4 runs counted in r's tree already
    assert wide.value.code == "limit.max_descendants"
    with pytest.raises(LimitExceeded) as deep:
        tree.admit("r.b.1.c.1")
    assert deep.value.code == "limit.max_child_depth"
    assert tree.running_children("r.b.1") == ["r.b.1.c.1"]
