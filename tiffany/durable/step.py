"""``Step``: the durable system call (defined by the kernel, journaled here).

``result = yield Step(fn, *args)`` runs ``fn(*args)`` once per run, ever:
its result (or exception) is journaled, and a replay hands the recorded
outcome back without calling ``fn`` again. A step that had started but not
finished when the engine stopped runs again on recovery, marked as a re-run
(at-least-once; make steps idempotent where it matters).

* A plain function runs in the scheduler's thread pool (for blocking code).
* A generator function runs as its own task on the kernel (for code that
  waits on pipes or sockets through ``ReadWait``). Its dispatches are not
  journaled one by one: only its outcome is, as the caller's wake-up.

The class lives in ``tiffany.kernel`` (so that layers which may not import
the durable layer, such as the agents, can yield it); without a journal the
kernel simply runs it. File descriptors do not survive a crash, so I/O
belongs inside steps. ``RunInThread`` inside a journaled run is treated as a
step too.
"""

from tiffany.kernel import Step

__all__ = ["Step"]
