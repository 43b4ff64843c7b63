"""Checkpoints: the run index as of a WAL sequence number, so a start reads only the tail.

A checkpoint at seq ``S`` holds what a full scan of records ``1..S`` would
have told a start-up (docs/wal-format.md, "Checkpoints and retention"):

* the runs unfinished at ``S``: their first seq and their RUN_START payload,
  kept as the bytes the WAL holds (decoded by the same code as a scan);
* the highest run number ever started (run numbers stay unique per data dir
  even once the segments holding them are released);
* the idempotency keys of runs started within the key window before the
  newest run (``IDEMPOTENCY_WINDOW_S``): a repeated key within its window
  answers the same run across restarts.

Start-up loads the newest checkpoint that checks out and reads the WAL from
``S + 1`` on (plus, from their first seq, the records of the runs unfinished
at ``S``). A missing, damaged or stale checkpoint (its ``S`` past the end of
the log, or older than the oldest record on disk) is skipped: the start
falls back to the previous one, then to a full scan. Never wrong, only slower.

On disk: ``<wal>/checkpoint-<S, 20 digits>.ckpt`` = the 4-byte magic
``TFCK``, a little-endian u32 format version, u32 CRC-32C and u64 length of
the body, then the body (msgpack). Written to a temp file, fsynced, renamed,
and the directory fsynced; the newest :data:`KEEP_CHECKPOINTS` are kept.

Rejected: a checkpoint of whole replay state (cursors, task trees). The
unfinished runs' records are still in live segments (retention never
releases them), and reading them is what recovery does anyway.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Protocol

import msgspec
import structlog
from crc32c import crc32c

from tiffany.wal.segments import fsync_dir, history_start

__all__ = [
    "IDEMPOTENCY_WINDOW_S",
    "KEEP_CHECKPOINTS",
    "Checkpoint",
    "CheckpointStore",
    "KeyEntry",
    "OpenRun",
    "discard_checkpoints",
    "read_checkpoint",
    "write_checkpoint",
]

log = structlog.get_logger("tiffany.durable")

#: How long an idempotency key answers the same run, in seconds (run start to run start).
IDEMPOTENCY_WINDOW_S: Final = 24 * 3600.0
#: How many checkpoint files are kept (the newest; older ones are deleted).
KEEP_CHECKPOINTS: Final = 2
#: Checkpoint file format version.
CHECKPOINT_VERSION: Final = 1

_MAGIC: Final = b"TFCK"
_HEADER: Final = struct.Struct("<4sIIQ")  # magic, version, crc32c(body), len(body)
_PREFIX: Final = "checkpoint-"
_SUFFIX: Final = ".ckpt"
_SEQ_DIGITS: Final = 20


class OpenRun(msgspec.Struct, array_like=True, frozen=True):
    """A run unfinished at the checkpoint: where it starts, and its RUN_START payload."""

    first_seq: int
    start: bytes


class KeyEntry(msgspec.Struct, array_like=True, frozen=True):
    """An idempotency key still inside its window."""

    key: str
    run_id: str
    digest: str
    started_at: float
    #: The WAL seq of the run's RUN_START (what a repeated submission answers; 0 if unknown).
    seq: int = 0


class Checkpoint(msgspec.Struct, frozen=True):
    """The run index as of WAL seq ``seq`` (see the module docstring)."""

    seq: int
    max_run_no: int
    runs: list[OpenRun] = []
    keys: list[KeyEntry] = []

    @property
    def oldest_needed(self) -> int:
        """The first seq a start-up still reads: the oldest unfinished run's, or ``seq + 1``."""
        return min([r.first_seq for r in self.runs] + [self.seq + 1])


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Checkpoint)


def checkpoint_path(wal_dir: Path, seq: int) -> Path:
    """Return the file name of the checkpoint at ``seq``."""
    return wal_dir / f"{_PREFIX}{seq:0{_SEQ_DIGITS}d}{_SUFFIX}"


