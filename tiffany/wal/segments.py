"""Segment files: naming, listing, creating, checking headers, setting aside.

Invariants:

* A segment is named after its first sequence number
  (``segment_name(first_seq)``, 20 digits), so sorting names sorts segments;
  the header repeats the number and the two must agree.
* A segment is created with ``O_EXCL`` (or renamed from a zero-filled file
  prepared ahead, :mod:`tiffany.wal.prealloc`, never over an existing name),
  gets its header, and is made durable (the file, then the directory that
  names it) before any record is written into it. After a crash, a segment
  the directory knows has a header, unless the crash struck during
  creation: then it is the last segment, shorter than a header or all
  zeros, and recovery recreates it.
* Nothing here deletes a damaged file: damaged ones are renamed with
  ``BROKEN_SUFFIX``, or their damaged tails moved into such a file.
* Released segments (retention, docs/wal-format.md "Retention") are the
  oldest ones, released one at a time, oldest first, by one ``rename`` into
  ``ARCHIVE_DIR_NAME`` (or one ``unlink``): a crash between two releases,
  or inside one, leaves the archive and the live directory each a gapless
  run of segments, the archive's ending where the live one's begins. The
  history (:func:`history_segments`) is the archive followed by the live
  segments; the writer and its recovery only ever see the live ones.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tiffany.errors import WalCorruptionError, WalFormatError
from tiffany.wal.format import (
    BROKEN_SUFFIX,
    HEADER_SIZE_BYTES,
    SEGMENT_NAME_DIGITS,
    SEGMENT_SUFFIX,
    VERSION,
    encode_header,
    header_problem,
    segment_name,
)
from tiffany.wal.frame import zero_to_end

__all__ = [
    "ARCHIVE_DIR_NAME",
    "REMEDY",
    "Segment",
    "broken_name",
    "check_header",
    "create_segment",
    "fsync_dir",
    "history_segments",
    "history_start",
    "install_segment",
    "is_torn_creation",
    "list_segments",
    "move_tail_aside",
    "read_segment",
    "release_segment",
    "reset_segment",
    "set_aside",
    "write_all",
]

_ZERO_HEADER: Final = bytes(HEADER_SIZE_BYTES)

#: What a corruption error tells a person to do (docs/wal-format.md).
REMEDY: Final = (
    "; the log will not open: run `tiffany wal repair --salvage` (keeps every intact record)"
)

#: The directory, inside the WAL directory, that archived segments move to.
ARCHIVE_DIR_NAME: Final = "archive"

#: ``os.write``-like: write some of the bytes, return how many.
WriteFn = Callable[[int, bytes | bytearray | memoryview], int]
#: ``os.fsync``-like.
SyncFn = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Segment:
    """A segment file and the first sequence number its name announces."""

    path: Path
    first_seq: int

    @property
    def name(self) -> str:
        """The file name (what errors and records report)."""
        return self.path.name


def list_segments(wal_dir: Path) -> list[Segment]:
    """Return the directory's segments, in order (none if it does not exist).

    Raises:
        WalFormatError: A ``*.wal`` file whose name is not a segment name.
    """
    if not wal_dir.is_dir():
        return []
    segments = []
    for path in wal_dir.iterdir():
        if path.suffix != SEGMENT_SUFFIX:
            continue  # LOCK, *.broken, anything else
        stem = path.stem
        if len(stem) != SEGMENT_NAME_DIGITS or not stem.isdigit() or int(stem) == 0:
            raise WalFormatError(
                f"{path}: not a WAL segment name (want {SEGMENT_NAME_DIGITS} digits + "
                f"{SEGMENT_SUFFIX}, e.g. {segment_name(1)})",
                segment=path.name,
            )
        segments.append(Segment(path, int(stem)))
    segments.sort(key=lambda s: s.first_seq)
    return segments


def history_segments(wal_dir: Path) -> list[Segment]:
    """Return the archived segments, then the live ones: the whole history still on disk.

    Raises:
        WalFormatError: A ``*.wal`` file whose name is not a segment name.
    """
    return list_segments(wal_dir / ARCHIVE_DIR_NAME) + list_segments(wal_dir)


def history_start(wal_dir: Path) -> int:
    """Return the first sequence number still on disk, archive included (1 when empty).

    More than 1 means segments were deleted (retention ``delete``): the
    history before it is gone for good.
    """
    segments = history_segments(wal_dir)
    return segments[0].first_seq if segments else 1


def release_segment(seg: Segment, *, archive: bool, fsync: SyncFn | None = os.fsync) -> None:
    """Release one live segment: rename it into the archive, or delete it.

    Each step is atomic and idempotent on a restart: a ``rename`` within one
    file system is, and the caller releases the oldest segment first, so a
    crash leaves a segment either live or released, never both or neither.
    The directories are fsynced (the archive first), so a release that
    returned survives a crash.

    Raises:
        OSError: The rename, unlink or a sync failed (the segment is then
            still live, or released without the sync: both are consistent).
    """
    wal_dir = seg.path.parent
    if archive:
        target = wal_dir / ARCHIVE_DIR_NAME
        if not target.is_dir():
            target.mkdir(exist_ok=True)
            if fsync is not None:
                fsync_dir(wal_dir, fsync)
        seg.path.rename(target / seg.name)
        if fsync is not None:
            fsync_dir(target, fsync)
    else:
        seg.path.unlink()
    if fsync is not None:
        fsync_dir(wal_dir, fsync)


def read_segment(seg: Segment, size: int | None = None) -> bytes:
    """Return a whole segment file (segments are read whole; 64 MiB at most by default).

    ``size``: read only the first ``size`` bytes (where the writer says its
    records end: a preallocated live segment's zero fill is not read).

    A live segment archived since it was listed (a reader beside a running
    engine) is read from the archive.
    """
    try:
        with open(seg.path, "rb") as f:
            return f.read(size)
    except FileNotFoundError:
        moved = seg.path.parent / ARCHIVE_DIR_NAME / seg.name
        if seg.path.parent.name == ARCHIVE_DIR_NAME or not moved.is_file():
            raise
    with open(moved, "rb") as f:
        return f.read(size)


def check_header(seg: Segment, data: bytes) -> None:
    """Check the segment header at the start of ``data``.

    Raises:
        WalFormatError: The header checks out but has another format version.
        WalCorruptionError: Anything else wrong with it (offset 0).
    """
    problem = header_problem(data, seg.first_seq)
    if problem is None:
        return
    if problem.startswith("version "):
        raise WalFormatError(
            f"{seg.name}: format {problem}; this build reads version {VERSION}",
            segment=seg.name,
            version=int(problem.split()[1]),
        )
    raise WalCorruptionError(
        f"{seg.name}: {problem} at offset 0 (segment of seq {seg.first_seq}){REMEDY}",
        segment=seg.name,
        offset=0,
        seq=seg.first_seq,
        reason=problem,
    )


def is_torn_creation(data: bytes) -> bool:
    """True for the trace of a crash while a segment was being created.

    The header is written and fsynced before any record, so such a file is
    shorter than a header or holds only zeros (its size reached the disk,
    its bytes did not). Only meaningful for the last segment.
    """
    if len(data) < HEADER_SIZE_BYTES:
        return True
    # Not ``data.strip(b"\0")``: a preallocated segment's zero fill made that
    # a copy of the segment and a byte-by-byte scan of its zeros (up to
    # 64 MiB, with the GIL held) for each read of the live segment.
    return data[:HEADER_SIZE_BYTES] == _ZERO_HEADER and zero_to_end(data, HEADER_SIZE_BYTES)


def write_all(write: WriteFn, fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` to ``fd``, looping over short writes.

    Raises:
        OSError: Whatever ``write`` raised (the caller fails stop).
    """
    view = memoryview(data)
    while view:
        view = view[write(fd, view) :]


def fsync_dir(path: Path, fsync: SyncFn = os.fsync) -> None:
    """Fsync a directory, so that the names created in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def create_segment(wal_dir: Path, first_seq: int, *, write: WriteFn, fsync: SyncFn | None) -> int:
    """Create a segment with its header; return its descriptor, positioned after the header.

    Args:
        wal_dir: The WAL directory.
        first_seq: The first sequence number that will go into it.
        write: ``os.write`` or a test's stand-in.
        fsync: ``os.fsync`` or a stand-in, called on the file and then on the
            directory; None (policy ``off``) syncs nothing.

    Raises:
        OSError: Creating, writing or syncing failed (the caller fails stop);
            the file may be left behind with a partial header, which is the
            torn creation that recovery handles.
    """
    path = wal_dir / segment_name(first_seq)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    return _head(os.open(path, flags, 0o644), wal_dir, first_seq, write=write, fsync=fsync)


def install_segment(
    wal_dir: Path, prepared: Path, first_seq: int, *, write: WriteFn, fsync: SyncFn | None
) -> int:
    """Make a prepared zero-filled file the segment of ``first_seq``; return its descriptor.

    The file is renamed first, then headed and synced like a created
    segment (:func:`create_segment`): a crash before the header is durable
    leaves a named segment of zeros, the torn creation recovery handles.
    Its records then overwrite blocks that are already written, so a
    commit's ``fdatasync`` has no block allocation or file size to journal
    (docs/wal-format.md, "Preallocation").

    Raises:
        FileExistsError: The segment's name is taken (never replaced).
        OSError: Renaming, writing or syncing failed (the caller fails stop).
    """
    path = wal_dir / segment_name(first_seq)
    if path.exists():
        raise FileExistsError(errno.EEXIST, "WAL segment exists", str(path))
    prepared.rename(path)
    return _head(
        os.open(path, os.O_WRONLY | os.O_CLOEXEC), wal_dir, first_seq, write=write, fsync=fsync
    )


def _head(fd: int, wal_dir: Path, first_seq: int, *, write: WriteFn, fsync: SyncFn | None) -> int:
    """Write a new segment's header at its start and make it and its name durable; return ``fd``."""
    try:
        write_all(write, fd, encode_header(first_seq))
        if fsync is not None:
            fsync(fd)
            fsync_dir(wal_dir, fsync)
    except BaseException:
        os.close(fd)
        raise
    return fd


def reset_segment(path: Path, first_seq: int, *, write: WriteFn, fsync: SyncFn | None) -> int:
    """Write a header into an empty segment file left by a torn creation; return its fd.

    Unlike :func:`create_segment` no new file is made, so this needs no new
    inode or directory entry (a restart on a full disk).

    Raises:
        OSError: Writing or syncing failed.
    """
    return _head(
        os.open(path, os.O_WRONLY | os.O_CLOEXEC), path.parent, first_seq, write=write, fsync=fsync
    )


def broken_name(path: Path) -> Path:
    """Return ``<name>.broken``, or ``<name>.broken.2``, ... if taken: never overwrite."""
    broken = path.with_name(path.name + BROKEN_SUFFIX)
    n = 1
    while broken.exists():
        n += 1
        broken = path.with_name(f"{path.name}{BROKEN_SUFFIX}.{n}")
    return broken


def set_aside(path: Path) -> Path:
    """Rename ``path`` to ``<name>.broken`` (see :func:`broken_name`); return the new path."""
    broken = broken_name(path)
    path.rename(broken)
    return broken


#: Free space above which a ``.broken`` copy is kept even if the cut freed
#: less than it takes (the disk is not the problem then).
ASIDE_RESERVE_BYTES: Final = 64 * 1024 * 1024


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bfree * st.f_frsize


def _aside_fits(directory: Path, size: int, free_before: int) -> bool:
    """True if a ``size``-byte copy takes no more than the cut freed, or the disk has room."""
    st = os.statvfs(directory)
    need = -(-size // st.f_frsize) * st.f_frsize  # whole blocks
    free_now = st.f_bfree * st.f_frsize
    return free_now - free_before >= need or st.f_bavail * st.f_frsize - need >= ASIDE_RESERVE_BYTES


def move_tail_aside(path: Path, offset: int, *, fsync: SyncFn | None) -> tuple[bytes, Path | None]:
    """Cut ``path`` at ``offset`` and keep the cut bytes in ``<name>.broken`` if they fit.

    The bytes are read first, then the file is truncated and synced (which
    frees their space), and only then written to the ``.broken`` file, and
    only if the copy needs no more blocks than the cut freed or the disk
    has room to spare (:data:`ASIDE_RESERVE_BYTES`): a restart on a full
    disk never needs more space than the log took. (A cut inside one block
    frees no block, and a new file takes a whole one.)

    Returns:
        The cut bytes, and the ``.broken`` file, or None when it could not be
        written (the caller logs the loss; a half-written one is removed).

    Raises:
        OSError: Reading, truncating or syncing ``path`` failed.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        tail = os.pread(fd, max(0, os.fstat(fd).st_size - offset), offset)
        free_before = _free_bytes(path.parent)
        os.ftruncate(fd, offset)
        if fsync is not None:
            fsync(fd)
    finally:
        os.close(fd)
    if not tail or not _aside_fits(path.parent, len(tail), free_before):
        return tail, None
    broken = broken_name(path)
    try:
        out = os.open(broken, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            write_all(os.write, out, tail)
            if fsync is not None:
                fsync(out)
        finally:
            os.close(out)
    except OSError:
        with contextlib.suppress(OSError):
            broken.unlink()
        return tail, None
    return tail, broken
