"""The loop's monitor: a lone step runs on the loop's thread; one that blocks hands the loop over.

A ``Step(fn)`` through the thread pool costs two thread wake-ups, to the
worker and back (``bench/pool_handoff.py``): on a sequential chain of
quick steps they are most of what separates the pool from ``inline``.
When the loop has nothing else to do (no task ready, no other thread job
pending) it runs the lone step's function on its own thread instead, and
this monitor guards that call: a thread that ticks every ``bound_s`` while
calls are helped so, and that finds the same call running at two ticks in
a row (so it ran for at least ``bound_s``) takes the loop and runs its
passes itself, as the *substitute*, until the call returns. The call's
thread then asks for the loop back, and takes it at the substitute's next
pass boundary. Go's runtime does the same for a goroutine blocked in a
system call (``sysmon`` retakes its P after 20 us to 10 ms, ``handoffp``).

Invariants: ``claim`` is held by whichever thread runs the loop; the loop's
thread lets go of it only while it runs a helped call (``job`` non-zero),
and takes it back before anything else, so one thread at a time runs the
loop: ``current_task()``, the instruments and the watchdog see one. A
function that was taken over once goes to the pool from then on (``slow``),
so a step that always blocks (a model call, an HTTP request) costs the loop
one bound, once.

Discussion: the monitor parks after ``PARK_TICKS`` ticks with nothing
helped, so an idle engine pays nothing; while calls are helped it wakes
once a bound (about a thousand times a second at the default). A tick
reads two attributes and sleeps; it needs the GIL for that, which a
call holding the GIL in pure Python gives up at the interpreter's switch
interval (5 ms), so such a call is taken over within about ``2 *
bound_s`` plus that.
Rejected: one wake-up of the monitor per helped call (an ``Event`` set as
it starts): it is the very thread crossing the helping saves.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

import structlog

__all__ = ["DEFAULT_BOUND_S", "MAX_SLOW", "PARKED_CHECK_S", "PARK_TICKS", "Sysmon"]

#: How long a helped call may hold the loop before the monitor hands the
#: loop to a substitute thread (it does within one to two bounds).
DEFAULT_BOUND_S: Final = 0.001
#: Ticks with nothing helped before the monitor parks until the next call.
PARK_TICKS: Final = 200
#: The most functions remembered as slow (then the memory starts over).
MAX_SLOW: Final = 4096
#: How often a parked monitor looks whether its scheduler is gone.
PARKED_CHECK_S: Final = 30.0

log = structlog.get_logger("tiffany.kernel.sysmon")


class Sysmon:
    """The monitor of one scheduler's helped calls.

    Args:
        substitute: Runs the loop on the monitor's thread until the helped
            call's thread takes it back (``Scheduler._substitute``); called
            holding ``claim``. Held weakly: a scheduler dropped unclosed
            does not live on in its monitor, which then exits.
        bound_s: How long a helped call may run before the loop is handed over.
    """

    def __init__(self, substitute: Callable[[], None], bound_s: float = DEFAULT_BOUND_S) -> None:
        self.bound_s = bound_s
        #: Held by the thread that runs the loop (see the module's invariants).
        self.claim = threading.Lock()
        #: The helped call's number while one runs on the loop's thread, else 0.
        self.job = 0
        #: True from a takeover until the loop's thread has the loop back.
        self.taken = False
        #: How many helped calls were taken over.
        self.takeovers = 0
        #: The code of functions taken over once (``_code_of``): to the pool from then on.
        self.slow: dict[Any, None] = {}
        #: The function of the helped call (the last one).
        self.fn: Any = None
        self._seq = 0
        self._substitute = weakref.WeakMethod(substitute)
        self._thread: threading.Thread | None = None
        self._parked = False
        self._unpark = threading.Event()
        self._closed = False

    def helps(self, fn: Any) -> bool:
        """Whether a call of ``fn`` may run on the loop's thread (its code never blocked there)."""
        try:
            return _code_of(fn) not in self.slow
        except TypeError:  # unhashable: a callable object that is not
            return True

    def begin(self, fn: Any) -> None:
        """The loop's thread is about to run a helped call of ``fn``: it lets go of the loop."""
        self.fn = fn
        self._seq += 1
        self.job = self._seq
        if self._thread is None:
            self._start()
        elif self._parked:
            self._unpark.set()
        self.claim.release()

    def end(self, ask_back: Callable[[], None]) -> bool:
        """The helped call returned: take the loop back; True if a substitute ran meanwhile.

        ``ask_back()`` is called when another thread holds the claim (a
        substitute, or the monitor that found the call returned and lets
        go): it must make a substitute return at its next pass boundary,
        and the caller undoes it when none ran (False).
        """
        # First: a monitor that gets the claim from now on (a lock is not
        # fair: it may get it back from its own substitute before this
        # thread does) finds no call to take over.
        self.job = 0
        if not self.claim.acquire(blocking=False):
            ask_back()
            self.claim.acquire()
        fn, self.fn = self.fn, None  # kept no longer than the call: it may hold a whole graph
        if not self.taken:
            return False  # the loop stayed where it was (the monitor let go)
        self.taken = False
        slow = self.slow
        if len(slow) >= MAX_SLOW:
            slow.clear()
        with contextlib.suppress(TypeError):  # unhashable: helped again next time
            slow[_code_of(fn)] = None
        return True

    def close(self) -> None:
        """Stop the monitor (it exits at its next tick; a substitute finishes its pass first)."""
        self._closed = True
        self._unpark.set()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="tiffany-sysmon", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        claim, bound = self.claim, self.bound_s
        seen = 0
        idle = 0
        while not self._closed:
            time.sleep(bound)
            job = self.job
            if not job:
                seen = 0
                idle += 1
                if idle >= PARK_TICKS:
                    idle = 0
                    self._park()
                    if self._substitute() is None:
                        return  # its scheduler is gone
                continue
            idle = 0
            if job != seen:
                seen = job
                continue
            # The same call at two ticks: it has run for at least a bound.
            if claim.acquire(blocking=False):  # else it returned: the loop is back
                try:
                    self._take_over(job)
                finally:
                    claim.release()
            seen = 0

    def _take_over(self, job: int) -> None:
        """Run the loop here while call ``job`` runs (holding ``claim``)."""
        substitute = self._substitute()
        if self.job == job and not self._closed and substitute is not None:
            self.taken = True
            self.takeovers += 1
            substitute()

    def _park(self) -> None:
        self._parked = True
        if not self.job:  # a call that began before the flag was set is seen here
            while not self._unpark.wait(PARKED_CHECK_S) and self._substitute() is not None:
                pass
        self._parked = False
        self._unpark.clear()


def _code_of(fn: Any) -> Any:
    """What ``slow`` remembers of ``fn``: its code object, else ``fn`` itself.

    The code, not the function: a bound method is a new object at each
    attribute read, and a function held here would keep what it refers to
    alive (a tool, its engine) as long as the scheduler lives. Closures of
    one ``def`` share their code, and so their fate.
    """
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return fn if code is None else code
