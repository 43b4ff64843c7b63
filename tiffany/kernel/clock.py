"""Clocks: the only place the kernel reads time.

The scheduler takes a clock object; task code reads time only through the
``Now()`` system call, and timers use :meth:`Clock.monotonic`. Tests use
:class:`ManualClock`, which only moves when told to or, with autojump, when
the loop would otherwise sleep (trio's ``MockClock(autojump_threshold=0)``):
a test of a 60-second timeout then runs in microseconds and never flakes.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


class Clock(Protocol):
    """What the scheduler needs from a clock."""

    def monotonic(self) -> float:
        """Return seconds on a clock that never goes back (for timers)."""
        ...

    def time(self) -> float:
        """Return wall-clock seconds since the epoch (for ``Now()``)."""
        ...

    def wait_timeout(self, timeout: float) -> float:
        """Return how long the loop may really block for a ``timeout`` on this clock."""
        ...

    def idle(self, deadline: float) -> None:
        """Tell the clock the loop found nothing to do until ``deadline``."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` for timers, ``time.time`` for ``Now()``."""

    __slots__ = ()

    def monotonic(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    def time(self) -> float:
        """Return ``time.time()``."""
        return time.time()  # noqa: TID251 - the one place wall time is read

    def wait_timeout(self, timeout: float) -> float:
        """Return ``timeout`` unchanged: real time passes while we block."""
        return timeout

    def idle(self, deadline: float) -> None:
        """Do nothing: real time moves by itself."""


class ManualClock:
    """A clock that moves only when told to (tests).

    Args:
        start: The initial monotonic reading.
        epoch: The wall-clock reading that corresponds to ``start``.
        autojump: When true, the loop's idle waits jump the clock straight to
            the next timer instead of sleeping.
    """

    __slots__ = ("_now", "autojump", "epoch")

    def __init__(
        self, start: float = 0.0, epoch: float = 1_700_000_000.0, autojump: bool = True
    ) -> None:
        self._now = start
        self.epoch = epoch - start
        self.autojump = autojump

    def monotonic(self) -> float:
        """Return the current manual reading."""
        return self._now

    def time(self) -> float:
        """Return the wall-clock reading that matches :meth:`monotonic`."""
        return self.epoch + self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds

    def wait_timeout(self, timeout: float) -> float:
        """Never really block for a timer: poll (0) when autojumping."""
        return 0.0 if self.autojump else timeout

    def idle(self, deadline: float) -> None:
        """Jump to ``deadline`` when autojumping and it lies ahead."""
        if self.autojump and deadline > self._now:
            self._now = deadline
