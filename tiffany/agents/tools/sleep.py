"""``sleep``: wait on the kernel's clock (a journaled, durable timer).

Not a durable *step*: it runs inside the worker task itself, so the journal
records the ``Sleep`` call and a recovered run resumes the timer where it
was instead of sleeping again from zero.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolOutput
from tiffany.kernel import Coroutine, Sleep

__all__ = ["MAX_SLEEP_S", "SleepArgs", "SleepOutput", "SleepTool"]

#: Longest sleep a plan may ask for, in seconds (a day).
MAX_SLEEP_S = 24 * 3600.0


class SleepArgs(ToolArgs):
    """Arguments of ``sleep``: ``seconds`` in [0, one day]."""

    seconds: float = Field(
        ge=0, le=MAX_SLEEP_S, description="How long, in seconds (at most a day)."
    )


class SleepOutput(ToolOutput):
    """What ``sleep`` returns."""

    slept: float = Field(description="The seconds asked for.")


class SleepTool:
    """Sleep ``seconds``; returns ``{"slept": seconds}``."""

    name: ClassVar[str] = "sleep"
    Args: ClassVar[type[ToolArgs]] = SleepArgs
    Output: ClassVar[type[ToolOutput]] = SleepOutput
    durable: ClassVar[bool] = False

    def run(self, args: SleepArgs, ctx: ToolContext) -> Coroutine:
        """Sleep on the scheduler's clock (a generator: runs in the worker task)."""
        yield Sleep(args.seconds)
        return {"slept": args.seconds}
