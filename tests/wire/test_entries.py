"""A run's entry read once into its typed kind (tiffany/wire/entries.py)."""

from __future__ import annotations

import pytest

from tiffany.agents import plan_entry
from tiffany.wire.entries import (
    CallableEntry,
    EntryKind,
    MalformedEntry,
    PlanEntry,
    WorkflowEntry,
    entry_kind,
    read_entry,
    reading,
)


def test_a_plan_entry_is_the_built_in_workflow_plan() -> None:
    raw = {
        **plan_entry({"name": "p", "budget": {"usd": 1.0}, "steps": []}, {"x": 1}),
        "concurrency": {"key": "k", "limit": 2},
        "limits": {"max_steps": 50},
        "rerun_of": {"run_id": "run-1", "restart": ["b"]},
        "reuse": {"a": {"run_id": "run-1", "seq": 3, "output": 1}},
        "parent": {"run_id": "run-0", "step": "s"},
        "newer": "ignored",
    }
    entry = read_entry(raw)
    assert isinstance(entry, PlanEntry)
    assert (entry.kind, entry.runner, entry.workflow_name) == (EntryKind.PLAN, "workflow", "plan")
    assert entry.plan_doc == raw["plan"]
    assert entry.run_inputs == {"x": 1}
    assert (entry.concurrency_key, entry.max_steps, entry.rerun_source) == ("k", 50, "run-1")
    assert entry.budget_spec == {"usd": 1.0}
    assert entry.parent == {"run_id": "run-0", "step": "s"}
    assert read_entry(entry) is entry


def test_a_workflow_and_a_callable_entry_read_as_theirs() -> None:
    flow = read_entry(
        {"kind": "workflow", "workflow": "w", "inputs": {"n": 1}, "budget": {"tokens": 5}}
    )
    assert isinstance(flow, WorkflowEntry)
    assert (flow.runner, flow.workflow_name, flow.plan_doc) == ("workflow", "w", None)
    assert (flow.run_inputs, flow.budget_spec, flow.concurrency_key) == (
        {"n": 1},
        {"tokens": 5},
        None,
    )
    call = read_entry({"kind": "callable", "target": "m:f", "args": [1], "kwargs": {}})
    assert isinstance(call, CallableEntry)
    assert (call.runner, call.workflow_name, call.plan_doc) == ("callable", None, None)
    assert call.run_inputs == {"args": [1], "kwargs": {}}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (None, "entry"),
        ({"plan": {}}, "kind"),
        ({"kind": "nope"}, "kind"),
        ({"kind": "plan"}, "plan"),
        ({"kind": "plan", "plan": 3}, "plan"),
        ({"kind": "plan", "plan": {}, "inputs": [1]}, "inputs"),
        (
            {"kind": "plan", "plan": {}, "concurrency": {"key": "k", "limit": "2"}},
            "concurrency.limit",
        ),
        ({"kind": "workflow", "inputs": {}}, "workflow"),
        ({"kind": "callable", "target": 5}, "target"),
    ],
)
def test_a_malformed_entry_is_refused_naming_the_field(raw: object, field: str) -> None:
    with pytest.raises(MalformedEntry) as caught:
        read_entry(raw)
    assert caught.value.fields["field"] == field
    assert reading(raw) is None


def test_the_kind_alone_is_read_leniently() -> None:
    assert entry_kind({"kind": "plan"}) is EntryKind.PLAN
    assert entry_kind({"kind": "nope"}) is None
    assert entry_kind(None) is None
