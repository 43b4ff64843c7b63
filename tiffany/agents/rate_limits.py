"""Per-tool rate limits (``TIFFANY_RATE_LIMITS="llm=60/min,http=20/s"``).

A step of a limited tool that runs in the thread pool (``llm``, ``http``,
``file.*``, plain ``python`` functions, and the ``agent`` tool's model calls,
named ``llm``, and tool calls) starts no sooner than its tool's limit
allows: the kernel keeps the job queued, holding no thread, and the worker
stays parked on its step (``Scheduler.set_admission``). Limits only decide
*when* a job starts, never what it returns, so they are not journaled and a
replay (which starts no job) never meets them.

The limiter is GCRA (the generic cell rate algorithm: a "virtual scheduling"
token bucket): ``N`` per ``PERIOD`` allows a burst of ``N`` and then one
every ``PERIOD / N``. Each job asking reserves its start time, so queued
jobs start in the order they asked. State is in memory: an engine that
restarts starts with full buckets. Steps run as kernel tasks (``shell``,
generator functions) are not limited.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["RateLimiter"]


class RateLimiter:
    """Start times of thread jobs by their tool's limit (on the loop's thread).

    Args:
        limits: ``{tool: (count, period_s)}`` (``config.parse_rate_limits``).
        tool_of: Maps a step's name to its tool (the registry's ``tool_of_step``).
        now: The clock (the scheduler's ``monotonic``).
    """

    def __init__(
        self,
        limits: Mapping[str, tuple[int, float]],
        tool_of: Callable[[str | None], str | None],
        now: Callable[[], float],
    ) -> None:
        self._rates = {tool: (period / count, period) for tool, (count, period) in limits.items()}
        self._tool_of = tool_of
        self._now = now
        self._tat: dict[str, float] = {}  # theoretical arrival time of the next job, by tool
        self.delayed = 0  # jobs that had to wait (a metric)

    def admit(self, call: Any) -> float:
        """Seconds the job must wait before it starts (0: now); its slot is reserved."""
        name = getattr(call, "name", None)
        tool = self._tool_of(name if isinstance(name, str) else None)
        rate = self._rates.get(tool) if tool is not None else None
        if rate is None:
            return 0.0
        interval, period = rate
        now = self._now()
        tat = max(self._tat.get(tool, now), now)  # type: ignore[arg-type]
        start = max(now, tat - (period - interval))  # a burst of N, then one an interval
        self._tat[tool] = tat + interval  # type: ignore[index]
        if start > now:
            self.delayed += 1
        return start - now
