"""Ctrl-C for the commands that drive the loop themselves (``run``, ``replay``)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import sys
from typing import Any

from tiffany.cli import exits

__all__ = ["CtrlC"]


class CtrlC:
    """Ctrl-C stops the loop between dispatches; a second one exits at once, as a crash would.

    Python's own handler raises ``KeyboardInterrupt`` wherever the main
    thread is: inside a task's code, half-way through a dispatch and its
    journal record. A run interrupted there could replay differently from
    what was journaled (seen: a worker's records written twice, and the
    resumed run failing as diverged). Here the first Ctrl-C asks the
    scheduler to stop before its next pass, raising only while the loop
    waits in its selector (nothing half done there); the run stays
    unfinished in the WAL, everything committed so far kept. A second
    Ctrl-C exits at once without another write: the WAL recovers from that
    like from ``kill -9``.

    The handler stays from the start of the command to its last word (the
    loop run inside :meth:`loop`): a Ctrl-C just after the loop ended by
    itself (a run left waiting for a signal) raised Python's
    ``KeyboardInterrupt`` while the run's state was read or the WAL closed,
    and the command exited 130 without saying what became of the run.
    """

    def __init__(self, sched: Any) -> None:
        self.sched = sched
        self.pressed = 0
        self._old: Any = None

    def __enter__(self) -> CtrlC:
        self._old = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> bool:
        signal.signal(signal.SIGINT, self._old)
        return exc_type is _Stopped  # the loop was waiting: it stopped there

    def loop(self) -> contextlib.suppress:
        """Around the loop's run: the first Ctrl-C, while it waits, ends it here."""
        return contextlib.suppress(_Stopped)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.pressed += 1
        if self.pressed > 1:
            sys.stderr.write("tiffany: stopped at once (the WAL keeps what was committed)\n")
            sys.stderr.flush()
            os._exit(exits.INTERRUPTED)
        self.sched.stop()
        if frame is not None and frame.f_code.co_filename == selectors.__file__:
            raise _Stopped  # waiting in the selector: no dispatch is under way


class _Stopped(Exception):
    """Raised out of the loop's selector wait by the first Ctrl-C."""
