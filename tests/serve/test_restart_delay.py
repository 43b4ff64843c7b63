"""serve's restart policy for a child that died: back off in a crash loop, not after a good run."""

from __future__ import annotations

import time
from pathlib import Path

from tiffany.cli import serve


def test_a_crash_loop_backs_off_to_the_cap() -> None:
    child = serve._Child("engine", ["true"], {}, Path("engine.json"))
    child.started_at = time.monotonic()  # died at once, every time
    delays = [child.restart_delay() for _ in range(10)]
    assert delays[:3] == [
        serve.RESTART_DELAY_S,
        serve.RESTART_DELAY_S * 2,
        serve.RESTART_DELAY_S * 4,
    ]
    assert delays[-1] == serve.MAX_RESTART_DELAY_S
    assert delays == sorted(delays)


def test_a_child_that_stayed_up_restarts_at_once_again() -> None:
    child = serve._Child("engine", ["true"], {}, Path("engine.json"))
    child.started_at = time.monotonic()
    for _ in range(8):
        child.restart_delay()
    child.started_at = time.monotonic() - serve.STABLE_S  # then it ran a good while
    assert child.restart_delay() == serve.RESTART_DELAY_S
