"""The engine's side of the projector: hands committed frames to the projector process.

The WAL calls :meth:`ProjectorLink.hand_over` on the scheduler thread after
each group commit; that costs a ``deque.append`` and an ``Event.set``. A
forwarding thread writes the frames to the projector process's stdin
(``os.write`` releases the GIL while it waits), and a reader thread takes
its progress reports. Decoding and SQL happen in that other process
(:mod:`tiffany.engine.projector_proc`), never on this process's GIL.

Nothing is lost and memory stays bounded:

* the projector process catches up from the WAL on disk when it starts, so
  frames committed before it was up (or while it was restarting) are read
  back from disk;
* when more than ``max_pending_bytes`` wait here (the database is slow or
  down, the pipe is full), the listener stops keeping frames and the next
  message is ``RESYNC``: the process catches up from disk, which holds every
  committed record (they are on disk before the listener runs);
* a projector process that dies is started again (with backoff).

Health (:meth:`ProjectorLink.health`, the engine's ``status`` and
``/readyz``): the store is *stalled* when records wait (lag > 0) and none
was applied for ``STALL_AFTER_S``, when the process reported
``FAILING_AFTER_ERRORS`` failures in a row, or when it was restarted
``RESTART_LOOP_COUNT`` times within ``RESTART_LOOP_WINDOW_S``. Lag alone,
while records are being applied, is not a stall: a burst of submissions
makes lag, and the projector catches up.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

import structlog

from tiffany.engine.projector_proc import FRAMES, HEADER, RESYNC

__all__ = ["ProjectorLink"]

log = structlog.get_logger(__name__)

#: Bytes of frames held in memory before falling back to the disk.
MAX_PENDING_BYTES: Final = 64 * 1024 * 1024
#: Longest wait before restarting a projector process that died, in seconds.
MAX_RESTART_DELAY_S: Final = 10.0
#: Records waiting and none applied for this long: the store is stalled, in seconds.
STALL_AFTER_S: Final = 5.0
#: Failures in a row the process reports before the store counts as stalled.
FAILING_AFTER_ERRORS: Final = 3
#: Restarts within ``RESTART_LOOP_WINDOW_S`` that make a restart loop.
RESTART_LOOP_COUNT: Final = 3
#: The window of a restart loop, in seconds.
RESTART_LOOP_WINDOW_S: Final = 60.0


class ProjectorLink:
    """Feeds the projector process (see the module docstring).

    Args:
        data_dir: The engine's data dir (passed to ``tiffany projector``).
        env: The child's environment (``TIFFANY_DATABASE_URL`` and logging settings).
        max_pending_bytes: Frames held in memory before falling back to the disk.
    """

    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str],
        *,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        self.data_dir = data_dir
        self.env = env
        self.max_pending_bytes = max_pending_bytes
        self._pending: deque[tuple[int, bytearray]] = deque()
        self._pending_bytes = 0
        self._accepting = True
        self._resync = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
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
        self._progress_at = time.monotonic()
        self._restarted_at: deque[float] = deque(maxlen=RESTART_LOOP_COUNT)
        #: Called (reader thread) with the seqs of records the projector just
        #: quarantined and the dead-letter total; the engine publishes an event.
        self.on_quarantine: Callable[[list[int], int], None] | None = None
        self._caught_up = threading.Condition()

    # -- scheduler thread --------------------------------------------------------

    def hand_over(self, first_seq: int, last_seq: int, frames: bytearray) -> None:
        """Take committed records ``first_seq..last_seq`` (O(1), never blocks)."""
        if self.durable_seq <= self.last_seq:
            self._progress_at = time.monotonic()  # caught up until now: the wait starts here
        self.durable_seq = last_seq
        if self._accepting:
            self._pending.append((first_seq, frames))
            self._pending_bytes += len(frames)
            if self._pending_bytes > self.max_pending_bytes:
                self._accepting = False  # the forwarder sends RESYNC, then accepts again
                self._resync = True
        self._wake.set()

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the projector process and the forwarding thread."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._forward, name="tiffany-projector-link", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Send what is pending, close the pipe, and wait for the process to finish."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("projector.kill", pid=proc.pid)
                proc.kill()
                proc.wait()

    def wait_caught_up(self, seq: int, timeout: float) -> bool:
        """Wait until the store holds record ``seq`` (tests, benchmarks)."""
        with self._caught_up:
            return self._caught_up.wait_for(lambda: self.last_seq >= seq, timeout)

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

    # -- the forwarding thread ---------------------------------------------------------

    def _spawn(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tiffany", "--data-dir", str(self.data_dir), "projector"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            bufsize=0,
        )
        assert proc.stdout is not None
        threading.Thread(
            target=self._read_reports,
            args=(proc.stdout,),
            name="tiffany-projector-reports",
            daemon=True,
        ).start()
        log.info("projector.started", pid=proc.pid)
        return proc

    def _read_reports(self, out: IO[bytes]) -> None:
        for line in out:
            with contextlib.suppress(ValueError):
                report = json.loads(line)
                with self._caught_up:
                    seq = int(report.get("last_seq", 0))
                    if seq > self.last_seq:
                        self.last_seq = seq
                        self._progress_at = time.monotonic()
                    self.errors = int(report.get("errors", self.errors))
                    self.consecutive_errors = int(report.get("consecutive_errors", 0))
                    error = report.get("last_error")
                    self.last_error = str(error) if error is not None else None
                    self.dead_letters = int(report.get("dead_letters", self.dead_letters))
                    self._caught_up.notify_all()
                quarantined = report.get("quarantined")
                if quarantined and self.on_quarantine is not None:
                    self.on_quarantine(list(quarantined), self.dead_letters)

    def _forward(self) -> None:
        delay = 0.2
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                if proc is not None:
                    log.warning("projector.died", code=proc.returncode, restart_in_s=delay)
                    self.restarts += 1
                    self._restarted_at.append(time.monotonic())
                    if self._stop.wait(delay):
                        return
                    delay = min(delay * 2, MAX_RESTART_DELAY_S)
                # A new process catches up from disk: what is pending is there too.
                self._drop_pending()
                try:
                    self._proc = proc = self._spawn()
                except OSError as exc:
                    log.error("projector.spawn_failed", error=repr(exc))
                    if self._stop.wait(delay):
                        return
                    continue
            assert proc.stdin is not None
            self._wake.clear()  # before looking: a hand-over from here on wakes us again
            try:
                if self._resync:
                    self._drop_pending()
                    proc.stdin.write(HEADER.pack(RESYNC, 0, 0))
                while self._pending:
                    first, frames = self._pending[0]
                    proc.stdin.write(HEADER.pack(FRAMES, first, len(frames)) + bytes(frames))
                    self._pending.popleft()
                    self._pending_bytes -= len(frames)
                delay = 0.2
            except (BrokenPipeError, OSError) as exc:
                log.warning("projector.pipe_failed", error=repr(exc))
                continue
            if self._stop.is_set():
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                return
            self._wake.wait(1.0)

    def _drop_pending(self) -> None:
        # Order matters: accept again first, then drop; anything dropped was
        # committed before, so it is on disk for the catch-up.
        self._resync = False
        self._accepting = True
        while self._pending:
            _, frames = self._pending.popleft()
            self._pending_bytes -= len(frames)
