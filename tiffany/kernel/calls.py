"""System calls: the only things a task yields to the scheduler.

A task is a generator. Each time it yields, the scheduler looks at what came
out and acts:

* ``None`` (a bare ``yield``): a cooperative yield; the task goes to the back
  of the ready queue (round robin).
* a generator: a call of a nested coroutine (trampolining); the task runs it
  and receives its ``return`` value as the result of the ``yield``.
* a :class:`SystemCall`: a request to the kernel (spawn, wait, sleep, I/O...).
  The handler is found by the call's exact type in a table built once.
* anything else: a misuse; :class:`~tiffany.errors.SystemCallMisuse` is thrown
  into the task at that ``yield``.

Design principles:

* Calls are small slotted classes with a stable ``kind`` and JSON-able
  ``fields()``, so the journal and the activity log can serialise them. No
  tuples, no string dispatch (curio's traps), no frozen dataclasses (building
  one costs several times a slotted class, which the hot path cannot afford).
* Only operations that may *block* are system calls. Non-blocking operations
  such as ``Queue.put`` and ``Event.set`` are plain method calls: making them
  system calls would double the trips through the loop per message.

Discussion: calls that complete at once (``GetTid``, ``NewTask``, ``Now``, a
``Queue.get`` with an item waiting...) resume the same task immediately
without a trip through the ready queue, as curio's kernel does. Only a bare
``yield`` or ``Sleep(0)`` gives up the processor. A turn is capped (see
``MAX_IMMEDIATE_RESUMES`` in the scheduler) so a task looping on immediate
calls cannot starve the others.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import IO, Any, ClassVar

__all__ = [
    "Coroutine",
    "GetTid",
    "KillTask",
    "NewTask",
    "Now",
    "Patched",
    "Random",
    "ReadWait",
    "Receive",
    "RunInThread",
    "Sleep",
    "Step",
    "SystemCall",
    "WaitTask",
    "WriteWait",
    "fileno_of",
]

#: What a task is: a generator that yields system calls, generators or None.
Coroutine = Generator[Any, Any, Any]


class SystemCall:
    """Base class of every request a task yields to the kernel."""

    __slots__ = ()

    #: Stable identifier used by the journal, the activity log and the API.
    kind: ClassVar[str] = "syscall"

    def fields(self) -> dict[str, Any]:
        """Return the call's arguments as a JSON-able mapping."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.fields().items())
        return f"{type(self).__name__}({args})"


class GetTid(SystemCall):
    """Return the calling task's id."""

    __slots__ = ()
    kind = "get_tid"


class NewTask(SystemCall):
    """Spawn a child task; returns its id at once.

    Args:
        coro: The generator the new task runs.
        name: A readable name (defaults to the generator's qualified name).
        daemon: When true, the task's record is dropped as soon as it ends
            (nobody will wait for it), as a server does for its connection
            handlers. Otherwise a finished child is kept until its parent
            ends, so ``WaitTask`` on it returns its result.
        meta: For the layers above, as ``Task.meta`` is: the kernel never
            reads it (the journal records a task's label from it).
    """

    __slots__ = ("coro", "daemon", "meta", "name")
    kind = "new_task"

    def __init__(
        self, coro: Coroutine, name: str | None = None, daemon: bool = False, meta: Any = None
    ) -> None:
        self.coro = coro
        self.name = name
        self.daemon = daemon
        self.meta = meta

    def fields(self) -> dict[str, Any]:
        """Return the child's name and flags (the generator itself is not JSON)."""
        name = self.name or getattr(self.coro, "__qualname__", "task")
        return {"name": name, "daemon": self.daemon}


class WaitTask(SystemCall):
    """Wait until task ``tid`` ends; return its result.

    If the task crashed, :class:`~tiffany.errors.TaskCrashed` is raised in the
    waiter with the original exception as ``__cause__``; if it was killed,
    :class:`~tiffany.errors.TaskKilled`. Waiting on a finished task returns at
    once. With ``timeout`` (seconds), :class:`~tiffany.errors.WaitTimeout` is
    raised if the task has not ended by then.
    """

    __slots__ = ("tid", "timeout")
    kind = "wait_task"

    def __init__(self, tid: int, timeout: float | None = None) -> None:
        self.tid = tid
        self.timeout = timeout

    def fields(self) -> dict[str, Any]:
        """Return the awaited task id and the timeout."""
        return {"tid": self.tid, "timeout": self.timeout}


class KillTask(SystemCall):
    """Cancel task ``tid`` cooperatively.

    :class:`~tiffany.errors.TaskCancelled` is thrown into the target at its
    current ``yield`` (its ``finally`` blocks run). A task that swallows the
    cancellation and keeps going is closed for good by a second kill. Returns
    True if the task was alive, False if it had already ended.
    """

    __slots__ = ("tid",)
    kind = "kill_task"

    def __init__(self, tid: int) -> None:
        self.tid = tid

    def fields(self) -> dict[str, Any]:
        """Return the target task id."""
        return {"tid": self.tid}


def fileno_of(f: int | IO[Any] | Any) -> int:
    """Return the descriptor of ``f`` (an int or anything with ``fileno()``)."""
    return f if isinstance(f, int) else int(f.fileno())


class ReadWait(SystemCall):
    """Block until ``f`` (a descriptor or an object with ``fileno()``) is readable."""

    __slots__ = ("fd",)
    kind = "read_wait"

    def __init__(self, f: int | Any) -> None:
        self.fd = fileno_of(f)

    def fields(self) -> dict[str, Any]:
        """Return the descriptor."""
        return {"fd": self.fd}