def _listed(wal_dir: Path) -> list[tuple[int, Path]]:
    """The checkpoint files, newest first."""
    found = []
    if wal_dir.is_dir():
        for path in wal_dir.iterdir():
            name = path.name
            digits = name[len(_PREFIX) : -len(_SUFFIX)]
            if name.startswith(_PREFIX) and name.endswith(_SUFFIX) and digits.isdigit():
                found.append((int(digits), path))
    return sorted(found, reverse=True)


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """Return the file's bytes: header and body."""
    body = _encoder.encode(cp)
    return _HEADER.pack(_MAGIC, CHECKPOINT_VERSION, crc32c(body), len(body)) + body


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Decode a checkpoint file's bytes.

    Raises:
        ValueError: Wrong magic or version, bad length or CRC, a body that does not decode.
    """
    if len(data) < _HEADER.size:
        raise ValueError("shorter than its header")
    magic, version, crc, size = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != _MAGIC or version != CHECKPOINT_VERSION:
        raise ValueError(f"not a version {CHECKPOINT_VERSION} checkpoint")
    if len(body) != size or crc32c(body) != crc:
        raise ValueError("length or CRC does not check out")
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise ValueError(f"body does not decode: {exc}") from None


class CheckpointStore(Protocol):
    """Where a log that is not a directory keeps its checkpoints (a PostgreSQL stream)."""

    def checkpoints(self) -> list[tuple[int, bytes]]:
        """Return ``(seq, bytes)`` of the checkpoints kept, newest first."""
        ...

    def save_checkpoint(self, seq: int, data: bytes, keep: int) -> None:
        """Store one durably; keep only the newest ``keep``."""
        ...

    def first_seq(self) -> int:
        """The first seq the log still holds (retention may have released a prefix)."""
        ...


def write_checkpoint(wal_dir: Path | CheckpointStore, cp: Checkpoint) -> Path | None:
    """Write ``cp`` atomically (temp file, fsync, rename, directory fsync); prune old ones.

    ``wal_dir`` may be a :class:`CheckpointStore` instead (one transaction; None returned).

    Raises:
        OSError: Writing failed (no checkpoint file is left half-written).
    """
    if not isinstance(wal_dir, Path):
        wal_dir.save_checkpoint(cp.seq, encode_checkpoint(cp), KEEP_CHECKPOINTS)
        return None
    path = checkpoint_path(wal_dir, cp.seq)
    tmp = path.with_name(path.name + ".tmp")
    data = encode_checkpoint(cp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.rename(path)
    fsync_dir(wal_dir)
    for _, old in _listed(wal_dir)[KEEP_CHECKPOINTS:]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    return path


def read_checkpoint(wal_dir: Path | CheckpointStore, last_seq: int) -> Checkpoint | None:
    """Return the newest checkpoint that checks out against a log ending at ``last_seq``.

    A damaged one (logged) is skipped for the one before; so is one past the
    log's end (the log was repaired or cut) or one whose needed records are
    no longer on disk. None: no usable checkpoint, scan the whole log.
    ``wal_dir`` may be a :class:`CheckpointStore` (its own first seq is the log's start).
    """
    if isinstance(wal_dir, Path):
        start = history_start(wal_dir)
        listed: list[tuple[int, Path | bytes]] = list(_listed(wal_dir))
    else:
        start, listed = wal_dir.first_seq(), list(wal_dir.checkpoints())
    for seq, path in listed:
        where = f"checkpoint at seq {seq}" if isinstance(path, bytes) else str(path)
        try:
            cp = decode_checkpoint(path if isinstance(path, bytes) else path.read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("checkpoint.skipped", path=where, reason=str(exc))
            continue
        if cp.seq != seq or cp.seq > last_seq or cp.oldest_needed < start:
            log.warning(
                "checkpoint.skipped",
                path=where,
                reason=f"does not match the log (seq {cp.seq}, log {start}..{last_seq})",
            )
            continue
        return cp
    return None


def discard_checkpoints(wal_dir: Path) -> list[str]:
    """Delete every checkpoint (after a repair renumbered or cut the log); return their names."""
    gone = []
    for _, path in _listed(wal_dir):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            gone.append(path.name)
    if gone:
        fsync_dir(wal_dir)
    return gone


def keys_within(keys: Iterable[KeyEntry], newest_start: float, window_s: float) -> list[KeyEntry]:
    """Return the keys of runs started within ``window_s`` before ``newest_start``."""
    return [k for k in keys if k.started_at >= newest_start - window_s]
