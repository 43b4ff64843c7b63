"""The sleep tool on a manual clock."""

from __future__ import annotations

import pytest

from tiffany.agents.tools.sleep import SleepTool
from tiffany.kernel import ManualClock

SLEEP = SleepTool()


def test_sleep_waits_on_the_scheduler_clock(run_tool, make_ctx):
    clock = ManualClock()
    assert run_tool(SLEEP, {"seconds": 3600}, make_ctx(), clock=clock) == {"slept": 3600}
    assert clock.monotonic() == 3600
    assert SleepTool.durable is False  # runs in the worker task, journaled as a timer


@pytest.mark.parametrize("seconds", [-1, 86_400.5, "soon"])
def test_sleep_bounds(seconds):
    with pytest.raises(ValueError, match="seconds"):
        SleepTool.Args.model_validate({"seconds": seconds})
