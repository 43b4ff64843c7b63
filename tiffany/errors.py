"""The Tiffany error tree.

Every error Tiffany raises on purpose derives from :class:`TiffanyError` and
carries a stable ``code`` (what the HTTP API returns) and structured fields
(``fields``), so callers never parse messages.

The one exception that does not derive from ``Exception`` is
:class:`TaskCancelled`: it is thrown into a task that is being killed, and a
task's ``except Exception`` must not swallow it (curio, DBOS and trio do the
same).
"""

from __future__ import annotations

from typing import Any


class TiffanyError(Exception):
    """Root of every error Tiffany raises on purpose.

    Attributes:
        code: A stable, machine-readable identifier (``"wal.corrupt"``).
        fields: Structured details (segment, offset, task id, ...).
    """

    code: str = "tiffany.error"
    #: An outcome the program reports (a tool's failure, a plan's failed
    #: steps), not a bug: the kernel logs the task's crash without alarm.
    outcome: bool = False

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields

    def to_dict(self) -> dict[str, Any]:
        """Return the error as a JSON-able mapping (what the API sends)."""
        return {"code": self.code, "message": self.message, **self.fields}


# -- Kernel ------------------------------------------------------------------


class TaskCancelled(BaseException):
    """Thrown into a task at its yield point when the task is killed.

    A ``BaseException`` so that ``except Exception`` in task code does not
    swallow a cancellation. ``finally`` blocks run as usual.
    """


class KernelError(TiffanyError):
    """Errors of the scheduler kernel."""

    code = "kernel.error"


class KernelInternalError(KernelError):
    """A bug in the kernel itself: the loop stops loudly."""

    code = "kernel.internal"


class InstrumentFailure(KernelError):
    """A critical instrument (the journal) failed: the kernel stops."""

    code = "kernel.instrument_failed"


class SystemCallMisuse(KernelError, TypeError):
    """A task yielded something that is neither a system call, a generator, nor None."""

    code = "kernel.misuse"


class UnknownTask(KernelError, LookupError):
    """A system call named a task id the scheduler does not know."""

    code = "kernel.unknown_task"


class TaskError(KernelError):
    """Base of what ``WaitTask`` raises when the awaited task did not return."""

    code = "task.error"


class TaskCrashed(TaskError):
    """The awaited task raised; the original exception is ``__cause__``."""

    code = "task.crashed"


class TaskKilled(TaskError):
    """The awaited task was cancelled (killed) before it returned."""

    code = "task.killed"


class WaitTimeout(TaskError, TimeoutError):
    """``WaitTask(tid, timeout=...)`` gave up before the task finished."""

    code = "task.wait_timeout"


class QueueFull(KernelError):
    """``Queue.put`` on a bounded queue that is full."""

    code = "kernel.queue_full"


class QueueEmpty(KernelError):
    """``Queue.get_nowait`` on an empty queue."""

    code = "kernel.queue_empty"


# -- WAL ---------------------------------------------------------------------


class WalError(TiffanyError):
    """Errors of the write-ahead log."""

    code = "wal.error"


class WalFormatError(WalError):
    """A file in the WAL directory is not a WAL segment we can read."""

    code = "wal.format"


class WalCorruptionError(WalError):
    """A bad record that is not a torn tail: the log refuses to open."""

    code = "wal.corrupt"


class WalLockedError(WalError):
    """Another engine holds the lock on this WAL directory."""

    code = "wal.locked"


class WalFailedError(WalError):
    """A write or fsync failed: the WAL is stopped (fail-stop) and acknowledges nothing more."""

    code = "wal.failed"


class JournalUnsupported(TiffanyError):
    """The journal has no such thing: a file WAL's repair on PostgreSQL, streams on files.

    The message says what the journal is and where the command does work
    (``tiffany.ports.journals``); the CLI prints it as it is.
    """

    code = "journal.unsupported"


# -- Durable execution -------------------------------------------------------


class NondeterminismError(TiffanyError):
    """Replay saw a system call that differs from the journal."""

    code = "replay.nondeterminism"


