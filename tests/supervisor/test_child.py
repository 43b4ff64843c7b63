"""The one supervisor (tiffany/supervisor): real children die, restart after backoff, stop."""

from __future__ import annotations

import sys

import pytest

from tiffany.supervisor import Child, NoRestart, RestartPolicy, stop_all

EXIT_3 = [sys.executable, "-c", "import sys; sys.exit(3)"]
#: Ignores SIGTERM and waits on its stdin: only SIGKILL (or EOF) ends it.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
    "sys.stdin.read()",
]


def test_a_death_is_told_and_restarted_once_its_backoff_is_over() -> None:
    deaths: list[tuple[int, float]] = []
    child = Child(
        "worker",
        EXIT_3,
        {},
        RestartPolicy(0.5, 4.0),
        on_died=lambda c, code, delay: deaths.append((code, delay)),
    )
    assert child.tend(0.0) is True  # due at once: the first start
    first = child.proc
    assert first is not None
    first.wait(30)
    now = child.started_at + 0.1
    assert child.tend(now) is False
    assert deaths == [(3, 0.5)]
    assert child.due == pytest.approx(now + 0.5)
    assert child.tend(now + 0.4) is False  # not yet: nothing started, nothing told again
    assert (child.proc, child.restarts, len(deaths)) == (first, 0, 1)
    assert child.tend(now + 0.5) is True
    assert child.proc is not first
    assert child.restarts == 1
    child.proc.wait(30)
    child.tend(child.started_at)  # died again at once: the backoff doubles
    assert deaths[-1] == (3, 1.0)
    assert child.tend(float("inf"), may_start=False) is False  # stopping: no restart


def test_an_exit_code_no_restart_mends_is_raised() -> None:
    child = Child("engine", EXIT_3, {}, RestartPolicy(0.5, 4.0, no_restart={3}))
    child.start().wait(30)
    with pytest.raises(NoRestart) as caught:
        child.tend()
    assert (caught.value.code, caught.value.child) == (3, child)
    assert child.due is None


def test_a_child_that_ignores_sigterm_is_killed_at_the_deadline() -> None:
    child = Child("stubborn", STUBBORN, {}, RestartPolicy(0.5, 4.0), pipes=True)
    proc = child.start()
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"1\n"  # its SIGTERM handler is in place
    assert stop_all([child], timeout=0.5) == [-9]
    assert child.tend() is False
    assert child.due is None  # stopped, not restarted
