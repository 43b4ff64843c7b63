"""Kernel test fixtures: a manual clock, a recording instrument, a scheduler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tiffany.kernel import ManualClock, Scheduler

from .kernel_support import Recorder


@pytest.fixture
def clock() -> ManualClock:
    """An autojumping manual clock starting at 0."""
    return ManualClock()


@pytest.fixture
def recorder() -> Recorder:
    """A fresh recording instrument."""
    return Recorder()


@pytest.fixture
def sched(clock: ManualClock, recorder: Recorder) -> Iterator[Scheduler]:
    """A scheduler on the manual clock with the recorder attached; closed after the test."""
    s = Scheduler(clock=clock, instruments=[recorder], seed=1234)
    try:
        yield s
    finally:
        s.close()
