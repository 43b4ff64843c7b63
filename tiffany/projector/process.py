"""The projector process: tails the WAL and applies what is durable to the SQL store.

The engine process starts it (``tiffany projector``, hidden). Decoding and
SQL happen here, in a process of its own, so they never take the engine's
GIL away from the scheduler loop (measured: a projector thread held the
engine's GIL most of the time under load and made the loop wait for it).

The engine tells it how far the WAL is durable; it reads the records from
the WAL on disk itself (:class:`~tiffany.projector.tail.WalTail`, a
:class:`~tiffany.projector.tail.JournalSource`). Messages on stdin::

    durable_seq:u64 (little-endian)   the WAL is durable up to this seq; its top
                                      bit (``READER_WAITS``) set: a read waits
                                      on the store (``min_seq``)
    seq | READ_WANTS:u64              a read waits for the store to hold ``seq``

The engine writes only the newest durable seq, so several commits make one
message; the process takes the largest of what waits on the pipe, reads
the WAL from its watermark up to it, and applies it, one transaction per
``BATCH_RECORDS``, and at most one transaction every ``GATHER_S`` while
commits keep coming (``GATHER_IDLE_S`` while no read waits on the store),
except that a read's seq which is durable and not yet applied is applied
at once, with whatever else is durable (``READ_WANTS``: a read waits for
the projection alone, not for the gathering as well).
It never reads past the durable seq (see ``WalTail``).
When no notice has come for ``IDLE_S``, it checkpoints a SQLite store's WAL
(``store.session.checkpoint``) rather than leave the work to the commit
that crosses SQLite's threshold, which a ``min_seq`` read may be waiting on.

On stdout the process reports progress, one JSON object a line, after each
transaction and each failure: ``{"last_seq": N, "errors": K,
"consecutive_errors": C, "last_error": "...", "dead_letters": D}``, plus
``"quarantined": [seq, ...]`` (at most 20) after a transaction that
quarantined records. ``last_seq`` is the store's watermark
(``projector_state.last_seq``), the seq a reader's ``min_seq`` is compared
with (docs/clock.md).

Errors: a transient database error (connection lost or refused, database
locked, server restarting; :func:`tiffany.projector.apply.is_transient`)
is retried (tenacity) with exponential backoff up to ``MAX_BACKOFF_S``,
nothing lost (the mark makes the retry skip what was kept). A record that
fails deterministically never reaches this loop: the projector quarantines
it and goes on (``dead_letters``). Anything else that escapes is retried
the same way, and ``consecutive_errors`` tells the engine the store is
stuck (``/readyz`` answers 503). A WAL that ends below the durable seq, or
a bad frame below it, ends the process with an error (the engine restarts
it and reports the restart loop). EOF on stdin: apply up to the last
durable seq received and exit 0.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Final

import structlog
import tenacity

from tiffany.projector import Projector
from tiffany.projector.tail import (
    DecodedRecord,
    JournalSource,
    journal_id,
    journal_reaches,
    journal_tail,
)
from tiffany.store import make_engine
from tiffany.store.migrate import upgrade
from tiffany.store.session import checkpoint
from tiffany.wal import Source

__all__ = [
    "BATCH_RECORDS",
    "DURABLE",
    "READER_WAITS",
    "READ_WANTS",
    "Notices",
    "Priority",
    "run_projector",
]

log = structlog.get_logger(__name__)

#: One message on stdin: the WAL's durable seq, with :data:`READER_WAITS`.
DURABLE: Final = struct.Struct("<Q")
#: The message's top bit: a read waits for the store to reach some seq (a
#: seq is below 2^53: tiffany/wire/shards.py).
READER_WAITS: Final = 1 << 63
#: The next bit: the message is not a durable seq but the seq a read waits
#: for (the engine sends one as each ``min_seq`` read starts to wait).
READ_WANTS: Final = 1 << 62
#: A message's seq, without its flags.
SEQ_MASK: Final = READ_WANTS - 1
#: Records applied per transaction at most.
BATCH_RECORDS: Final = 5_000
#: Sequence numbers of quarantined records one progress report lists at most.
MAX_REPORTED_SEQS: Final = 20
#: How long the journal must be quiet before the projector checkpoints a
#: SQLite store, in seconds: a few group commits' time, so a running plan's
#: stream of commits (milliseconds apart) does not checkpoint at each pause
#: (each checkpoint syncs the database file), while the pause before a
#: user's next request does (with 20 ms, bench/rerun.py's re-run, which
#: follows its original within milliseconds, could still meet SQLite's own).
IDLE_S: Final = 0.005
#: The shortest time between two transactions while commits keep coming, in
#: seconds: what arrives meanwhile joins the next one. Each transaction costs
#: the same few statements and a commit whatever it carries; under load the
#: engine commits several times per submission, and one transaction each
#: cost the projector more than the records did. The price
#: is at most this much more before a read with ``min_seq`` sees its write.
GATHER_S: Final = 0.005
#: The same while no read waits on the store (the engine says so in each
#: message): longer batches cost less a record (bench/projector.py). A read
#: that starts waiting ends the gathering at once (its message
#: wakes the process). Only for the file WAL: on PostgreSQL, API replicas
#: elsewhere wait through the database and their engine cannot tell.
GATHER_IDLE_S: Final = 0.02
#: How long after the last message that said a read waits the gathering
#: stays at ``GATHER_S``: under a stream of reads (a client reading its
#: writes back) a read's message would otherwise come a moment after the
#: commit it waits for, while the longer gathering had begun.
READERS_RECENT_S: Final = 1.0
#: First wait before retrying after a database error, in seconds.
FIRST_BACKOFF_S: Final = 0.1
#: Longest wait between retries after a database error, in seconds.
MAX_BACKOFF_S: Final = 5.0

Batch = list[DecodedRecord]


class Notices:
    """The engine's "durable up to N" messages on a pipe, coalesced.

    Args:
        fd: The read end (the process's stdin).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.durable_seq = 0
        #: Whether the newest message said a read waits on the store, and when
        #: one last did (monotonic seconds).
        self.reader_waits = False
        self.reader_at = float("-inf")
        #: The highest seq a read said it waits for (``READ_WANTS``).
        self.wanted = 0
        self.closed = False

    def wait(self, block: bool = True) -> int:
        """Wait for a durable seq newer than the last one returned, and return the newest.

        What else waits on the pipe is read too (without blocking), so a
        burst of messages is one answer; with ``block`` false only that
        (the newest seq known is returned at once). At EOF (the engine
        closed the pipe) :attr:`closed` turns true and the last value
        received is returned.
        """
        seen, wanted = self.durable_seq, self.wanted
        while not self.closed:
            if not block and not select.select([self.fd], [], [], 0)[0]:
                break
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.closed = True
                break
            self.buf += chunk
            whole = len(self.buf) - len(self.buf) % DURABLE.size
            newest = -1
            for (value,) in DURABLE.iter_unpack(memoryview(self.buf)[:whole]):
                if value & READ_WANTS:
                    self.wanted = max(self.wanted, value & SEQ_MASK)
                else:
                    newest = value
            del self.buf[:whole]
            if newest >= 0:
                self.reader_waits = bool(newest & READER_WAITS)
                if self.reader_waits:
                    self.reader_at = time.monotonic()
                self.durable_seq = max(self.durable_seq, newest & SEQ_MASK)
            if self.durable_seq > seen or self.reader_waits or self.wanted > wanted:
                block = False  # got news: take what else waits, without blocking
        return self.durable_seq

    def read_waits(self, applied: int) -> bool:
        """Whether a read waits for a seq that is durable and above ``applied``: apply now."""
        return applied < self.wanted <= self.durable_seq

    def quiet(self, timeout: float) -> bool:
        """True if no message arrives on the pipe within ``timeout`` seconds."""
        return not select.select([self.fd], [], [], timeout)[0]


class _Applier:
    def __init__(
        self,
        database_url: str,
        out: Any,
        journal: str | None = None,
        shard: int = 0,
        reaches: Callable[[int], bool] | None = None,
    ) -> None:
        self.database_url = database_url
        self.journal = journal  # the store must project this journal (projector_state.journal)
        self.reaches = reaches  # and the journal must reach the store's mark
        self.shard = shard  # the engine whose journal it is (tiffany/wire/shards.py)
        self.out = out
        self.engine: Any = None
        self.projector: Projector | None = None
        self.last_seq = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.last_error: str | None = None
        self.dead_letters = 0
        #: Transactions committed since the last idle checkpoint.
        self.unchecked = 0

    def _retrying(self) -> tenacity.Retrying:
        """Retry forever with exponential backoff (``FIRST_BACKOFF_S`` to ``MAX_BACKOFF_S``)."""
        return tenacity.Retrying(
            wait=tenacity.wait_exponential(multiplier=FIRST_BACKOFF_S, max=MAX_BACKOFF_S),
            before_sleep=self._failed,
        )

    def _connect(self) -> Projector:
        if self.projector is None:
            # No ping at each checkout (a round trip a transaction on
            # PostgreSQL): a dropped connection fails its transaction, which is
            # retried on a new engine (_failed disposes of this one).
            self.engine = make_engine(self.database_url, pool_pre_ping=False)
            upgrade(self.engine)
            self.projector = Projector(
                self.engine, self.journal, shard=self.shard, reaches=self.reaches
            )
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

    def start(self) -> None:
        """Connect (retrying) and learn the store's watermark."""
        self._retrying()(self._connect)
        self._report()

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
        self.unchecked += 1
        if report.quarantined:
            self.dead_letters = projector.dead_letters
            log.warning(
                "projector.quarantined",
                seqs=report.quarantined[:MAX_REPORTED_SEQS],
                count=len(report.quarantined),
                dead_letters=self.dead_letters,
            )
        self._report(report.quarantined[:MAX_REPORTED_SEQS])

    def follow(self, source: JournalSource, durable_seq: int) -> None:
        """Apply the source's records up to ``durable_seq``.

        Raises:
            RuntimeError: The journal ends below ``durable_seq``.
        """
        while self.last_seq < durable_seq:
            batch = source.read(self.last_seq, durable_seq, BATCH_RECORDS)
            if not batch:
                raise RuntimeError(
                    f"the journal ends at seq {self.last_seq}, below the durable seq {durable_seq}"
                )
            self.apply(batch)

    def idle(self) -> None:
        """Nothing to apply for a while: checkpoint a SQLite store's WAL (``session.checkpoint``).

        A failure is logged and left to SQLite's own checkpoint at a commit.
        """
        if not self.unchecked or self.engine is None:
            return
        self.unchecked = 0
        try:
            checkpoint(self.engine)
        except Exception as exc:  # noqa: BLE001 - a missed checkpoint loses nothing
            log.warning("projector.checkpoint_failed", error=repr(exc)[:500])

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


class Priority:
    """The projector's CPU priority: below its engine, a batch process while no read waits.

    ``nice`` > 0 raises the niceness by that much once (:meth:`lower`), and
    makes the process ``SCHED_BATCH``: the kernel treats it as not
    interactive, so its wake-up does not preempt a running engine or API
    thread. While reads wait on the store (``READER_WAITS``) it is an
    ordinary process again (``SCHED_OTHER``), so a woken projector runs
    when the read needs it; the niceness stays (lowering it back would
    need a privilege, switching between the two policies does not).
    Where the platform has no such policies, the niceness alone applies.
    """

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self.batch = False

    def lower(self) -> None:
        """Take the lower priority (after start-up)."""
        if self.nice > 0:
            os.nice(self.nice)
            self.readers(False)

    def readers(self, waiting: bool) -> None:
        """Reads wait on the store (an ordinary process) or none does (a batch process)."""
        if self.nice <= 0 or self.batch != waiting or not hasattr(os, "sched_setscheduler"):
            return
        policy = os.SCHED_OTHER if waiting else os.SCHED_BATCH
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, os.sched_param(0))
            self.batch = not waiting


