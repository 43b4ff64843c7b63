"""The exit codes of every ``tiffany`` command: one table (docs/cli.md).

=====  ===============  ==========================================================
code   name             meaning
=====  ===============  ==========================================================
0      OK               done; for ``run`` and ``replay``: the run succeeded
1      FAILED           the run failed or was cancelled, ``verify`` found a
                        divergence, or the operation was refused (a finished run
                        cancelled or signalled, a WAL check that found damage)
2      USAGE            bad input: an invalid plan, option, input or token, or
                        a tool module that does not import
3      NOT_FOUND        no such run, tool, schedule or memory item
4      WAL_DAMAGED      the engine refuses a damaged WAL (``tiffany wal verify``,
                        ``tiffany wal repair``)
5      UNAVAILABLE      nothing answers: no engine serves the data dir, or the
                        server at ``--url`` is unreachable
130    INTERRUPTED      Ctrl-C (the run stays in the data dir: ``tiffany replay``
                        resumes it)
=====  ===============  ==========================================================

The engine's refusals (:class:`~tiffany.errors.Refusal`) map to these in
one table, :data:`REFUSAL_EXITS`; the memory's (``tiffany/memory``) in
:func:`for_memory`'s; the HTTP API's errors by their status
(:func:`for_status`).
"""

from __future__ import annotations

from typing import Final

from tiffany.errors import (
    CommandTooLarge,
    EngineFault,
    EngineNotReady,
    InvalidCommand,
    MalformedCommand,
    MemoryFull,
    MemoryInvalid,
    MemoryNotFound,
    Refusal,
    RunConflict,
    RunNotFound,
    SignalBytesHeldFull,
    SignalsHeldFull,
    TiffanyError,
    VerifyTimedOut,
)

__all__ = [
    "FAILED",
    "INTERRUPTED",
    "MEMORY_EXITS",
    "NOT_FOUND",
    "OK",
    "UNAVAILABLE",
    "USAGE",
    "WAL_DAMAGED",
    "for_memory",
    "for_refusal",
    "for_status",
]

OK: Final = 0
FAILED: Final = 1
USAGE: Final = 2
NOT_FOUND: Final = 3
WAL_DAMAGED: Final = 4
UNAVAILABLE: Final = 5
INTERRUPTED: Final = 130


def for_status(status: int) -> int:
    """The exit code for an HTTP (or control channel) error status."""
    if status in (400, 401, 403, 413, 415, 422):
        return USAGE
    if status == 404:
        return NOT_FOUND
    if status in (502, 503, 504):
        return UNAVAILABLE
    return FAILED


def for_refusal(exc: Refusal) -> int:
    """The exit code for a refusal of the engine (:data:`REFUSAL_EXITS`, by its nearest class)."""
    for cls in type(exc).__mro__:
        code = REFUSAL_EXITS.get(cls)
        if code is not None:
            return code
    return FAILED


#: The exit code of each of the engine's refusals (a subclass takes its class's row).
REFUSAL_EXITS: Final[dict[type, int]] = {
    Refusal: FAILED,
    MalformedCommand: USAGE,
    InvalidCommand: USAGE,
    CommandTooLarge: USAGE,
    SignalBytesHeldFull: USAGE,
    RunNotFound: NOT_FOUND,
    RunConflict: FAILED,
    SignalsHeldFull: FAILED,
    EngineFault: FAILED,
    EngineNotReady: UNAVAILABLE,
    VerifyTimedOut: UNAVAILABLE,
}


def for_memory(exc: TiffanyError) -> int | None:
    """The exit code for a refusal of the memory store; None if ``exc`` is none of them.

    A bad namespace, key or query is bad input (2), an unknown item 3, a
    full namespace a refusal (1).
    """
    return next((MEMORY_EXITS[c] for c in type(exc).__mro__ if c in MEMORY_EXITS), None)


#: The exit code of each of the memory's refusals (a subclass takes its class's row).
MEMORY_EXITS: Final[dict[type[TiffanyError], int]] = {
    MemoryInvalid: USAGE,
    MemoryNotFound: NOT_FOUND,
    MemoryFull: FAILED,
}