class WriteWait(SystemCall):
    """Block until ``f`` (a descriptor or an object with ``fileno()``) is writable."""

    __slots__ = ("fd",)
    kind = "write_wait"

    def __init__(self, f: int | Any) -> None:
        self.fd = fileno_of(f)

    def fields(self) -> dict[str, Any]:
        """Return the descriptor."""
        return {"fd": self.fd}


class Sleep(SystemCall):
    """Block for ``seconds`` on the scheduler's clock. ``Sleep(0)`` is a yield."""

    __slots__ = ("seconds",)
    kind = "sleep"

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"Sleep: seconds must be >= 0, got {seconds!r}")
        self.seconds = seconds

    def fields(self) -> dict[str, Any]:
        """Return the duration in seconds."""
        return {"seconds": self.seconds}


class Receive(SystemCall):
    """Wait for a message on ``channel`` from outside the task tree; return it.

    The kernel keeps no mailboxes: the layer that delivers messages registers
    the handler (the durable journal, for a run's signals: a message sent
    before the wait is kept for it). Without one, a ``Receive`` is a misuse.
    With ``timeout`` (seconds, > 0), :class:`~tiffany.errors.WaitTimeout` is
    raised at the yield if nothing came by then.
    """

    __slots__ = ("channel", "timeout")
    kind = "receive"

    def __init__(self, channel: str, timeout: float | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"Receive: timeout must be > 0 or None, got {timeout!r}")
        self.channel = channel
        self.timeout = timeout

    def fields(self) -> dict[str, Any]:
        """Return the channel and the timeout."""
        return {"channel": self.channel, "timeout": self.timeout}


class Now(SystemCall):
    """Return the current wall-clock time (seconds since the epoch, a float).

    Task code must read time only through this call, so that a replay sees
    the time the original run saw.
    """

    __slots__ = ()
    kind = "now"


class Patched(SystemCall):
    """Ask whether a code change marked ``patch_id`` applies to this run: True or False.

    A version marker (Temporal's ``patched``): ``if (yield Patched("fix-1")):
    new code, else: old code``. The kernel alone always answers True. The
    durable journal records the marker in a live run (True), finds it again
    when replaying a run that recorded it (True), and answers False, without
    counting a dispatch, when replaying a run recorded before the marker
    existed: such a run keeps replaying the old code's yields.
    """

    __slots__ = ("applies", "patch_id")
    kind = "patched"

    def __init__(self, patch_id: str) -> None:
        if not isinstance(patch_id, str) or not patch_id:
            raise ValueError(f"Patched: the id must be a non-empty string, got {patch_id!r}")
        self.patch_id = patch_id
        #: The answer; the journal sets it False for a run recorded before the marker.
        self.applies = True

    def fields(self) -> dict[str, Any]:
        """Return the marker's id."""
        return {"patch_id": self.patch_id}


class Random(SystemCall):
    """Return a random float in [0, 1) from the scheduler's seeded generator."""

    __slots__ = ()
    kind = "random"


class RunInThread(SystemCall):
    """Run ``fn(*args)`` in the scheduler's thread pool; return its result.

    For blocking libraries. The loop is woken through an eventfd when the
    call completes; an exception raised by ``fn`` is raised in the task. The
    thread starts only after the records of the current loop iteration are
    committed (write-ahead: no effect leaves the process before its record).
    """

    __slots__ = ("args", "fn")
    kind = "run_in_thread"

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn = fn
        self.args = args

    def fields(self) -> dict[str, Any]:
        """Return the function's qualified name and argument count."""
        module = getattr(self.fn, "__module__", "?")
        qualname = getattr(self.fn, "__qualname__", repr(self.fn))
        return {"fn": f"{module}:{qualname}", "nargs": len(self.args)}


class Step(SystemCall):
    """Run ``fn(*args)`` as a unit of work whose outcome the journal records.

    ``result = yield Step(fn, *args)``: a plain function runs in the thread
    pool (like ``RunInThread``); a generator function runs as its own child
    task (it may wait on descriptors), and the caller gets its return value.
    On its own the kernel just runs it; with the durable layer attached the
    outcome is journaled and a replay returns it without calling ``fn``
    again. Killing the caller kills a generator step's task.

    Args:
        fn: A plain function or a generator function.
        *args: Its arguments.
        name: The step's name in the journal (default: ``module:qualname``).
        inline: For a quick plain function: call it on the scheduler's thread
            at the commit point instead of in the pool (no thread hand-off;
            Temporal's "local activity"). It holds the loop while it runs,
            so keep it to sub-millisecond work; the watchdog reports abuse.
        timed: For a plain function: the step's result is the list ``[value,
            started, ended]``, the scheduler clock's ``time()`` right before
            and after ``fn`` ran (journaled with the value, so a replay
            returns the same times). Saves the caller a ``Now()`` on each
            side. An exception is raised as usual, without times.
    """

    __slots__ = ("args", "child", "fn", "inline", "name", "timed")
    kind = "step"

    def __init__(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        inline: bool = False,
        timed: bool = False,
    ) -> None:
        self.fn = fn
        self.args = args
        self.name = name
        self.inline = inline
        self.timed = timed
        self.child: int | None = None

    def fields(self) -> dict[str, Any]:
        """Return the step's name and argument count."""
        if self.name is not None:
            return {"fn": self.name, "nargs": len(self.args)}
        module = getattr(self.fn, "__module__", "?")
        qualname = getattr(self.fn, "__qualname__", repr(self.fn))
        return {"fn": f"{module}:{qualname}", "nargs": len(self.args)}
