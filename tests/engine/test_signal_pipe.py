"""The engine's signal pipe: a stopping signal stops the engine from the loop too.

The Python handler runs only on the main thread, which may be inside a
step's function (a helped step, ``kernel/sysmon.py``); the loop, on
whichever thread runs it, reads the signal's number from the wakeup pipe
and stops the engine as the handler would.
"""

from __future__ import annotations

import os
import signal

from tiffany.engine.service import _drain
from tiffany.kernel import Scheduler, Sleep


def _run_with(data: bytes) -> list[str]:
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    stops: list[str] = []
    sched = Scheduler()

    def on_stop() -> None:
        stops.append("stop")
        sched.stop()

    def bound():
        yield Sleep(2.0)  # a pipe that stops nothing: the run ends here
        sched.stop()

    try:
        sched.spawn(_drain(r, on_stop), daemon=True)
        sched.spawn(bound(), daemon=True)
        os.write(w, data)
        sched.run()
    finally:
        sched.close()
        os.close(r)
        os.close(w)
    return stops


def test_a_sigterm_or_sigint_number_on_the_pipe_stops_the_engine() -> None:
    assert _run_with(bytes([signal.SIGCHLD, signal.SIGTERM])) == ["stop"]
    assert _run_with(bytes([signal.SIGINT])) == ["stop"]


def test_other_signals_on_the_pipe_stop_nothing() -> None:
    assert _run_with(bytes([signal.SIGCHLD, signal.SIGWINCH])) == []
