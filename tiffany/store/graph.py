"""The plan graph a run built: its plan's steps and those its dynamic steps added.

A plan run's DAG is its plan's steps (``after`` edges) and, for each step
marked ``dynamic`` that succeeded, the steps its output's ``steps`` holds:
each runs after its parent (the planner adds the parent to its ``after``:
``tiffany/agents/planner.py``, ``_extend``), and may be dynamic in turn.
:func:`plan_graph` is that rule, read from what the store holds (the run's
entry and its steps' outputs); the run detail (``GET /api/runs/{id}``: each
step's ``after``, ``added_by`` and ``dynamic``) and a re-run's choice of
the steps it reuses (``tiffany/agents/rerun.py``) both ask it.

Invariants:
    * Every step id appears once, in the planner's order: the plan's steps,
      then each dynamic parent's children in its output's order, the
      children of a child after those of its parent.
    * A child's ``after`` holds its parent (added when the child did not
      name it) and is sorted, as the planner's is.
    * A child whose id is already in the graph is left out: the planner
      refuses such a parent (``plan.dynamic``), so the run never had it.

Rejected: projecting ``after`` and ``added_by`` into the steps table when
the fold sees a dynamic parent settle (a migration, and a second copy of
what the entry and the outputs already say, to keep in step with them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GraphNode", "plan_graph"]


@dataclass(slots=True)
class GraphNode:
    """One step of the graph.

    Attributes:
        step_id: The step's id.
        spec: The step as declared (the plan's, or its dynamic parent's output's).
        after: The steps it runs after (sorted for a dynamic child).
        added_by: The dynamic step whose output added it; None for a plan step.
        dynamic: Whether its own output adds steps.
    """

    step_id: str
    spec: Mapping[str, Any]
    after: list[str] = field(default_factory=list)
    added_by: str | None = None
    dynamic: bool = False


def plan_graph(plan: Any, outputs: Mapping[str, Any]) -> dict[str, GraphNode]:
    """The graph of a plan run: ``step id -> GraphNode``, in the planner's order.

    Args:
        plan: The run's plan document (its entry's ``plan``); anything else
            is an empty graph.
        outputs: The outputs of the run's steps by id (a dynamic step's holds
            ``{"steps": [...]}`` once it succeeded; missing: not yet).
    """
    nodes: dict[str, GraphNode] = {}
    declared = plan.get("steps") if isinstance(plan, Mapping) else None
    todo: list[str] = []
    for spec in declared if isinstance(declared, list) else ():
        if isinstance(spec, Mapping) and isinstance(spec.get("id"), str):
            node = _node(spec, [str(a) for a in spec.get("after") or ()], None)
            nodes.setdefault(node.step_id, node)
            if node.dynamic:
                todo.append(node.step_id)
    while todo:  # breadth first: a parent's children, then theirs
        parent = todo.pop(0)
        output = outputs.get(parent)
        children = output.get("steps") if isinstance(output, Mapping) else None
        for spec in children if isinstance(children, list) else ():
            if not isinstance(spec, Mapping) or not isinstance(spec.get("id"), str):
                continue
            if spec["id"] in nodes:
                continue
            after = sorted({*(str(a) for a in spec.get("after") or ()), parent})
            node = _node(spec, after, parent)
            nodes[node.step_id] = node
            if node.dynamic:
                todo.append(node.step_id)
    return nodes


def _node(spec: Mapping[str, Any], after: list[str], added_by: str | None) -> GraphNode:
    return GraphNode(str(spec["id"]), spec, after, added_by, bool(spec.get("dynamic")))
