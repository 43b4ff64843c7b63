"""Agent plans: the planner, worker and tool tasks, and the tools.

Public API::

    from tiffany.agents import AgentEnv, ToolRegistry, parse_plan, plan_entry, plan_resolver

``plan_entry(doc, inputs)`` is what a run's first journal record holds;
``plan_resolver(env)`` turns it back into the planner coroutine (the durable
runtime's resolver for the ``plan`` entry kind).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any

from tiffany.agents.plan import MAX_STEPS, Plan, PlanError, StepSpec, load_plan, parse_plan
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
    "plan_resolver",
    "run_plan",
]


def plan_entry(doc: Mapping[str, Any], inputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return the run entry (journaled in RUN_START) for a plan document and inputs."""
    return {"kind": "plan", "plan": dict(doc), "inputs": dict(inputs or {})}


def plan_resolver(
    env: AgentEnv,
) -> Callable[[dict[str, Any], str, int], Generator[Any, Any, Any]]:
    """Return the runtime resolver that rebuilds a plan run's planner task."""

    def resolve(entry: dict[str, Any], run_id: str, compat: int) -> Generator[Any, Any, Any]:
        reuse, source = entry.get("reuse"), entry.get("rerun_of")  # a re-run's (rerun.py)
        source_id = source.get("run_id") if isinstance(source, Mapping) else None
        inputs = entry.get("inputs") or {}
        limited = entry.get("concurrency") is not None
        limits = entry.get("limits")
        bound = limits.get("max_steps") if isinstance(limits, Mapping) else None
        max_steps = bound if isinstance(bound, int) and bound > 0 else MAX_STEPS
        return run_plan(
            env, run_id, entry["plan"], inputs, compat, reuse, source_id, limited, max_steps
        )

    return resolve
