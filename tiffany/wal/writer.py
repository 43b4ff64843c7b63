"""Writing the WAL: buffered appends, group commit, rotation, fail-stop, the lock.

Invariants:

* ``append`` encodes one record into an in-memory buffer and hands out the
  next sequence number. It makes no system call (unless the policy is
  ``always``, where it commits).
* ``commit`` writes the buffer with ``os.write`` and, unless the policy is
  ``off``, calls ``fdatasync`` once for everything appended since the last
  commit (group commit: the engine commits once per loop iteration).
  ``durable_seq`` moves only after that returns.
* Rotation is decided in ``append`` (where a record would overflow the
  segment, the buffer offset is noted as a cut) and done in ``commit``: the
  old segment is written up to the cut and fdatasynced, then the new one is
  created, headed and fsynced with its directory before records go into it.
* Preallocation (``preallocate=True``, docs/wal-format.md): a worker thread
  zero-fills the next segment ahead (:mod:`tiffany.wal.prealloc`), and a
  rotation renames it into place, so commits overwrite written blocks and
  their fdatasync journals no metadata. A segment that grows (the first of
  a new log, or when no file was ready) is left at the next commit once a
  prepared one is ready. Writes go at the writer's own offset, never
  ``O_APPEND``: a preallocated file's end is not where its records end.
* Fail-stop: a failed ``write`` or ``fsync`` puts the WAL in a failed state.
  It is never retried (after a failed fsync Linux may have dropped the dirty
  pages, and the next fsync would succeed: PostgreSQL's "fsyncgate"),
  ``durable_seq`` stays, and every later ``append`` and ``commit`` raise
  :class:`~tiffany.errors.WalFailedError`.
* One writer per directory: an exclusive ``flock`` on ``LOCK``, held until
  :meth:`Wal.close` or the process's death.
* Not thread-safe: the kernel loop is the only caller.

Discussion: the system calls are injectable (``Wal.open(_write=...,
_fdatasync=..., _fsync=...)``) and looked up on the instance at each use, so
a test can make a running WAL's next fdatasync fail with EIO. We rejected a
module-level indirection: it would leak between tests and processes.
"""

from __future__ import annotations

import enum
import errno
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import structlog
from crc32c import crc32c

from tiffany.errors import WalFailedError
from tiffany.wal.format import (
    HEADER_SIZE_BYTES,
    MAX_RECORD_BYTES,
    MAX_TYPE,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
    SEGMENT_SIZE_BYTES,
    segment_name,
)
from tiffany.wal.frame import check_record
from tiffany.wal.identity import ensure_identity
from tiffany.wal.lock import lock_dir
from tiffany.wal.prealloc import Preparer, Spawn
from tiffany.wal.reader import Span, iter_spans
from tiffany.wal.recovery import Recovery, recover
from tiffany.wal.segments import SyncFn, WriteFn, create_segment, install_segment, write_all
from tiffany.wal.state import LogState

#: ``on_commit(first_seq, last_seq, sync_s)``: after a commit made records
#: ``first_seq``..``last_seq`` durable; ``sync_s`` is how long the fsync took
#: (0 under ``off``). Readers read the records from disk (the projector tails
#: the WAL). Runs on the committing thread: keep it O(1).
CommitListener = Callable[[int, int, float], None]

#: ``on_rotate(durable_seq)``: after a commit that started a new segment (the
#: ones before it are now closed for good: retention may release them). Runs on
#: the committing thread: keep it O(1) (e.g. set an event).
RotateListener = Callable[[int], None]

__all__ = ["CommitListener", "FsyncPolicy", "Recovery", "RotateListener", "Wal"]

log = structlog.get_logger("tiffany.wal")

_pack_len_type = struct.Struct("<IB").pack
_pack_record_header = RECORD_HEADER.pack

