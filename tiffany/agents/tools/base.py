"""The tool contract: what the worker task calls to run a plan step.

A tool is an object with a ``name``, a pydantic ``Args`` model that
validates its arguments (errors name the field), a pydantic ``Output``
model that describes its result, and a ``run(args, ctx)``:

* a **plain function** ``run`` runs in the scheduler's thread pool (blocking
  libraries are fine there);
* a **generator function** ``run`` runs as its own kernel task and may wait
  on descriptors through ``ReadWait``/``WriteWait`` (``tiffany.io``).

Either way the worker runs it inside a durable ``Step``: its result is
journaled and a replay never calls it again. A tool whose ``durable`` is
False (``sleep``) instead runs inside the worker task itself, journaled
dispatch by dispatch; such a tool must be deterministic.

Results must be JSON-like (dict, list, str, numbers, bool, None, bytes).
``Output`` only *describes* them (``GET /api/tools``, ``tiffany tools``,
docs/tools.md): a tool never builds its result through it, so what a tool
returns, and so what a journal replays, stays as it was. A tool whose result
is whatever its user code returns (``python``, ``signal.wait``, ``plan.run``)
declares a :class:`FreeFormOutput` that says so.
Tools raise :class:`ToolError` (with a stable ``code`` and fields) for
failures the plan should see; the worker retries according to the step.

A tool that calls a model says so with a ``metered`` class attribute, for
the run's budget (``tiffany/agents/budget.py``): ``"call"`` when its step
is one model call (the worker checks the budget before each attempt and
counts each attempt's ``usage`` and ``cost_usd``, from its output or, for a
failed one, its error's fields), ``"self"`` when it makes several and
checks and counts each itself (``ToolContext.budget``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, RootModel

from tiffany.agents.tracebacks import TracebackLimits
from tiffany.errors import TiffanyError

__all__ = [
    "FreeFormOutput",
    "Tool",
    "ToolArgs",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolSettings",
]


class ToolError(TiffanyError):
    """A tool failed in a way the plan should see (retried per the step)."""

    code = "tool.error"
    outcome = True


class ToolArgs(BaseModel):
    """Base of every tool's argument model: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


class ToolOutput(BaseModel):
    """Base of every tool's output model: the fields of its result, no others.

    It describes the result (its JSON Schema is published); the tool returns
    a plain dict, never an instance.
    """

    model_config = ConfigDict(extra="forbid")


class FreeFormOutput(RootModel[Any]):
    """Free-form: any JSON value (what the user's code, signal or child plan gives)."""


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """Operator settings the tools read (built once from Settings)."""

    llm_base_url: str | None = None
    # None: no model; "scripted": the offline scripted provider (llm.py: provider_for)
    llm_model: str | None = None
    llm_api_key: str | None = None
    llm_script: str | None = None
    shell_sandbox: str = "auto"  # "auto": bubblewrap when installed, "bwrap": required, "none"
    # "auto" may run unsandboxed when bubblewrap is unusable: ``tiffany run`` only, never a server
    shell_fallback: bool = False
    env_allowlist: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "HOME", "TZ")
    max_output_bytes: int = 1 << 20
    http_max_body_bytes: int = 10 << 20
    # hosts and CIDRs the http tool may reach although private/loopback (TIFFANY_HTTP_ALLOW)
    http_allow: tuple[str, ...] = ()
    # how much of a failed python function's traceback its step's error keeps
    # (TIFFANY_TRACEBACK_FRAMES, TIFFANY_TRACEBACK_CHARS: tiffany/agents/tracebacks.py)
    traceback: TracebackLimits = field(default_factory=TracebackLimits)


@dataclass(slots=True)
class ToolContext:
    """What a running tool knows about where it runs.

    Attributes:
        run_id: The run.
        step_id: The plan step.
        attempt: 1 for the first try, 2... for retries and re-runs.
        workspace: The run's workspace directory (file tools and shell cwd stay
            inside). It may not exist yet: a tool that needs it makes it
            (``tools/workspace.py``: ``ensure_workspace``), in its thread.
        settings: Operator settings.
        emit: ``emit(kind, data)`` publishes an activity event (best effort;
            e.g. ``tool.output`` lines, ``llm.usage``). Never blocks.
        runs: The engine's child runs (``plan.run``: ``tools/subplan.py``), or None.
        tools: The tool registry (``agent`` calls tools by name), or None.
        budget: The run's budget ledger (``tiffany/agents/budget.py``), or None
            (no budget): a tool that makes several model calls checks it
            before each and charges each (``metered = "self"``).
        call: For a tool an ``agent`` step calls, which of the step's tool
            calls this is (1, 2...): two calls of one attempt are two
            things (``plan.run`` starts a child each); None for the step's own tool.
        memory: The engine's MemoryStore (``tiffany/memory/``; the ``memory.*``
            tools: ``tools/memory.py``), or None: this engine has none.
    """

    run_id: str
    step_id: str
    attempt: int
    workspace: Path
    settings: ToolSettings = field(default_factory=ToolSettings)
    emit: Callable[[str, Mapping[str, Any]], None] = lambda kind, data: None
    runs: Any = None
    tools: Any = None
    budget: Any = None
    call: int | None = None
    memory: Any = None


class Tool(Protocol):
    """What the registry holds."""

    name: ClassVar[str]
    Args: ClassVar[type[ToolArgs]]
    Output: ClassVar[type[BaseModel]]
    durable: ClassVar[bool]

    def run(self, args: Any, ctx: ToolContext) -> Any:
        """Run the tool (a plain function or a generator function)."""
        ...
