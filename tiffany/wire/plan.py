"""A plan's shape: the models the engine validates a plan with and the API's schema shows.

One definition for both sides: the engine (``tiffany/agents/plan.py``)
parses a plan with these models and then checks what a shape cannot say
(tools, step ids, ``after`` targets, cycles, references); the API process,
which never imports ``agents``, names them in its OpenAPI schema
(``/openapi.json``), so a client reads the shape the engine enforces,
constraint for constraint. Descriptions and docstrings here are that
schema's words.

Invariants:
    Only the shape lives here, and validators that need nothing but the
    value (``after`` names each step once). Parsing a journaled plan again
    on replay must accept what it accepted when the plan was submitted: a
    change that refuses more is a change to ``agents/plan.py``'s strict
    checks, never to these models (see that module's docstring).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "MAX_CONCURRENCY_LIMIT",
    "MAX_RETRIES",
    "MAX_STEPS",
    "BudgetSpec",
    "ConcurrencySpec",
    "Plan",
    "StepSpec",
]

#: Most steps a plan may hold (static plus added at run time).
MAX_STEPS = 10_000
#: Most retries of one step.
MAX_RETRIES = 20
#: Largest ``concurrency.limit`` a plan may set.
MAX_CONCURRENCY_LIMIT = 10_000


class StepSpec(BaseModel):
    """One step: a tool call with arguments, dependencies and a retry policy."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$",
        description="Unique within the plan.",
    )
    tool: str = Field(min_length=1, description="An enabled tool (``GET /api/tools``).")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="The tool's arguments; ``${inputs.x}``, ``${steps.ID.output...}`` references.",
    )
    after: list[str] = Field(
        default_factory=list,
        description="Steps that must succeed first (each named once).",
        # The schema says what _no_duplicates checks.
        json_schema_extra={"uniqueItems": True},
    )
    retries: int = Field(default=0, ge=0, le=MAX_RETRIES)
    backoff: float = Field(
        default=1.0, ge=0, le=3600, description="first retry delay, doubled each time"
    )
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    continue_on_error: bool = False
    dynamic: bool = Field(default=False, description="the tool's result['steps'] extend the plan")

    @field_validator("after")
    @classmethod
    def _no_duplicates(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("lists a step twice")
        return v


class ConcurrencySpec(BaseModel):
    """At most ``limit`` runs with the same ``key`` run at once; the others queue (FIFO)."""

    # ``key`` may reference the inputs (``"${inputs.user}"``): it is resolved
    # at submission, into the run's entry (``tiffany/agents/concurrency.py``).

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=200, description="May reference the inputs.")
    limit: int = Field(ge=1, le=MAX_CONCURRENCY_LIMIT)


class BudgetSpec(BaseModel):
    """The most model tokens and US dollars a run's steps may use (``llm``, ``agent``)."""

    # Every attempt's usage counts, failed or not; a model call that would
    # start with the budget spent is refused, and the step whose call ends
    # past it fails (``budget.exceeded``); its dependents are skipped as for
    # any failure (``tiffany/agents/budget.py``).

    model_config = ConfigDict(extra="forbid")

    tokens: int | None = Field(default=None, ge=0)
    usd: float | None = Field(default=None, ge=0)


class Plan(BaseModel):
    """A plan: its inputs (defaults), its steps and its outputs."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    inputs: dict[str, Any] = Field(
        default_factory=dict, description="The inputs' defaults; a submission's are merged over."
    )
    steps: list[StepSpec] = Field(min_length=1, max_length=MAX_STEPS)
    outputs: dict[str, Any] = Field(
        default_factory=dict, description="The run's outputs, from references to steps' outputs."
    )
    concurrency: ConcurrencySpec | None = None
    budget: BudgetSpec | None = None

    def step(self, step_id: str) -> StepSpec:
        """Return the step with ``step_id``."""
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)