class ExportError(TiffanyError):
    """A run export file that does not check out (docs/replay.md, "Export format").

    Its fields name the file (``path``), the byte ``offset`` where reading
    stopped and the ``reason``.
    """

    code = "export.invalid"


class ExportTooNew(ExportError):
    """A run export written in a format version newer than this code reads."""

    code = "export.too_new"


class UnjournalableValue(TiffanyError):
    """A value from outside a run (a step's result) that the journal cannot record.

    Too large for one record, or not encodable (an integer beyond 64 bits,
    a mapping key of no JSON-like type). The task that was to receive it
    gets this error instead (the step fails, its retries apply), and the
    journal records the error: a replay hands back the same failure.
    """

    code = "journal.value"
    outcome = True


class ReservedSignal(TiffanyError):
    """A client's signal named in the engine's reserved namespace (``records.reserved_signal``).

    The control channel, the API and the CLI refuse such a name first (422);
    the journal raising it means a client path reached it all the same.
    """

    code = "signal.reserved"


class LimitExceeded(TiffanyError):
    """A bound on what a plan or a client can make grow was reached.

    Its ``code`` is ``limit.<setting>`` (``limit.max_child_depth``...), and
    its fields name the ``setting`` (``TIFFANY_MAX_CHILD_DEPTH``) and the
    ``limit``, so that a refusal always says which bound to raise.
    """

    code = "limit.exceeded"
    outcome = True

    def __init__(self, setting: str, limit: int, message: str, **fields: object) -> None:
        super().__init__(message, setting=f"TIFFANY_{setting.upper()}", limit=limit, **fields)
        self.code = f"limit.{setting}"


# -- Commands refused ----------------------------------------------------------
#
# What the engine answers "no" to a command (submit, cancel, signal, rerun,
# verify...) with: a domain refusal, never an HTTP status. Each crosses the
# control channel (socket or database) as its ``kind`` with its message, the
# field it names and its structured ``detail`` (tiffany/wire/control.py); the
# API maps the kinds to HTTP statuses in one place (tiffany/api/problems.py),
# the CLI to its exit codes (tiffany/cli/exits.py).


