"""serve's restart policy for a child that died: back off in a crash loop, not after a good run."""

from __future__ import annotations

from pathlib import Path

from tiffany.cli import exits, serve


def test_a_crash_loop_backs_off_to_the_cap() -> None:
    policy = serve._Child("engine", ["true"], {}, Path("engine.json")).policy
    delays = [policy.delay(0.0) for _ in range(10)]  # died at once, every time
    assert delays[:3] == [
        serve.RESTART_DELAY_S,
        serve.RESTART_DELAY_S * 2,
        serve.RESTART_DELAY_S * 4,
    ]
    assert delays[-1] == serve.MAX_RESTART_DELAY_S
    assert delays == sorted(delays)


def test_a_child_that_stayed_up_restarts_at_once_again() -> None:
    policy = serve._Child("engine", ["true"], {}, Path("engine.json")).policy
    for _ in range(8):
        policy.delay(0.0)
    assert policy.delay(serve.STABLE_S) == serve.RESTART_DELAY_S  # then it ran a good while


def test_a_bad_setting_or_a_damaged_wal_is_no_restart() -> None:
    policy = serve._Child("engine", ["true"], {}, Path("engine.json")).policy
    assert policy.no_restart == {exits.USAGE, exits.WAL_DAMAGED}
