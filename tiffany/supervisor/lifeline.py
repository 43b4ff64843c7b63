"""A child of ``tiffany serve`` dies with it, however ``serve`` dies.

``serve`` stops its children on every way out it sees (a signal, an error
of its own). A ``kill -9`` of ``serve``, or the OOM killer, leaves it no way
out: its children lived on, the API kept its port and answered 503 forever,
and a new ``serve`` could not start (issue 38). So each child it starts
holds a lifeline (``--supervisor PID``, :func:`hold`): the kernel sends the
child SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), and the
child stops as it does on any SIGTERM (the engine flushes its WAL, the API
closes its port first).

Invariants: the signal is asked for once the child runs, then the parent is
checked (``getppid``): a parent that died before the call is noticed too.
Where ``prctl`` is missing (not Linux), a daemon thread compares
``getppid`` with the supervisor's pid every ``PARENT_POLL_S``.

Discussion: the parent-death signal follows the *thread* that forked the
child; ``serve`` starts every child from its main thread, which lives as
long as ``serve`` does.

Rejected: a ``preexec_fn`` that calls ``prctl`` between fork and exec
(Python warns against ``preexec_fn`` in a process with threads, and the
race with a parent dying before the call is there anyway); a process group
killed from a ``finally`` of ``serve`` (a ``kill -9`` runs no ``finally``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Final

__all__ = ["PARENT_POLL_S", "hold"]

#: ``prctl`` option: the signal to get when the parent dies (linux/prctl.h).
PR_SET_PDEATHSIG: Final = 1
#: How often a child without ``prctl`` looks for its parent, in seconds.
PARENT_POLL_S: Final = 1.0


def hold(supervisor: int, sig: int = signal.SIGTERM) -> None:
    """Get ``sig`` when the parent, process ``supervisor``, dies (at once if it has)."""
    if not _parent_death_signal(sig):
        threading.Thread(
            target=_watch, args=(supervisor, sig), name="tiffany-lifeline", daemon=True
        ).start()
    if os.getppid() != supervisor:  # it died before we asked: we were re-parented
        os.kill(os.getpid(), sig)


def _parent_death_signal(sig: int) -> bool:
    """Ask the kernel for ``sig`` at the parent's death; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch(supervisor: int, sig: int) -> None:  # pragma: no cover - not Linux
    stop = threading.Event()
    while not stop.wait(PARENT_POLL_S):
        if os.getppid() != supervisor:
            os.kill(os.getpid(), sig)
            return