class Refusal(TiffanyError):
    """The engine refused a command: an answer about the run or the command, not a bug.

    Attributes:
        kind: The refusal's stable name on the control channel.
        field: The command's field the refusal is about (``"name"``, ``"seq"``), if any.
        detail: Structured detail: for an invalid command a list of
            ``{"loc", "msg"}``; for a finished run ``{"status"}``; for a bound
            the :class:`LimitExceeded`'s fields.
    """

    code = "engine.refused"
    kind: str = "refused"

    def __init__(self, message: str, *, field: str | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.detail = detail

    def to_dict(self) -> dict[str, Any]:
        """Return the refusal as a JSON-able mapping."""
        return {"code": self.code, "message": self.message, "detail": self.detail}


class RunNotFound(Refusal):
    """No run of that id: not held by the engine, not in the store."""

    code = "run.not_found"
    kind = "run_not_found"


class RunConflict(Refusal):
    """The command does not fit the run's state (finished, not finished, already there)."""

    code = "run.conflict"
    kind = "run_conflict"


class RunFinished(RunConflict):
    """The run has finished: it takes no cancel and no signal (``detail``: its ``status``)."""

    kind = "run_finished"


class RunNotFinished(RunConflict):
    """The run is still running: only a finished run verifies or re-runs."""

    kind = "run_not_finished"


class RunExists(RunConflict):
    """A submission named a run id that exists already (``detail``: its ``run_id``)."""

    kind = "run_exists"


class KeyReused(RunConflict):
    """An idempotency key named an earlier submission of another body (``detail``: its run)."""

    kind = "key_reused"


class InvalidCommand(Refusal):
    """A command's field is invalid (a plan, its inputs, a signal's name or payload).

    ``field`` names the field; ``detail`` lists ``{"loc", "msg"}`` for each
    problem (a plan's fields, a payload's JSON pointers).
    """

    code = "plan.invalid"
    kind = "invalid"

    def __init__(self, message: str, *, field: str | None = None, detail: Any = None) -> None:
        if detail is None and field is not None:
            detail = [{"loc": field, "msg": message}]
        super().__init__(message, field=field, detail=detail)


class MalformedCommand(Refusal):
    """Not a command at all: an unknown ``op``, or a line that is no JSON object."""

    code = "request.invalid"
    kind = "malformed"


class CommandTooLarge(Refusal):
    """A command's frame is over the control channel's limit."""

    kind = "too_large"


class SignalsHeldFull(Refusal):
    """The run holds as many clients' signals no step has received as it may (a count).

    ``detail``: the :class:`LimitExceeded` that names the setting.
    """

    code = "limit.max_pending_signals"
    kind = "signals_held_full"


class SignalBytesHeldFull(Refusal):
    """The run's clients' signals no step has received would pass their byte bound."""

    code = "limit.max_pending_signal_bytes"
    kind = "signal_bytes_held_full"


class EngineNotReady(Refusal):
    """The engine cannot take the command now (stopping, busy, its store behind): retry."""

    code = "engine.not_ready"
    kind = "not_ready"


class VerifyTimedOut(Refusal):
    """A verify's replay took longer than its bound (its worker is killed)."""

    kind = "verify_timeout"


class EngineFault(Refusal):
    """The engine failed to carry the command out (a bug, a dead worker): not the caller's."""

    kind = "fault"


# -- Memory refused ------------------------------------------------------------
#
# The MemoryStore's refusals (tiffany/memory/): answers about the caller's
# arguments or the store's bounds, never bugs. Each names the argument it is
# about (``field``) and carries a stable ``code``; the HTTP API maps them to
# statuses where it maps the others (tiffany/api/problems.py).


class MemoryRefused(TiffanyError):
    """Base of the MemoryStore's refusals.

    Attributes:
        field: The argument the refusal is about (``"namespace"``, ``"key"``,
            ``"value"``, ``"op"``...), if any.
        detail: Structured detail (for a bound: ``{"limit", "setting"}``).
    """

    code = "memory.refused"
    outcome = True

    def __init__(self, message: str, *, field: str | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.detail = detail

    def to_dict(self) -> dict[str, Any]:
        """Return the refusal as a JSON-able mapping: code, message, field, detail."""
        return {
            "code": self.code,
            "message": self.message,
            "field": self.field,
            "detail": self.detail,
        }


class MemoryInvalid(MemoryRefused):
    """An argument of a memory call is out of its bounds: nothing was written.

    Also a write under an ``op`` already used for another write (``field="op"``).
    The bounds are in docs/memory.md.
    """

    code = "memory.invalid"


class MemoryNotFound(MemoryRefused):
    """A memory call named an item that is not there (``field`` names the argument)."""

    code = "memory.not_found"


class MemoryFull(MemoryRefused):
    """A namespace holds as many items as it may (``TIFFANY_MEMORY_MAX_ITEMS``).

    ``detail``: ``{"namespace", "limit", "setting"}``.
    """

    code = "memory.full"


class EngineUnavailable(TiffanyError):
    """No engine is reachable for the command (not started, restarting, gone, or no answer)."""

    code = "control.unavailable"


def _refusals() -> dict[str, type[Refusal]]:
    found: dict[str, type[Refusal]] = {}
    todo: list[type[Refusal]] = [Refusal]
    while todo:
        cls = todo.pop()
        found[cls.kind] = cls
        todo.extend(cls.__subclasses__())
    return found


#: Every refusal by its ``kind`` (how a refusal crosses the control channel).
REFUSALS: dict[str, type[Refusal]] = _refusals()


def refusal(kind: str, message: str, field: str | None = None, detail: Any = None) -> Refusal:
    """The refusal of ``kind`` (an unknown kind: a plain :class:`Refusal`)."""
    cls = REFUSALS.get(kind, Refusal)
    out = Refusal.__new__(cls)
    Refusal.__init__(out, message, field=field, detail=detail)
    return out
