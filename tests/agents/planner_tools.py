"""Small tools for the planner tests (importable by name for replays)."""

from __future__ import annotations

from typing import Any, ClassVar

from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolError
from tiffany.kernel import Sleep

EVENTS: list[tuple[str, str, int]] = []  # (event, step, attempt)


class EchoArgs(ToolArgs):
    value: Any = None
    fail_times: int = 0
    delay_s: float = 0.0


class Echo:
    """A kernel-task tool: optional delay, fails its first ``fail_times`` attempts."""

    name: ClassVar[str] = "echo"
    Args: ClassVar[type[ToolArgs]] = EchoArgs
    durable: ClassVar[bool] = True

    def run(self, args: EchoArgs, ctx: ToolContext) -> Any:
        EVENTS.append(("start", ctx.step_id, ctx.attempt))
        try:
            if args.delay_s:
                yield Sleep(args.delay_s)
            if ctx.attempt <= args.fail_times:
                raise ToolError(
                    f"{ctx.step_id} fails on attempt {ctx.attempt}", attempt=ctx.attempt
                )
        finally:
            EVENTS.append(("end", ctx.step_id, ctx.attempt))
        return {"value": args.value, "attempt": ctx.attempt}


class ThreadEchoArgs(ToolArgs):
    value: Any = None


class ThreadEcho:
    """A thread-pool tool."""

    name: ClassVar[str] = "thread_echo"
    Args: ClassVar[type[ToolArgs]] = ThreadEchoArgs
    durable: ClassVar[bool] = True

    def run(self, args: ThreadEchoArgs, ctx: ToolContext) -> Any:
        EVENTS.append(("thread", ctx.step_id, ctx.attempt))
        return {"value": args.value}


class PlannerArgs(ToolArgs):
    count: int


class Planner:
    """Returns new steps (a dynamic step's tool)."""

    name: ClassVar[str] = "planner"
    Args: ClassVar[type[ToolArgs]] = PlannerArgs
    durable: ClassVar[bool] = True

    def run(self, args: PlannerArgs, ctx: ToolContext) -> Any:
        return {
            "steps": [
                {"id": f"gen{i}", "tool": "thread_echo", "args": {"value": i}}
                for i in range(args.count)
            ]
        }


class ModelArgs(ToolArgs):
    tokens: int
    fail_times: int = 0


class Model:
    """A model call (``metered = "call"``): bills ``tokens``; fails its first ``fail_times``.

    A failure carries the usage, as a model error raised after the reply does.
    """

    name: ClassVar[str] = "model"
    Args: ClassVar[type[ToolArgs]] = ModelArgs
    durable: ClassVar[bool] = True
    metered: ClassVar[str] = "call"

    def run(self, args: ModelArgs, ctx: ToolContext) -> Any:
        EVENTS.append(("model", ctx.step_id, ctx.attempt))
        usage = {"prompt_tokens": args.tokens, "completion_tokens": 0, "total_tokens": args.tokens}
        if ctx.attempt <= args.fail_times:
            raise ToolError("the reply is unusable", usage=usage, cost_usd=0.0)
        return {"usage": usage, "cost_usd": 0.0}


class FakeRegistry:
    """The registry interface the planner uses."""

    def __init__(self) -> None:
        self.tools = {t.name: t for t in (Echo(), ThreadEcho(), Planner(), Model())}

    def get(self, name: str) -> Any:
        return self.tools[name]

    lookup = get  # every tool here is enabled

    def names(self) -> list[str]:
        return sorted(self.tools)

    all_names = names
