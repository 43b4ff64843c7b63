"""The lock file: one writer per WAL directory.

``LOCK`` in the WAL directory carries an exclusive, non-blocking ``flock``
held by the open ``Wal`` (and by ``repair`` while it works), and the
holder's pid in ASCII, so that a refused opener can say who holds it. The
kernel drops the lock when the holder closes it or dies, even by
``kill -9``; the file itself is never deleted (deleting a lock file races
with the next process that opens it).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tiffany.errors import WalLockedError
from tiffany.wal.format import LOCK_NAME

__all__ = ["holder", "lock_dir", "unlock"]


def lock_dir(wal_dir: Path) -> int:
    """Take the exclusive lock on ``wal_dir/LOCK`` and write our pid into it.

    Returns:
        The lock file's descriptor: the lock lasts until :func:`unlock`.

    Raises:
        WalLockedError: Someone holds it; the message names the directory
            and, when the file says, the holder's pid.

    Discussion: ``flock`` rather than ``fcntl`` record locks: a record lock
    belongs to the process, so a second open in the same process would
    silently succeed, and closing any descriptor of the file drops it.
    ``flock`` belongs to the open file description, so the second ``Wal``
    in this process is refused just like one in another process.
    """
    lock_path = wal_dir / LOCK_NAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            holder = ""
        os.close(fd)
        pid = int(holder) if holder.isdigit() else None
        by = f"by pid {pid}" if pid is not None else "by another process (pid unknown)"
        raise WalLockedError(
            f"the WAL in {wal_dir} is in use {by}: another engine is running on this "
            "data directory (stop it, or use another --data-dir)",
            path=str(wal_dir),
            pid=pid,
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def unlock(fd: int) -> None:
    """Release the lock taken by :func:`lock_dir` (closing its descriptor)."""
    os.close(fd)


def holder(wal_dir: Path) -> int | None:
    """The pid of the live process holding ``wal_dir``'s lock, or None if nobody holds it.

    Only looks: taking the lock, even for a moment, could refuse an engine
    starting at that instant. The pid comes from the file; on Linux,
    ``/proc/locks`` confirms that this pid holds a ``flock`` on this very
    file (a pid reused after a ``kill -9`` does not count); elsewhere, that
    the pid is alive.
    """
    lock_path = wal_dir / LOCK_NAME
    try:
        text = lock_path.read_text("ascii", "replace").strip()
        st = lock_path.stat()
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    try:
        locks = Path("/proc/locks").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in locks.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4:6] == [str(pid), ident]:
            return pid
    return None
