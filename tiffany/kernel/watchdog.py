"""The slow-dispatch watchdog: an instrument that reports loop stalls.

The scheduler is cooperative: a task that computes for 300 ms between two
yields holds every other task for 300 ms. This instrument times each
dispatch and reports the ones over a threshold with the task's name and
coroutine stack (the seed's starvation detection, asyncio's slow-callback
warning).

Discussion: one hook per dispatch, not two. The watchdog measures from the
end of the previous dispatch (or of the last wait stage) to the end of this
one, which is the dispatch plus the kernel's handling of the previous yield:
all of it is time the loop was held. Timing ``before_dispatch`` as well
would double the instrument's cost for no real gain. The stack is read when
the dispatch ends, so it shows the ``yield`` that ended the slow stretch
(the function that ran long is on it).
Reports go to structlog, to a bounded list and to ``on_report`` (the
engine's metrics hook: a histogram of stall durations, ``/metrics``);
``stalls`` counts them all and ``longest_s`` keeps the longest dispatch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

from tiffany.kernel.instrument import Instrument

if TYPE_CHECKING:
    from tiffany.kernel.task import Task

__all__ = ["DEFAULT_THRESHOLD_S", "SlowDispatch", "SlowDispatchWatchdog"]

#: A dispatch longer than this is a stall.
DEFAULT_THRESHOLD_S: Final = 0.100
#: How many reports the watchdog keeps in memory.
MAX_REPORTS: Final = 100

log = structlog.get_logger("tiffany.kernel.watchdog")


@dataclass(frozen=True, slots=True)
class SlowDispatch:
    """One dispatch that held the loop longer than the threshold."""

    tid: int
    name: str
    duration_s: float
    yielded: str
    stack: list[tuple[str, str, int]]


class SlowDispatchWatchdog(Instrument):
    """Report dispatches that hold the loop longer than ``threshold_s``.

    Args:
        threshold_s: The stall threshold in seconds.
        timer: A monotonic timer (tests inject a fake one).
        on_report: Called with each :class:`SlowDispatch` besides logging
            (on the scheduler thread); may be set later, before the loop runs.
    """

    def __init__(
        self,
        threshold_s: float = DEFAULT_THRESHOLD_S,
        timer: Callable[[], float] = time.perf_counter,
        on_report: Callable[[SlowDispatch], None] | None = None,
    ) -> None:
        self.threshold_s = threshold_s
        self._timer = timer
        self.on_report = on_report
        self._started = timer()
        self.stalls = 0
        self.longest_s = 0.0
        self.reports: deque[SlowDispatch] = deque(maxlen=MAX_REPORTS)

    def before_run(self) -> None:
        """Start the stopwatch when the loop starts."""
        self._started = self._timer()

    def after_wait(self, events: int) -> None:
        """Restart the stopwatch: the loop is about to dispatch again."""
        self._started = self._timer()

    def after_dispatch(self, task: Task, yielded: Any) -> None:
        """Stop the stopwatch; report when over the threshold; restart it."""
        now = self._timer()
        elapsed = now - self._started
        self._started = now
        if elapsed > self.longest_s:
            self.longest_s = elapsed
            if elapsed > self.threshold_s:
                self._report(task, elapsed, yielded)
        elif elapsed > self.threshold_s:
            self._report(task, elapsed, yielded)

    def _report(self, task: Task, elapsed: float, yielded: Any) -> None:
        self.stalls += 1
        report = SlowDispatch(task.id, task.name, elapsed, repr(yielded)[:200], task.frames())
        self.reports.append(report)
        log.warning(
            "kernel.slow_dispatch",
            tid=task.id,
            name=task.name,
            duration_ms=round(elapsed * 1000, 1),
            threshold_ms=round(self.threshold_s * 1000, 1),
            yielded=report.yielded,
            frames=[f"{fn} ({path}:{line})" for fn, path, line in report.stack],
        )
        if self.on_report is not None:
            self.on_report(report)
