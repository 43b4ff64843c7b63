"""The plan graph a run built (``tiffany/store/graph.py``): plan steps, dynamic children."""

from __future__ import annotations

from tiffany.store.graph import plan_graph

PLAN = {
    "name": "p",
    "steps": [
        {"id": "a", "tool": "sleep"},
        {"id": "plan", "tool": "llm", "after": ["a"], "dynamic": True},
        {"id": "z", "tool": "sleep", "after": ["a", "plan"]},
    ],
}


def _shape(graph: dict) -> list[tuple]:
    return [(sid, n.after, n.added_by, n.dynamic) for sid, n in graph.items()]


def test_before_the_dynamic_step_ends_the_graph_is_the_plans() -> None:
    assert _shape(plan_graph(PLAN, {})) == [
        ("a", [], None, False),
        ("plan", ["a"], None, True),
        ("z", ["a", "plan"], None, False),
    ]


def test_children_run_after_their_parent_and_say_who_added_them_nested_too() -> None:
    outputs = {
        "plan": {
            "steps": [
                {"id": "k1", "tool": "sleep"},
                {"id": "k2", "tool": "llm", "after": ["k1"], "dynamic": True},
                {"id": "a", "tool": "sleep"},  # a known id: the planner refused it
                "not a step",
            ]
        },
        "k2": {"steps": [{"id": "g1", "tool": "sleep", "after": ["z"]}]},
    }
    graph = plan_graph(PLAN, outputs)
    assert _shape(graph) == [
        ("a", [], None, False),
        ("plan", ["a"], None, True),
        ("z", ["a", "plan"], None, False),
        ("k1", ["plan"], "plan", False),
        ("k2", ["k1", "plan"], "plan", True),
        ("g1", ["k2", "z"], "k2", False),
    ]
    assert graph["k1"].spec == {"id": "k1", "tool": "sleep"}


def test_no_plan_is_an_empty_graph_and_a_plain_steps_output_adds_nothing() -> None:
    assert plan_graph(None, {}) == {}
    assert plan_graph({"steps": "nope"}, {}) == {}
    plain = {"steps": [{"id": "a", "tool": "llm"}]}
    assert list(plan_graph(plain, {"a": {"steps": [{"id": "b"}]}})) == ["a"]
