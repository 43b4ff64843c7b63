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