def run_projector(
    database_url: str,
    journal: Source,
    fd: int | None = None,
    *,
    shard: int = 0,
    nice: int = 0,
) -> int:
    """Follow the journal up to the durable seqs read from ``fd`` (stdin) until EOF; return 0.

    ``journal`` is the WAL directory, or the PostgreSQL stream (``journal=postgres``),
    of engine ``shard`` (``tiffany/wire/shards.py``); ``nice``: see :class:`Priority`
    (``Settings.projector_nice``).
    """
    notices = Notices(sys.stdin.fileno() if fd is None else fd)
    # The engine sends its log's durable seq as it starts us; it is usually
    # here by now. A store mark at or below it is reached by the journal (its
    # writer says so), which spares the check a walk of a segment's records
    # (up to a whole live segment: a visible share of a restart).
    known = notices.wait(block=False)
    applier = _Applier(
        database_url,
        sys.stdout,
        journal_id(journal),
        shard,
        lambda seq: seq <= known or journal_reaches(journal, seq),
    )
    source = journal_tail(journal)
    gather_idle_s = GATHER_IDLE_S if isinstance(journal, str | os.PathLike) else GATHER_S
    try:
        applier.start()
        # Out of the collector's reach: the start-up heap (SQLAlchemy, the
        # models), so a full collection walks one batch's objects (as the
        # engine and the API do; engine/__init__.py).
        gc.collect()
        gc.freeze()
        priority = Priority(nice)
        priority.lower()
        applied_at = float("-inf")
        pending = known  # read before the loop: its first pass applies up to it
        while not notices.closed:
            if applier.unchecked and notices.quiet(IDLE_S):
                applier.idle()
            durable, pending = pending or notices.wait(), 0
            while not notices.closed:  # the last transaction was just now: gather
                readers = time.monotonic() - notices.reader_at < READERS_RECENT_S
                priority.readers(readers)
                gather = GATHER_S if readers else gather_idle_s
                gap = applied_at + gather - time.monotonic()
                if gap <= 0 or notices.read_waits(applier.last_seq) or notices.quiet(gap):
                    durable = notices.wait(block=False)
                    break
                durable = notices.wait(block=False)  # news: a read may wait now
            applied_at = time.monotonic()
            applier.follow(source, durable)
    finally:
        source.close()
        if applier.engine is not None:
            applier.engine.dispose()
    return 0
