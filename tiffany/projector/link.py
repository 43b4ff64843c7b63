"""The engine's side of the projector: "durable up to N" out, "projected up to M" in.

The projector process (:mod:`tiffany.projector.process`) tails the WAL
on disk itself. The engine tells it only how far the WAL is durable: after
each group commit the WAL calls :meth:`ProjectorLink.committed` on the
scheduler thread, which writes the durable seq to the process's stdin as 8
bytes, with one non-blocking ``write`` (no copy, never blocks). When it
cannot (the pipe is full because the process is busy, the pipe is being
replaced, or the process died), it sets an event instead, and a notifier
thread writes the newest value, coalesced: however many commits happened
since, one number goes; the same thread restarts a process that died,
through the one supervisor every child process has
(:class:`tiffany.supervisor.Child`: exponential backoff from
``RESTART_DELAY_S`` to ``MAX_RESTART_DELAY_S``, reset after a run of
``RESTART_STABLE_S``). A reader thread takes the
process's progress reports (``last_seq``, the store's watermark) and
answers the readers waiting for it (:meth:`when_projected`).

Nothing is lost and memory stays bounded: the process reads the records
from the WAL, where every durable record already is, so a process that
starts late, restarts, or falls behind (the database is slow or down) just
reads further; the engine holds nothing for it but two integers.

Reading your writes (docs/clock.md): :meth:`when_projected` returns a future
that is resolved, by the reader thread, with ``{"last_seq", "reached": true}``
once a report says the store holds ``seq``, or by the notifier thread with
``reached: false`` when its wait ran out. No thread sleeps on a waiter's
behalf and none polls.

Health (:meth:`ProjectorLink.health`, the engine's ``status`` and
``/readyz``): the store is *stalled* when records wait (lag > 0) and none
was applied for ``STALL_AFTER_S``, when the process reported
``FAILING_AFTER_ERRORS`` failures in a row, or when it was restarted
``RESTART_LOOP_COUNT`` times within ``RESTART_LOOP_WINDOW_S``. Lag alone,
while records are being applied, is not a stall: a burst of submissions
makes lag, and the projector catches up.

Rejected: handing the process a copy of each commit's frames through the
pipe (the previous design). It saved the process a read of the page cache
but cost a copy per commit, a byte budget, and a RESYNC message for when
the budget ran out, and it cannot work once the journal is in PostgreSQL
(issue #11), where the projector has to tail the journal anyway.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, Final

import structlog

from tiffany.projector.process import DURABLE, READ_WANTS, READER_WAITS
from tiffany.supervisor import Child, RestartPolicy

__all__ = ["ProjectorLink"]

log = structlog.get_logger(__name__)

#: The wait before restarting a projector process that died, in seconds;
#: doubled at each death in a row up to ``MAX_RESTART_DELAY_S``, and back to
#: this for a process that ran ``RESTART_STABLE_S`` before it died.
RESTART_DELAY_S: Final = 0.2
MAX_RESTART_DELAY_S: Final = 10.0
RESTART_STABLE_S: Final = 60.0
#: Records waiting and none applied for this long: the store is stalled, in seconds.
STALL_AFTER_S: Final = 5.0
#: Failures in a row the process reports before the store counts as stalled.
FAILING_AFTER_ERRORS: Final = 3
#: Restarts within ``RESTART_LOOP_WINDOW_S`` that make a restart loop.
RESTART_LOOP_COUNT: Final = 3
#: The window of a restart loop, in seconds.
RESTART_LOOP_WINDOW_S: Final = 60.0
#: Longest the notifier thread sleeps when nothing happens, in seconds.
IDLE_WAKE_S: Final = 1.0

#: A reader waiting for the store: ``(seq, order, deadline, future)``.
_Waiter = tuple[int, int, float, "Future[dict[str, Any]]"]


class ProjectorLink:
    """Runs the projector process and follows its progress (see the module docstring).

    Args:
        data_dir: The engine's data dir (passed to ``tiffany projector``).
        env: The child's environment (``TIFFANY_DATABASE_URL`` and logging settings).
    """

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.env = env
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._child = Child(
            "projector",
            [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "projector"],
            env,
            RestartPolicy(RESTART_DELAY_S, MAX_RESTART_DELAY_S, stable_s=RESTART_STABLE_S),
            pipes=True,  # its lifeline is its stdin's EOF (tiffany/supervisor/__init__.py)
            on_start=self._started,
            on_died=self._died,
        )
        self._thread: threading.Thread | None = None
        #: The last WAL sequence number the store holds (the process's report).
        self.last_seq = 0
        #: The last sequence number the WAL made durable.
        self.durable_seq = 0
        #: Database errors the process reported, and its restarts.
        self.errors = 0
        self.restarts = 0
        #: Failures in a row, and the last one (``TypeName: message``).
        self.consecutive_errors = 0
        self.last_error: str | None = None
        #: Records the projector quarantined (``dead_letters`` rows).
        self.dead_letters = 0
        self._first_report = threading.Event()  # set by a process's first report
        self._progress_at = time.monotonic()
        self._restarted_at: deque[float] = deque(maxlen=RESTART_LOOP_COUNT)
        #: Called (reader thread) with the seqs of records the projector just
        #: quarantined and the dead-letter total; the engine publishes an event.
        self.on_quarantine: Callable[[list[int], int], None] | None = None
        self._lock = threading.Lock()
        self._waiters: list[_Waiter] = []  # a heap by seq
        self._order = itertools.count()
        #: The live process's stdin (-1: none), and what it was last told;
        #: both under ``_pipe_lock``, which the loop only ever tries.
        self._pipe_lock = threading.Lock()
        self._pipe_fd = -1
        self._sent = -1

    # -- scheduler thread --------------------------------------------------------

    def committed(self, durable_seq: int) -> None:
        """The WAL is durable up to ``durable_seq``: tell the process (O(1), never blocks)."""
        if self.durable_seq <= self.last_seq:
            self._progress_at = time.monotonic()  # caught up until now: the wait starts here
        self.durable_seq = durable_seq
        if not self._tell(always=True):
            self._wake.set()

    def _tell(self, always: bool = False) -> bool:
        """:meth:`_send` without waiting for the pipe's lock; False on any failure.

        The notifier sees to what this could not send.
        """
        try:
            return self._send(always=always)
        except OSError:  # the process is gone: the notifier restarts it
            return False

    def _send(self, *, always: bool = False, block: bool = False) -> bool:
        """Write :meth:`_message` to the process if it is new (``always``: anyway).

        Returns False when the pipe's lock is taken (unless ``block``), the
        pipe is full (the process is busy) or there is none; never waits on
        the pipe itself. Raises ``OSError`` for a broken pipe.
        """
        if not self._pipe_lock.acquire(blocking=block):
            return False
        try:
            if self._pipe_fd < 0:
                return False
            message = self._message()
            if always or message != self._sent:
                os.write(self._pipe_fd, DURABLE.pack(message))  # 8 bytes: atomic
                self._sent = message
            return True
        except BlockingIOError:  # full: the next wake sends the newest value instead
            return False
        finally:
            self._pipe_lock.release()

    def _message(self) -> int:
        """What the process is told: the durable seq, and whether a read waits on the store.

        While a read waits (:meth:`when_projected`), the process applies what
        is durable after :data:`~tiffany.projector.process.GATHER_S`;
        while none does, it gathers longer (``GATHER_IDLE_S``): fewer, larger
        transactions, less CPU a record.
        """
        return self.durable_seq | READER_WAITS if self._waiters else self.durable_seq

    # -- any thread ----------------------------------------------------------------

    def when_projected(self, seq: int, wait_s: float) -> Future[dict[str, Any]]:
        """A future of ``{"last_seq", "reached"}``, done once the store holds ``seq``.

        It is done at once if the store already does; after ``wait_s``
        seconds it is done with ``reached: false`` and the store's watermark.
        """
        fut: Future[dict[str, Any]] = Future()
        with self._lock:
            if self.last_seq >= seq:
                fut.set_result({"last_seq": self.last_seq, "reached": True})
                return fut
            deadline = time.monotonic() + max(0.0, wait_s)
            heapq.heappush(self._waiters, (seq, next(self._order), deadline, fut))
        self._ask(seq)  # the process applies it as soon as it is durable
        self._tell()  # a read waits: the process gathers for less
        self._wake.set()  # the notifier sees the new deadline (and tells, if this could not)
        return fut

    def _ask(self, seq: int) -> None:
        """Tell the process a read waits for ``seq`` (``READ_WANTS``); best effort.

        Not on the scheduler thread (a control connection's), so it may wait
        for the pipe's lock. A full pipe or a process away drops the message:
        the read then waits for the gathering (``GATHER_S``) as well.
        """
        with self._pipe_lock, contextlib.suppress(OSError):
            if self._pipe_fd >= 0:
                os.write(self._pipe_fd, DURABLE.pack(seq | READ_WANTS))

    @property
    def lag_records(self) -> int:
        """Records durable in the WAL but not yet in the store."""
        return max(0, self.durable_seq - self.last_seq)

    def health(self) -> dict[str, Any]:
        """The projector's health: progress, lag, failures, and whether it is stalled.

        ``stalled_reason`` is None when the store keeps up or is catching
        up (see the module docstring).
        """
        now = time.monotonic()
        lag = self.lag_records
        idle_s = now - self._progress_at
        reason: str | None = None
        if self.consecutive_errors >= FAILING_AFTER_ERRORS:
            reason = f"{self.consecutive_errors} failures in a row: {self.last_error}"
        elif (
            len(self._restarted_at) >= RESTART_LOOP_COUNT
            and now - self._restarted_at[0] < RESTART_LOOP_WINDOW_S
        ):
            reason = f"projector process restarted {RESTART_LOOP_COUNT} times in a minute"
        elif lag > 0 and idle_s > STALL_AFTER_S:
            reason = f"no record applied for {idle_s:.0f} s, {lag} waiting"
        return {
            "last_seq": self.last_seq,
            "durable_seq": self.durable_seq,
            "lag_records": lag,
            "dead_letters": self.dead_letters,
            "errors": self.errors,
            "consecutive_errors": self.consecutive_errors,
            "last_error": self.last_error,
            "restarts": self.restarts,
            "stalled": reason is not None,
            "stalled_reason": reason,
        }

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the projector process and the notifier thread."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._notify, name="tiffany-projector-link", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Send the last durable seq, close the pipe, and wait for the process to finish."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._child.stop(timeout, term=False)  # the notifier closed its stdin: it drains and exits
        self._expire(float("inf"))  # nobody is left to answer them

    @property
    def reported(self) -> bool:
        """Whether a process has reported yet (it reports the store's mark once up)."""
        return self._first_report.is_set()

    def wait_reported(self, timeout: float) -> bool:
        """Until a process has reported (True), or for ``timeout`` seconds (False)."""
        return self._first_report.wait(timeout)

    # -- the reader thread ---------------------------------------------------------------

    def _read_reports(self, out: IO[bytes]) -> None:
        for line in out:
            with contextlib.suppress(ValueError):
                self._take_report(json.loads(line))

    def _take_report(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._first_report.set()
            seq = int(report.get("last_seq", 0))
            if seq > self.last_seq:
                self.last_seq = seq
                self._progress_at = time.monotonic()
            self.errors = int(report.get("errors", self.errors))
            self.consecutive_errors = int(report.get("consecutive_errors", 0))
            error = report.get("last_error")
            self.last_error = str(error) if error is not None else None
            self.dead_letters = int(report.get("dead_letters", self.dead_letters))
            waiters = self._waiters
            reached: list[Future[dict[str, Any]]] = []
            while waiters and waiters[0][0] <= self.last_seq:
                reached.append(heapq.heappop(waiters)[3])
            answer = {"last_seq": self.last_seq, "reached": True}
        for fut in reached:
            if not fut.done():
                fut.set_result(answer)
        quarantined = report.get("quarantined")
        if quarantined and self.on_quarantine is not None:
            self.on_quarantine(list(quarantined), self.dead_letters)

    # -- the notifier thread -------------------------------------------------------------

    def _expire(self, now: float) -> float:
        """Answer the waiters whose time ran out; return the next deadline (or inf)."""
        with self._lock:
            expired = [w for w in self._waiters if w[2] <= now]
            if expired:
                self._waiters = [w for w in self._waiters if w[2] > now]
                heapq.heapify(self._waiters)
            answer = {"last_seq": self.last_seq, "reached": False}
            nearest = min((w[2] for w in self._waiters), default=float("inf"))
        for _seq, _order, _deadline, fut in expired:
            if not fut.done():
                fut.set_result(answer)
        return nearest

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        """A new process (the supervisor's ``on_start``): a reader for its reports."""
        assert proc.stdout is not None
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # the notifier never waits on the pipe
        threading.Thread(
            target=self._read_reports,
            args=(proc.stdout,),
            name="tiffany-projector-reports",
            daemon=True,
        ).start()
        log.info("projector.started", pid=proc.pid)

    def _died(self, child: Child, code: int, delay: float) -> None:
        """A process died (the supervisor's ``on_died``): count it for :meth:`health`."""
        log.warning("projector.died", code=code, restart_in_s=delay)
        self.restarts += 1
        self._restarted_at.append(time.monotonic())

    def _live(self) -> subprocess.Popen[bytes] | None:
        """The live process, starting one when due; None while a restart waits (then waits).

        The wait is the restart's backoff (:class:`~tiffany.supervisor.Child`),
        cut short by :meth:`stop`.
        """
        child = self._child
        if child.alive():
            return child.proc
        self._attach(None)
        try:
            if child.tend(may_start=not self._stop.is_set()):
                return child.proc
        except OSError as exc:
            log.error("projector.spawn_failed", error=repr(exc))
        if child.due is not None:
            self._stop.wait(max(0.0, child.due - time.monotonic()))
        return None

    def _attach(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Point the loop's writes at ``proc``'s stdin (None: at nothing); it is told afresh."""
        fd = -1 if proc is None or proc.stdin is None else proc.stdin.fileno()
        with self._pipe_lock:
            self._pipe_fd, self._sent = fd, -1

    def _notify(self) -> None:
        attached: subprocess.Popen[bytes] | None = None
        while True:
            proc = self._live()
            if proc is None:
                if self._stop.is_set():
                    return
                continue
            if proc is not attached or self._pipe_fd < 0:
                self._attach(proc)
                attached = proc
            self._wake.clear()  # before looking: a commit from here on wakes us again
            try:
                self._send(block=True)
            except OSError as exc:
                log.warning("projector.pipe_failed", error=repr(exc))
                continue
            if self._stop.is_set():
                self._close(proc)
                return
            nearest = self._expire(time.monotonic())
            self._wake.wait(min(IDLE_WAKE_S, max(0.0, nearest - time.monotonic())))

    def _close(self, proc: subprocess.Popen[bytes]) -> None:
        """Tell the process the last durable seq (waiting for room if need be), then EOF."""
        assert proc.stdin is not None
        with self._pipe_lock:
            sent, self._pipe_fd = self._sent, -1  # the loop writes no more
        with contextlib.suppress(OSError):
            if self.durable_seq != sent & ~READER_WAITS:
                os.set_blocking(proc.stdin.fileno(), True)
                os.write(proc.stdin.fileno(), DURABLE.pack(self.durable_seq))
            proc.stdin.close()
