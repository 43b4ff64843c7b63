"""Preparing the next segment ahead of time: a zero-filled file, off the committing thread.

Why (docs/wal-format.md, "Preallocation"): a commit's ``fdatasync`` into a
file that grows must also journal the new blocks and the new size, a
metadata commit of the file system; into blocks that were written before,
it flushes the data alone, so a small commit's ``fdatasync`` into a
zero-filled file costs about half what it costs at the end of a growing one
(``bench/wal_append.py``, Table 4; the figures are on the bench page).
``posix_fallocate``, which etcd uses, did not help here: its unwritten
extents are converted at the first write, metadata again. PostgreSQL
zero-fills its WAL files (``wal_init_zero``), as we do.

How:

* :meth:`Preparer.request` (on the committing thread, O(1)) starts a worker
  thread that writes ``size`` zero bytes into ``<wal>/prepared.tmp`` a MiB
  at a time, syncing every few MiB and pausing between them (it shares the
  disk with the commits), then syncs it and marks it ready.
* The writer takes a ready file at a rotation
  (:func:`~tiffany.wal.segments.install_segment` renames it into place and
  heads it), so its records overwrite zeros; ``prepared.tmp`` is not a
  segment name, so no reader ever sees it.
* It starts only with twice the file's size free on the file system
  (:data:`FREE_FACTOR`): zero-filling into the last free blocks would make
  a commit's own write fail for want of space, and the engine fail-stop.
* A failure (too little space, or a full disk all the same) removes the
  partial file and is logged; the writer goes on creating segments that
  grow, and asks again after :data:`RETRY_S`.
* Opening removes a file left by an earlier process: it may be partial.

Invariants: the prepared file only ever holds zeros; only the committing
thread renames it (after :meth:`take`), and only the worker writes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog

__all__ = ["PREPARED_NAME", "Preparer"]

log = structlog.get_logger("tiffany.wal")

#: The file a segment is prepared in, inside the WAL directory (not ``*.wal``).
PREPARED_NAME: Final = "prepared.tmp"
#: Bytes written by one ``write`` of zeros.
CHUNK_BYTES: Final = 1 << 20
#: Bytes between the worker's syncs (what a commit's flush may find queued).
SYNC_EVERY_BYTES: Final = 8 << 20
#: Pause after each sync, in seconds: commits get the disk in between.
PAUSE_S: Final = 0.002
#: Seconds before asking again after a preparation failed.
RETRY_S: Final = 60.0
#: A preparation starts only with this many times its size free on the file system.
FREE_FACTOR: Final = 2

_ZEROS: Final = bytes(CHUNK_BYTES)

#: ``spawn(fn)``: run ``fn`` on another thread and return it (tests run it inline: None).
Spawn = Callable[[Callable[[], None]], threading.Thread | None]


def _thread(fn: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=fn, name="wal-prepare", daemon=True)
    thread.start()
    return thread


class Preparer:
    """Keeps at most one zero-filled segment file ready for the writer.

    Args:
        wal_dir: The WAL directory (locked by the writer).
        size: The file's size: the writer's rotation size.
        spawn: Runs a preparation (a worker thread; tests pass one that runs it inline).
    """

    def __init__(self, wal_dir: Path, size: int, *, spawn: Spawn = _thread) -> None:
        self.path = wal_dir / PREPARED_NAME
        self.size = size
        self._spawn = spawn
        self._thread: threading.Thread | None = None
        self._busy = False  # set by request(), cleared by the worker when it ends
        self._ready = False  # set by the worker, cleared by take()
        self._closing = False
        self._failed_at = -RETRY_S
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # an earlier process's: maybe partial

    @property
    def ready(self) -> bool:
        """Whether a prepared file waits to be taken."""
        return self._ready

    def request(self) -> None:
        """Start preparing a file, unless one is ready or under way (committing thread, O(1))."""
        if self._busy or self._ready or self._closing:
            return
        if time.monotonic() - self._failed_at < RETRY_S:
            return
        self._busy = True
        self._thread = self._spawn(self._prepare)

    def take(self) -> Path | None:
        """Hand the ready file to the writer (which renames it away), or None."""
        if not self._ready:
            return None
        self._ready = False
        return self.path

    def close(self) -> None:
        """Stop a preparation under way and remove an untaken file."""
        self._closing = True
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)
        self._ready = False
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # -- the worker ---------------------------------------------------------------

    def _prepare(self) -> None:
        t0 = time.monotonic()
        try:
            done = self._fill()
        except OSError as exc:
            self._failed_at = time.monotonic()
            with contextlib.suppress(OSError):
                self.path.unlink()
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            log.warning(
                "wal.prepare_failed",
                path=str(self.path),
                error=repr(exc),
                note="the next segments grow as they are written"
                + ("; the disk is full" if full else ""),
                retry_s=RETRY_S,
            )
        else:
            if done:
                self._ready = True
                log.debug(
                    "wal.prepared",
                    path=str(self.path),
                    size=self.size,
                    seconds=round(time.monotonic() - t0, 3),
                )
        finally:
            self._busy = False

    def _fill(self) -> bool:
        """Write the zero-filled file and sync it; False if closing stopped it."""
        st = os.statvfs(self.path.parent)
        free = st.f_bavail * st.f_frsize
        if free < FREE_FACTOR * self.size:
            raise OSError(
                errno.ENOSPC, f"{free} bytes free, {FREE_FACTOR} x {self.size} wanted to prepare"
            )
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            left = self.size
            since_sync = 0
            while left > 0:
                if self._closing:
                    return False
                n = os.write(fd, memoryview(_ZEROS)[: min(left, CHUNK_BYTES)])
                left -= n
                since_sync += n
                if since_sync >= SYNC_EVERY_BYTES:
                    os.fdatasync(fd)
                    since_sync = 0
                    time.sleep(PAUSE_S)
            os.fsync(fd)
            return True
        finally:
            os.close(fd)
