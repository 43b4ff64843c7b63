"""Agent plans: the planner, worker and tool tasks, and the tools.

Public API::

    from tiffany.agents import AgentEnv, ToolRegistry, parse_plan, plan_entry, run_plan

``plan_entry(doc, inputs)`` is what a run's first journal record holds. A
plan run is the built-in workflow ``plan``, whose root is :func:`run_plan`:
``tiffany.workflows.workflow_resolver(env)`` turns the entry back into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tiffany.agents.plan import Plan, PlanError, StepSpec, load_plan, parse_plan
from tiffany.agents.planner import PlanFailed, run_plan
from tiffany.agents.registry import ToolRegistry
from tiffany.agents.worker import AgentEnv

__all__ = [
    "AgentEnv",
    "Plan",
    "PlanError",
    "PlanFailed",
    "StepSpec",
    "ToolRegistry",
    "load_plan",
    "parse_plan",
    "plan_entry",
    "run_plan",
]


def plan_entry(doc: Mapping[str, Any], inputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return the run entry (journaled in RUN_START) for a plan document and inputs."""
    return {"kind": "plan", "plan": dict(doc), "inputs": dict(inputs or {})}
