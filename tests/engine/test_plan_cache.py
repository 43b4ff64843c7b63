"""A plan submitted again is not validated again (tiffany/engine/plan_cache.py)."""

from __future__ import annotations

import copy

import pytest

from tiffany.agents import PlanError
from tiffany.engine import build
from tiffany.engine.plan_cache import PlanCache

PLAN = {
    "name": "twice",
    "inputs": {"who": "x"},
    "steps": [
        {"id": "a", "tool": "sleep", "args": {"seconds": 0}},
        {"id": "b", "tool": "sleep", "args": {"seconds": 0}, "after": ["a"]},
    ],
}


@pytest.fixture
def engine(settings):
    engine = build(settings, enabled_tools=["sleep", "file.write"])
    yield engine
    engine.runtime.close()


def test_the_same_plan_again_is_served_from_the_cache(engine) -> None:
    _, name = engine.prepare_plan(PLAN, {"who": "y"})
    assert (name, engine.plans.hits) == ("twice", 0)
    # Another copy of the same document (a re-run's plan is the store's copy), other inputs.
    entry, name = engine.prepare_plan(copy.deepcopy(PLAN), {"who": "z"})
    assert (name, engine.plans.hits) == ("twice", 1)
    assert entry["inputs"] == {"who": "z"}
    # The planner finds the plan for this entry (kept for its document).
    assert engine.env.validated_plan(entry["plan"]) is not None


def test_inputs_are_checked_every_time(engine) -> None:
    engine.prepare_plan(PLAN, {})
    with pytest.raises(PlanError) as info:
        engine.prepare_plan(PLAN, {"nobody": 1})
    assert info.value.errors[0]["loc"] == "inputs.nobody"


def test_another_document_or_another_tool_set_is_validated_again() -> None:
    cache = PlanCache()
    calls = []

    def validate():
        calls.append(1)
        return object()

    cache.get(PLAN, ("sleep",), validate)
    cache.get(PLAN, ("sleep",), validate)
    cache.get({**PLAN, "name": "other"}, ("sleep",), validate)
    cache.get(PLAN, ("sleep", "http"), validate)  # a tool enabled since: the answer may differ
    assert (len(calls), cache.hits) == (3, 1)


def test_a_refused_plan_is_not_kept() -> None:
    cache = PlanCache()

    def refuse():
        raise PlanError([{"loc": "steps", "msg": "no"}])

    for _ in range(2):
        with pytest.raises(PlanError):
            cache.get(PLAN, (), refuse)
    assert cache.hits == 0


def test_the_cache_keeps_the_newest() -> None:
    cache = PlanCache(size=2)
    for name in ("a", "b", "a", "c"):  # "a" used again: "b" is the oldest when "c" comes
        cache.get({"name": name}, (), object)
    cache.get({"name": "a"}, (), object)
    assert cache.hits == 2
    again = []
    cache.get({"name": "b"}, (), lambda: again.append("b") or object())
    assert again == ["b"]  # dropped for "c", so validated again
    cache.get({"name": "a"}, (), lambda: pytest.fail("a, used last but one, is kept"))
