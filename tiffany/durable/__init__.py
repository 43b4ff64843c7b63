"""Durable execution: the journal of every dispatch, deterministic replay, recovery.

Public API::

    from tiffany.durable import Runtime, Step, verify

    with Runtime("./.tiffany") as rt:
        rt.recover()                       # unfinished runs continue
        run_id = rt.submit("pkg.mod:main", 3)
        rt.run()

See ``journal.py`` for what is recorded and why replay is exact.
"""

from tiffany.durable.history import RunIndex, RunInfo, UnknownRun, load, scan
from tiffany.durable.journal import JournalInstrument, RecoveryError, RunState, signal_bytes
from tiffany.durable.runtime import EntryError, Runtime, VerifyReport, resolve_callable, verify
from tiffany.durable.step import Step
from tiffany.wire.records import RecordType

__all__ = [
    "EntryError",
    "JournalInstrument",
    "RecordType",
    "RecoveryError",
    "RunIndex",
    "RunInfo",
    "RunState",
    "Runtime",
    "Step",
    "UnknownRun",
    "VerifyReport",
    "load",
    "resolve_callable",
    "scan",
    "signal_bytes",
    "verify",
]
