"""The projector process: applies the engine's committed WAL frames to the SQL store.

The engine process starts it (``tiffany projector``, hidden) and writes to
its stdin, after each group commit, the frames that commit made durable.
Decoding and SQL happen here, in a process of its own, so they never take
the engine's GIL away from the scheduler loop (measured: a projector
thread held the engine's GIL 62% of the time at 200 submissions/s and made
the loop wait for it).

Messages on stdin (little-endian)::

    kind:u8 first_seq:u64 length:u32 payload[length]
    kind 1  FRAMES  payload: records first_seq.. as the WAL frames them
    kind 2  RESYNC  (length 0) records were skipped: catch up from the WAL on disk

On stdout the process reports progress, one JSON object a line, after each
transaction and each failure: ``{"last_seq": N, "errors": K,
"consecutive_errors": C, "last_error": "...", "dead_letters": D}``, plus
``"quarantined": [seq, ...]`` (at most 20) after a transaction that
quarantined records.

Errors: a transient database error (connection lost or refused, database
locked, server restarting; :func:`tiffany.store.projector.is_transient`)
is retried (tenacity) with exponential backoff up to ``MAX_BACKOFF_S``, nothing lost
(the mark makes the retry skip what was kept). A record that fails
deterministically never reaches this loop: the projector quarantines it
and goes on (``dead_letters``). Anything else that escapes is retried the
same way, and ``consecutive_errors`` tells the engine the store is stuck
(``/readyz`` answers 503). At start it catches up
from the WAL on disk (everything after the store's mark), then applies what
arrives; the projector's mark makes repeats harmless. EOF on stdin: apply
what is left and exit 0.
"""

from __future__ import annotations

import json
import os
import select
import struct
import sys
from pathlib import Path
from typing import Any, Final

import structlog
import tenacity

from tiffany.engine.projection import decode_record, decoded_batches
from tiffany.store import Projector, make_engine
from tiffany.store.migrate import upgrade
from tiffany.store.projector import Decoded
from tiffany.wal import split_frames

__all__ = ["FRAMES", "HEADER", "RESYNC", "run_projector"]

log = structlog.get_logger(__name__)

HEADER: Final = struct.Struct("<BQI")
FRAMES: Final = 1
RESYNC: Final = 2
#: Records applied per transaction at most.
BATCH_RECORDS: Final = 5_000
#: Sequence numbers of quarantined records one progress report lists at most.
MAX_REPORTED_SEQS: Final = 20
#: First wait before retrying after a database error, in seconds.
FIRST_BACKOFF_S: Final = 0.1
#: Longest wait between retries after a database error, in seconds.
MAX_BACKOFF_S: Final = 5.0

Batch = list[Decoded]


class _Reader:
    """Blocking reads of exact sizes from a file descriptor, with a look-ahead check."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def read_exact(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            chunk = os.read(self.fd, max(1 << 16, n - len(self.buf)))
            if not chunk:
                return None
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def more(self) -> bool:
        """True if a read would not block (bytes buffered or waiting)."""
        return bool(self.buf) or bool(select.select([self.fd], [], [], 0)[0])


class _Applier:
    def __init__(self, database_url: str, wal_dir: Path, out: Any) -> None:
        self.database_url = database_url
        self.wal_dir = wal_dir
        self.out = out
        self.engine: Any = None
        self.projector: Projector | None = None
        self.last_seq = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.last_error: str | None = None
        self.dead_letters = 0

    def _retrying(self) -> tenacity.Retrying:
        """Retry forever with exponential backoff (``FIRST_BACKOFF_S`` to ``MAX_BACKOFF_S``)."""
        return tenacity.Retrying(
            wait=tenacity.wait_exponential(multiplier=FIRST_BACKOFF_S, max=MAX_BACKOFF_S),
            before_sleep=self._failed,
        )

    def _connect(self) -> Projector:
        if self.projector is None:
            self.engine = make_engine(self.database_url)
            upgrade(self.engine)
            self.projector = Projector(self.engine)
            self.last_seq = max(self.last_seq, self.projector.last_seq)
            self.dead_letters = self.projector.dead_letters
        return self.projector

    def _failed(self, state: tenacity.RetryCallState) -> None:
        """Count, log and report a failed attempt; drop the engine (reconnect next time)."""
        exc = state.outcome.exception() if state.outcome is not None else None
        backoff = state.next_action.sleep if state.next_action is not None else 0.0
        self.errors += 1
        self.consecutive_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:500]
        log.warning("projector.failed", error=repr(exc)[:500], retry_in_s=backoff)
        self._report()
        if self.engine is not None:
            self.engine.dispose()
        self.engine = self.projector = None

    def apply(self, batch: Batch) -> None:
        if not batch:
            return
        projector: Projector | None = None
        report = None
        for attempt in self._retrying():
            with attempt:  # any error: retried (the database is down, or stuck; nothing kept)
                projector = self._connect()
                report = projector.apply(batch)
        assert projector is not None
        assert report is not None
        self.last_seq = max(self.last_seq, report.last_seq)
        self.consecutive_errors = 0
        if report.quarantined:
            self.dead_letters = projector.dead_letters
            log.warning(
                "projector.quarantined",
                seqs=report.quarantined[:MAX_REPORTED_SEQS],
                count=len(report.quarantined),
                dead_letters=self.dead_letters,
            )
        self._report(report.quarantined[:MAX_REPORTED_SEQS])

    def catch_up(self) -> None:
        projector = self._retrying()(self._connect)
        self.last_seq = max(self.last_seq, projector.last_seq)
        for batch in decoded_batches(self.wal_dir, BATCH_RECORDS, self.last_seq + 1):
            self.apply(batch)
        self._report()

    def _report(self, quarantined: list[int] | None = None) -> None:
        report: dict[str, Any] = {
            "last_seq": self.last_seq,
            "errors": self.errors,
            "consecutive_errors": self.consecutive_errors,
            "last_error": self.last_error,
            "dead_letters": self.dead_letters,
        }
        if quarantined:
            report["quarantined"] = quarantined
        self.out.write(json.dumps(report) + "\n")
        self.out.flush()


def run_projector(database_url: str, wal_dir: Path, fd: int | None = None) -> int:
    """Apply frames read from ``fd`` (stdin) until EOF (see the module docstring); return 0."""
    reader = _Reader(sys.stdin.fileno() if fd is None else fd)
    applier = _Applier(database_url, wal_dir, sys.stdout)
    applier.catch_up()
    batch: Batch = []
    while True:
        header = reader.read_exact(HEADER.size)
        if header is None:
            break
        kind, first, length = HEADER.unpack(header)
        payload = reader.read_exact(length) if length else b""
        if payload is None:
            break
        if kind == RESYNC:
            if batch:
                applier.apply(batch)
                batch = []
            applier.catch_up()
            continue
        for i, (rtype, body) in enumerate(split_frames(payload)):
            seq = first + i
            if seq > applier.last_seq:
                run_no, record = decode_record(rtype, body)
                batch.append((seq, rtype, run_no, record))
        # One transaction per burst: apply when nothing more waits, or the batch is full.
        if len(batch) >= BATCH_RECORDS or not reader.more():
            applier.apply(batch)
            batch = []
    if batch:
        applier.apply(batch)
    if applier.engine is not None:
        applier.engine.dispose()
    return 0
