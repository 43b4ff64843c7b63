"""Writing the WAL: append into a buffer, group commit, fail-stop.

Invariants:

* ``append`` only encodes into an in-memory buffer and hands out the next
  sequence number; nothing touches the disk until ``commit``.
* ``commit`` writes the buffer and, unless the policy is ``off``, calls
  ``fdatasync`` once for everything appended since the last commit (group
  commit): the scheduler calls it once per loop iteration. ``durable_seq``
  moves only after the sync returns.
* Policy ``always`` commits inside every ``append``.
* A new segment is fsynced (file and directory) before any record goes
  into it, so a crash never leaves a record in a segment the directory
  does not know.
* Fail-stop: a failed ``write`` or ``fdatasync`` puts the WAL in a failed
  state. It never retries (after a failed fsync the kernel may have dropped
  the dirty pages: PostgreSQL's "fsyncgate"), ``durable_seq`` stays where it
  was, and every later call raises :class:`~tiffany.errors.WalFailedError`.
* One writer per directory: an exclusive ``flock`` on ``LOCK``.
"""

from __future__ import annotations

import enum
import fcntl
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from crc32c import crc32c

from tiffany.errors import WalFailedError, WalLockedError
from tiffany.wal.format import (
    HEADER,
    HEADER_SIZE_BYTES,
    LOCK_NAME,
    MAGIC,
    MAX_RECORD_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    SEGMENT_SIZE_BYTES,
    VERSION,
    segment_name,
)
from tiffany.wal.reader import Segment, TornTail, list_segments, scan_segment

__all__ = ["FsyncPolicy", "Wal"]

log = structlog.get_logger("tiffany.wal")

_pack_crc = struct.Struct("<I").pack
_pack_len_type = struct.Struct("<IB").pack


class FsyncPolicy(enum.StrEnum):
    """When appended records are made durable."""

    ALWAYS = "always"  # every append is written and fdatasync'ed before it returns
    BATCH = "batch"  # one fdatasync per commit (once per loop iteration)
    OFF = "off"  # written at commit, never synced (tests, benchmarks)


@dataclass(frozen=True, slots=True)
class Recovery:
    """What ``Wal.open`` found and did."""

    segments: int
    records: int
    torn: TornTail | None


def _segment_header(first_seq: int) -> bytes:
    head = HEADER.pack(MAGIC, VERSION, 0, first_seq, 0)[: HEADER_SIZE_BYTES - 4]
    return head + crc32c(head).to_bytes(4, "little")