#: A growing segment asks for a prepared one once this much was written since the open
#: (a short-lived log, a test's, a one-off ``tiffany run``, never writes a zero-filled file).
PREPARE_AFTER_BYTES = 1 << 20
#: How far ahead of its records a growing segment is zero-filled (with
#: ``preallocate``): a commit into those bytes extends no file, so its
#: ``fdatasync`` journals no metadata, as one into a prepared segment.
GROW_AHEAD_BYTES = 256 << 10
_ZEROS = bytes(GROW_AHEAD_BYTES)


class FsyncPolicy(enum.StrEnum):
    """When appended records are made durable (docs/wal-format.md, "Writing")."""

    ALWAYS = "always"  # each append is written and fdatasynced before it returns
    BATCH = "batch"  # one fdatasync per commit, for everything appended since the last
    OFF = "off"  # written at commit, never synced (tests, benchmarks)


class Wal(LogState):
    """An open write-ahead log directory; create it with :meth:`open`.

    Attributes:
        path: The WAL directory.
        policy: The fsync policy.
        segment_size_bytes: The rotation size.
        recovery: What :meth:`open` found at the end of the log, or None.
    """

    def __init__(
        self,
        path: Path,
        policy: FsyncPolicy,
        segment_size_bytes: int,
        *,
        write: WriteFn,
        fdatasync: SyncFn,
        fsync: SyncFn,
    ) -> None:
        """Set up a closed WAL; :meth:`open` locks, recovers and opens it."""
        if segment_size_bytes <= HEADER_SIZE_BYTES:
            raise ValueError(f"segment_size_bytes must exceed {HEADER_SIZE_BYTES}")
        self.path = path
        self.policy = policy
        self.segment_size_bytes = segment_size_bytes
        self.recovery: Recovery | None = None
        self._write = write
        self._fdatasync = fdatasync
        self._fsync = fsync
        self._always = policy is FsyncPolicy.ALWAYS
        self._lock_fd = -1
        self._fd = -1  # the current segment, open for appending
        self._seg_bytes = HEADER_SIZE_BYTES  # its size on disk
        self._buf = bytearray()
        # Rotation points in the buffer: (offset, first seq of the new segment).
        self._cuts: list[tuple[int, int]] = []
        self._seg_start = 0  # buffer offset where the newest segment's records start
        self._seg_empty = True  # whether that segment holds no record on disk
        self._limit = 0  # a payload of n bytes fits while len(buf) + n <= _limit
        self._next_seq = 1
        self._durable_seq = 0
        self._failed: WalFailedError | None = None
        self._closed = False
        self._prep: Preparer | None = None  # preallocation (see open's ``preallocate``)
        self._prealloc = False  # the current segment was zero-filled to the rotation size
        # A growing segment's file size (zero-filled ahead of its records);
        # the rotation size where nothing is filled ahead (no ``preallocate``,
        # or a prepared segment).
        self._zeroed_to = segment_size_bytes
        self._written = 0  # bytes written since the open (while a growing segment waits)
        self._seg_name = ""  # the current segment's file name
        #: (current segment, where its written records end), replaced whole at each commit.
        self._end: tuple[str, int] = ("", 0)
        #: Called after each commit that wrote records (see :meth:`commit`).
        self.on_commit: CommitListener | None = None
        #: Called after each commit that rotated to a new segment.
        self.on_rotate: RotateListener | None = None

    # -- opening ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        fsync: FsyncPolicy | str = FsyncPolicy.BATCH,
        segment_size_bytes: int = SEGMENT_SIZE_BYTES,
        *,
        first_seq: int = 1,
        limit_seq: int | None = None,
        preallocate: bool = False,
        _write: WriteFn = os.write,
        _fdatasync: SyncFn = os.fdatasync,
        _fsync: SyncFn = os.fsync,
        _spawn: Spawn | None = None,
    ) -> Wal:
        """Open (creating if need be) the WAL in ``path``.

        Locks the directory, checks every segment, truncates a torn tail of
        the last one (keeping a ``.broken`` copy, see :attr:`recovery`), and
        opens the last segment for appending.

        Args:
            path: The WAL directory (created with its parents if missing).
            fsync: The fsync policy.
            segment_size_bytes: The rotation size (tests shrink it).
            first_seq: The seq of an empty WAL's first record (an engine's
                range starts there, ``tiffany/wire/shards.py``).
            limit_seq: The seqs this WAL may hold stop below it; a WAL
                outside ``first_seq``..``limit_seq`` is refused (another
                engine's). None: no bound.
            preallocate: Zero-fill the next segment ahead on a worker thread
                (:mod:`tiffany.wal.prealloc`); ignored under policy ``off``.
            _write: Stand-in for ``os.write`` (tests inject failures).
            _fdatasync: Stand-in for ``os.fdatasync``, used at commit.
            _fsync: Stand-in for ``os.fsync``, used on new segments, their
                directory, and truncated tails.
            _spawn: Runs a preparation (tests run it inline).

        Raises:
            WalLockedError: Another ``Wal`` (in any process) has it open.
            WalCorruptionError: A bad record that is not a torn tail.
            WalFormatError: A stray segment name or another format version.
        """
        wal = cls(
            Path(path),
            FsyncPolicy(fsync),
            segment_size_bytes,
            write=_write,
            fdatasync=_fdatasync,
            fsync=_fsync,
        )
        wal.path.mkdir(parents=True, exist_ok=True)
        wal._lock_fd = lock_dir(wal.path)
        try:
            wal._name_journal()
            wal._open_log(first_seq, limit_seq)
            if preallocate and wal.policy is not FsyncPolicy.OFF:
                kw = {} if _spawn is None else {"spawn": _spawn}
                wal._prep = Preparer(wal.path, segment_size_bytes, **kw)
                wal._zeroed_to = os.fstat(wal._fd).st_size
                wal._prealloc = wal._zeroed_to >= segment_size_bytes
        except BaseException:
            wal._release()
            raise
        return wal

    def _name_journal(self) -> None:
        """Give the WAL its name if it has none (``JOURNAL``, :mod:`tiffany.wal.identity`).

        A full disk leaves an old WAL unnamed until a later open (the store
        then treats it as an unnamed WAL of old: see docs/wal-format.md, compatibility)
        rather than keeping the engine from starting on what it holds.
        """
        try:
            ensure_identity(self.path, None if self.policy is FsyncPolicy.OFF else self._fsync)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise

    def _open_log(self, first_seq: int, limit_seq: int | None) -> None:
        sync = None if self.policy is FsyncPolicy.OFF else self._fsync
        state = recover(
            self.path, write=self._write, fsync=sync, first_seq=first_seq, limit_seq=limit_seq
        )
        self.recovery = state.recovery
        #: Segment name -> the end of the records this open checked (see
        #: :func:`~tiffany.wal.reader.iter_spans`'s ``checked``).
        self.checked = state.checked
        self._fd = state.fd
        self._seg_bytes = state.segment_bytes
        self._seg_name = state.segment
        self._end = (state.segment, state.segment_bytes)
        self._next_seq = state.next_seq
        self._durable_seq = state.next_seq - 1
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        self._buf = bytearray()
        self._cuts.clear()
        self._seg_start = 0
        self._seg_empty = self._seg_bytes <= HEADER_SIZE_BYTES
        room = self.segment_size_bytes - self._seg_bytes - RECORD_HEADER_SIZE_BYTES
        self._limit = room

    # -- appending ---------------------------------------------------------------

    def append(self, rtype: int, payload: bytes) -> int:
        """Buffer one record and return its sequence number.

        Args:
            rtype: The record type, 1..255 (0 is reserved).
            payload: Opaque bytes, at most ``MAX_RECORD_BYTES``.

        Raises:
            ValueError: A type or size the format cannot hold.
            WalFailedError: The WAL has failed (or, under ``always``, fails now).
        """
        if self._failed is not None:
            self._refuse()
        n = len(payload)
        if n > MAX_RECORD_BYTES or not 0 < rtype <= MAX_TYPE:
            check_record(rtype, n)
        buf = self._buf
        if len(buf) + n > self._limit:
            self._cut()
        # frame.encode, inlined (see frame.py): crc over length, type, payload.
        buf += _pack_record_header(crc32c(payload, crc32c(_pack_len_type(n, rtype))), n, rtype)
        buf += payload
        seq = self._next_seq
        self._next_seq = seq + 1
        if self._always:
            self.commit()
        return seq

    def _cut(self) -> None:
        """The next record does not fit: start a new segment before it.

        Discussion: an empty segment takes any one record, however large, so
        a record bigger than the rotation size goes alone into its own
        segment; the next record then finds the segment full and cuts.
        """
        here = len(self._buf)
        if self._seg_empty and here == self._seg_start:
            return
        self._cuts.append((here, self._next_seq))
        self._seg_start = here
        self._seg_empty = True
        self._limit = here + self.segment_size_bytes - HEADER_SIZE_BYTES - RECORD_HEADER_SIZE_BYTES

    def commit(self) -> int:
        """Write what was appended and make it durable (per policy).

        Returns:
            The new ``durable_seq``.

        Raises:
            WalFailedError: A write or sync failed, now or before; the
                ``OSError`` is the ``__cause__``.
        """
        if self._failed is not None:
            self._refuse()
        buf = self._buf
        if not buf:
            return self._durable_seq
        sync = None if self.policy is FsyncPolicy.OFF else self._fdatasync
        listener = self.on_commit
        rotated = bool(self._cuts)
        sync_s = 0.0
        try:
            tail = self._write_cuts(buf, sync) if self._cuts else buf
            fd = self._fd
            written = self._write(fd, tail)
            if written != len(tail):
                write_all(self._write, fd, memoryview(tail)[written:])
            if self._seg_bytes + len(tail) > self._zeroed_to:
                self._grow_ahead(fd, self._seg_bytes + len(tail))
            if sync is not None:
                if listener is not None:
                    t0 = time.perf_counter()
                    sync(fd)
                    sync_s = time.perf_counter() - t0
                else:
                    sync(fd)
        except OSError as exc:
            raise self._fail(exc) from exc
        self._seg_bytes += len(tail)
        self._end = (self._seg_name, self._seg_bytes)
        self._buf = bytearray()
        self._seg_empty = False
        self._limit = self.segment_size_bytes - self._seg_bytes - RECORD_HEADER_SIZE_BYTES
        if self._prep is not None:
            self._prepare_next(len(tail))
        first = self._durable_seq + 1
        self._durable_seq = seq = self._next_seq - 1
        if listener is not None:
            listener(first, seq, sync_s)
        if rotated and self.on_rotate is not None:
            self.on_rotate(seq)
        return seq

    def _write_cuts(self, buf: bytearray, sync: SyncFn | None) -> bytearray:
        """Write ``buf`` up to its last cut, rotating at each; return what is left.

        Each segment left behind is written to its end and fdatasynced, then
        closed; each new one is created durable (file and directory) before
        anything else is written into it. Rotation is rare (once per 64 MiB
        by default), so copying the rest of the buffer does not matter.
        """
        write = self._write
        start = 0
        with memoryview(buf) as view:
            for cut, first_seq in self._cuts:
                if cut > start:
                    write_all(write, self._fd, view[start:cut])
                    if sync is not None:
                        sync(self._fd)
                fd, self._fd = self._fd, -1
                os.close(fd)
                self._fd = self._new_segment(first_seq, None if sync is None else self._fsync)
                self._seg_bytes = HEADER_SIZE_BYTES
                start = cut
        self._cuts.clear()
        self._seg_start = 0
        return buf[start:]

    def _grow_ahead(self, fd: int, end: int) -> None:
        """Zero-fill a growing segment from ``end`` (its records' end) ``GROW_AHEAD_BYTES`` on.

        With ``preallocate`` only, in the commit that crossed the last fill,
        before its ``fdatasync``: that one sync journals the new size, the
        next ones into the filled bytes only their data (``bench/workflows.py``:
        0.15 ms against 0.2 for a commit that extends the file). The records
        overwrite the zeros; zero fill to the end of a segment is where its
        records end (docs/wal-format.md), so nothing reads them as records.
        Best effort: a short or failed write (a full disk) is not the
        records' failure; the segment then grows by its commits as before.
        """
        stop = min(end + GROW_AHEAD_BYTES, self.segment_size_bytes)
        start = max(end, self._zeroed_to)
        try:
            wrote = os.pwrite(fd, memoryview(_ZEROS)[: stop - start], start) if stop > start else 0
        except OSError as exc:
            log.warning("wal.grow_ahead_failed", segment=self._seg_name, error=repr(exc))
            self._zeroed_to = self.segment_size_bytes  # not again in this segment
            return
        self._zeroed_to = start + wrote

    def _new_segment(self, first_seq: int, fsync: SyncFn | None) -> int:
        """Open the segment of ``first_seq``: the prepared file if one is ready, else a new one."""
        prepared = None if self._prep is None else self._prep.take()
        self._prealloc = prepared is not None
        self._zeroed_to = (
            0 if prepared is None and self._prep is not None else self.segment_size_bytes
        )
        self._seg_name = segment_name(first_seq)
        if prepared is not None:
            return install_segment(self.path, prepared, first_seq, write=self._write, fsync=fsync)
        return create_segment(self.path, first_seq, write=self._write, fsync=fsync)

    def _prepare_next(self, wrote: int) -> None:
        """After a commit: ask for the next segment ahead, or leave a growing one for it.

        A preallocated segment asks once it is half full; a growing one once
        :data:`PREPARE_AFTER_BYTES` were written since the open, and is left
        at the next append when the file is ready (``_limit`` -1 makes
        ``append`` cut).
        """
        prep = self._prep
        assert prep is not None
        if self._prealloc:
            if self._seg_bytes >= self.segment_size_bytes // 2:
                prep.request()
        elif prep.ready:
            self._limit = -1
        else:
            self._written += wrote
            if self._written >= min(PREPARE_AFTER_BYTES, self.segment_size_bytes // 2):
                prep.request()

    @property
    def preallocated(self) -> bool:
        """Whether the segment being written was zero-filled ahead (docs/wal-format.md)."""
        return self._prealloc

    def durable_ends(self) -> dict[str, int]:
        """Where the current segment's records end, by name (any thread: one atomic read).

        At least the end of every durable record: a reader given it
        (``iter_spans``'s ``ends``) reads no zero fill of a preallocated segment.
        """
        name, end = self._end
        return {name: end}

    def spans(self, from_seq: int = 1, checked: Mapping[str, int] | None = None) -> Iterator[Span]:
        """Yield the durable records with ``seq >= from_seq`` (:func:`~tiffany.wal.iter_spans`).

        Reads the files, so only what was committed; ``checked`` defaults to
        what this open verified.
        """
        return iter_spans(self.path, from_seq, self.checked if checked is None else checked)

    # -- failing and closing -------------------------------------------------------

    def _fail(self, exc: OSError) -> WalFailedError:
        self._failed = WalFailedError(
            f"WAL write or sync failed in {self.path}: {exc}; the WAL is stopped "
            f"(durable up to seq {self._durable_seq}, nothing after it is acknowledged)",
            path=str(self.path),
            durable_seq=self._durable_seq,
            errno=exc.errno,
        )
        self._failing()
        log.error("wal.failed", path=str(self.path), error=repr(exc), durable_seq=self._durable_seq)
        return self._failed

    def close(self) -> None:
        """Commit what is buffered (unless failed), close the files, release the lock.

        Raises:
            WalFailedError: The final commit failed (the files are closed anyway).
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._failed is None:
                self.commit()
        finally:
            self._release()

    def _release(self) -> None:
        if self._prep is not None:
            self._prep.close()
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lock_fd = -1

    def __repr__(self) -> str:
        """Show where the log is and its seqs."""
        return self._repr(f"<Wal {self.path} {self.policy}")