class Wal:
    """An open write-ahead log directory (use :meth:`open`)."""

    def __init__(
        self,
        path: Path,
        fsync: FsyncPolicy,
        segment_size_bytes: int,
        lock_fd: int,
        *,
        fdatasync: Callable[[int], None],
        fsync_dir: Callable[[Path], None],
        write: Callable[[int, Any], int],
    ) -> None:
        self.path = path
        self.fsync = fsync
        self.segment_size_bytes = segment_size_bytes
        self._lock_fd = lock_fd
        self._fdatasync = fdatasync
        self._fsync_dir = fsync_dir
        self._write = write
        self._buf = bytearray()
        self._fd = -1
        self._seg_bytes = 0
        self._unsynced: list[int] = []  # fds of rotated-out segments awaiting sync
        self.next_seq = 1
        self.durable_seq = 0
        self._failed: WalFailedError | None = None
        self._closed = False
        self.recovery: Recovery | None = None

    # -- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        fsync: FsyncPolicy | str = FsyncPolicy.BATCH,
        segment_size_bytes: int = SEGMENT_SIZE_BYTES,
        *,
        fdatasync: Callable[[int], None] = os.fdatasync,
        fsync_dir: Callable[[Path], None] | None = None,
        write: Callable[[int, Any], int] = os.write,
    ) -> Wal:
        """Open (or create) the WAL in ``path``: lock it, recover a torn tail.

        Raises:
            WalLockedError: Another process (or this one) has it open.
            WalCorruptionError: A bad record that is not a torn tail.
        """
        wal_dir = Path(path)
        wal_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = _lock(wal_dir)
        try:
            wal = cls(
                wal_dir,
                FsyncPolicy(fsync),
                segment_size_bytes,
                lock_fd,
                fdatasync=fdatasync,
                fsync_dir=fsync_dir or _fsync_dir,
                write=write,
            )
            wal._recover()
        except BaseException:
            os.close(lock_fd)
            raise
        return wal

    def _recover(self) -> None:
        segments = list_segments(self.path)
        records = 0
        torn = None
        if segments:
            for i, seg in enumerate(segments):
                last = i == len(segments) - 1
                with open(seg.path, "rb") as f:
                    data = f.read()
                frames, torn = scan_segment(seg, data, last=last)
                records += len(frames)
                if last:
                    end = frames[-1][2] + frames[-1][3] if frames else HEADER_SIZE_BYTES
                    if torn is not None:
                        self._truncate_torn(seg, torn, end)
                    self.next_seq = seg.first_seq + len(frames)
                    self._open_segment(seg, end)
        else:
            self._new_segment(1)
        self.durable_seq = self.next_seq - 1
        self.recovery = Recovery(len(segments), records, torn)

    def _truncate_torn(self, seg: Segment, torn: TornTail, end: int) -> None:
        broken = seg.path.with_name(seg.path.name + ".broken")
        shutil.copyfile(seg.path, broken)
        with open(seg.path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
        log.warning(
            "wal.torn_tail_truncated",
            segment=seg.path.name,
            offset=torn.offset,
            bytes_dropped=torn.bytes_dropped,
            reason=torn.reason,
            copy=broken.name,
        )

    def _open_segment(self, seg: Segment, size: int) -> None:
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._seg_bytes = size

    def _new_segment(self, first_seq: int) -> None:
        path = self.path / segment_name(first_seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            _write_all(self._write, fd, _segment_header(first_seq))
            os.fsync(fd)
            self._fsync_dir(self.path)
        except OSError as exc:
            os.close(fd)
            raise self._fail(exc) from exc
        if self._fd >= 0:
            self._unsynced.append(self._fd)
        self._fd = fd
        self._seg_bytes = HEADER_SIZE_BYTES

    # -- appending ---------------------------------------------------------------

    def append(self, rtype: int, payload: bytes) -> int:
        """Buffer one record; return its sequence number."""
        if self._failed is not None:
            raise self._failed
        n = len(payload)
        if n > MAX_RECORD_BYTES:
            raise ValueError(f"record of {n} bytes exceeds MAX_RECORD_BYTES ({MAX_RECORD_BYTES})")
        if not 0 < rtype < 256:
            raise ValueError(f"record type must be 1..255 (0 is reserved), got {rtype}")
        size = RECORD_HEADER_SIZE_BYTES + n
        if self._seg_bytes + len(self._buf) + size > self.segment_size_bytes and (
            self._seg_bytes + len(self._buf) > HEADER_SIZE_BYTES
        ):
            self._rotate()
        head = _pack_len_type(n, rtype)
        buf = self._buf
        buf += _pack_crc(crc32c(payload, crc32c(head)))
        buf += head
        buf += payload
        seq = self.next_seq
        self.next_seq = seq + 1
        if self.fsync is FsyncPolicy.ALWAYS:
            self.commit()
        return seq

    def _rotate(self) -> None:
        """Write what is buffered to the current segment and start the next one."""
        self._flush()
        self._new_segment(self.next_seq)

    def _flush(self) -> None:
        if self._buf:
            try:
                _write_all(self._write, self._fd, self._buf)
            except OSError as exc:
                raise self._fail(exc) from exc
            self._seg_bytes += len(self._buf)
            self._buf = bytearray()

    def commit(self) -> int:
        """Write the buffer and fdatasync (per policy); return the durable seq."""
        if self._failed is not None:
            raise self._failed
        last = self.next_seq - 1
        if last == self.durable_seq and not self._buf:
            return self.durable_seq
        self._flush()
        if self.fsync is not FsyncPolicy.OFF:
            try:
                for fd in self._unsynced:
                    self._fdatasync(fd)
                self._fdatasync(self._fd)
            except OSError as exc:
                raise self._fail(exc) from exc
        for fd in self._unsynced:
            os.close(fd)
        self._unsynced.clear()
        self.durable_seq = last
        return last

    def _fail(self, exc: OSError) -> WalFailedError:
        if self._failed is None:
            self._failed = WalFailedError(
                f"WAL write or sync failed in {self.path}: {exc}; the WAL is stopped "
                f"(durable up to seq {self.durable_seq})",
                path=str(self.path),
                durable_seq=self.durable_seq,
                errno=exc.errno,
            )
            self._failed.__cause__ = exc
            log.error(
                "wal.failed", path=str(self.path), error=repr(exc), durable_seq=self.durable_seq
            )
        return self._failed

    @property
    def failed(self) -> bool:
        """True once a write or sync failed (fail-stop)."""
        return self._failed is not None

    def close(self) -> None:
        """Commit what is buffered (unless failed), close files, release the lock."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._failed is None:
                self.commit()
        finally:
            for fd in [*self._unsynced, self._fd]:
                if fd >= 0:
                    os.close(fd)
            self._unsynced.clear()
            self._fd = -1
            os.close(self._lock_fd)

    def __enter__(self) -> Wal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(write: Callable[[int, Any], int], fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        n = write(fd, view)
        view = view[n:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(wal_dir: Path) -> int:
    lock_path = wal_dir / LOCK_NAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        try:
            holder = os.pread(fd, 32, 0).decode().strip()
        except OSError:
            holder = ""
        os.close(fd)
        by = f" by pid {holder}" if holder else ""
        raise WalLockedError(
            f"the WAL in {wal_dir} is in use{by}: another engine is running on this data "
            "directory (stop it, or use another --data-dir)",
            path=str(wal_dir),
            pid=holder or None,
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
