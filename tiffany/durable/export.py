"""One run's journal in one self-contained file: written, read back, replayed.

``tiffany export RUN`` writes a run's records (its RUN_START and every record
after it that carries its run number) to one file; ``tiffany replay FILE
--verify`` and :func:`tiffany.testing.replay_file` replay that file against
the code as it is now (Temporal's ``Replayer`` over a saved history). The
format is normative in ``docs/replay.md`` ("Export format"); the constants
here cite it and ``tests/durable/test_export.py`` checks that they agree::

    export  := header meta record*
    header  := magic:u8[8] version:u16 flags:u16 meta_length:u32 header_crc:u32
    meta    := UTF-8 JSON object, meta_length bytes
    header_crc := crc32c(magic || version || flags || meta_length || meta)
    record  := crc:u32 length:u32 type:u8 body:u8[length]   ; the WAL's frame
    body    := seq:u64 || payload                            ; payload as journaled

Invariants:

* ``magic`` and ``version`` sit at the same offsets in every version, so a
  reader refuses a newer file by its version before it reads anything else.
* The records are those of one run, in journal order, each with the seq it
  has in the journal it came from: a divergence names that seq, which the
  production journal's ``tiffany wal dump`` shows.
* A reader checks the whole file when it opens it (every frame's checksum,
  the count and last seq the meta announces), and names the byte offset of
  the first problem: a truncated or damaged export never replays a prefix
  as if it were the whole.

Discussion: why the WAL's frame and the journal's own payloads, and not
JSON lines. A replay compares the bytes a run's code produces with the
recorded ones (values packed by ``tiffany/wire/values.py``: tuples, sets and
stand-ins are msgpack extensions, integers up to 64 bits, NaN): a JSON copy
would have to encode those again, and any loss would be a false divergence
or, worse, a false match. With the journal's own bytes the replay of an
export is the replay of the journal, through the same reader
(:func:`~tiffany.durable.history.load_run` reads an :class:`Export` as it
reads a WAL). The meta is JSON so that ``head -c 600 FILE`` shows what a
file is; ``tiffany wal dump`` shows what is in a journal.

Rejected: a copy of the WAL's segments. They hold every run of the data
dir (other tenants' inputs too), and a seq is implicit in a segment, so
one run's records could not keep their own.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from crc32c import crc32c

from tiffany.durable.history import UnknownRun, load_run
from tiffany.durable.runtime import Resolver, VerifyReport, verify_loaded
from tiffany.errors import ExportError, ExportTooNew
from tiffany.wal import Source, Span, spans_of
from tiffany.wal.frame import Frame
from tiffany.wal.frame import decode as decode_frame
from tiffany.wal.frame import encode as encode_frame
from tiffany.wal.identity import identity
from tiffany.wire.records import JOURNAL_COMPAT, RUN_PREFIX, RecordType, RunEnd, RunStart, decode

__all__ = [
    "EXPORT_MAGIC",
    "EXPORT_VERSION",
    "FORMAT_NAME",
    "HEADER",
    "HEADER_SIZE_BYTES",
    "SEQ",
    "Export",
    "ExportMeta",
    "export_run",
    "is_export",
    "parse_export",
    "read_export",
    "verify_export",
    "write_file",
]

#: First 8 bytes of every export (docs/replay.md, "Export format").
EXPORT_MAGIC: Final = b"TIFEXP\x00\x01"
#: The format version this code writes, and the newest it reads.
EXPORT_VERSION: Final = 1
#: magic (8s), version (u16), flags (u16), meta_length (u32), header_crc (u32).
HEADER: Final = struct.Struct("<8sHHII")
HEADER_SIZE_BYTES: Final = 20
#: A record's seq in the journal it came from, before its payload.
SEQ: Final = struct.Struct("<Q")
#: The meta's ``format`` field.
FORMAT_NAME: Final = "tiffany.run-export"
#: Largest meta a reader accepts: a run's entry is in its RUN_START, not here.
MAX_META_BYTES: Final = 1 << 20

_VERSION_AT: Final = 8  # the version's offset, the same in every version
_LENGTH_AT: Final = 12  # the meta length's offset
_CRC_AT: Final = HEADER_SIZE_BYTES - 4  # the header's CRC covers the bytes before it, then the meta


@dataclass(frozen=True, slots=True)
class ExportMeta:
    """What an export says about itself (its JSON meta)."""

    run_id: str
    name: str
    #: ``running`` for a run exported before its end (a replay checks its prefix).
    status: str
    #: The journal-compatibility version the run started under (its RUN_START).
    journal_compat: int
    records: int
    first_seq: int
    last_seq: int
    #: Which journal it came from (``file:<hex>``, ``postgres:<stream>``), if known.
    journal: str | None
    tiffany_version: str
    #: ISO 8601, UTC.
    exported_at: str
    version: int = EXPORT_VERSION

    @property
    def finished(self) -> bool:
        """True when the run's end is in the export."""
        return self.status != "running"

    def to_dict(self) -> dict[str, Any]:
        """The meta as the file holds it."""
        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "run_id": self.run_id,
            "name": self.name,
            "status": self.status,
            "journal_compat": self.journal_compat,
            "records": self.records,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "journal": self.journal,
            "tiffany_version": self.tiffany_version,
            "exported_at": self.exported_at,
        }


class Export:
    """An export file read and checked: its meta, and its records as a log to replay.

    It reads like a journal (:data:`~tiffany.wal.Source`: :meth:`spans`), so
    :func:`~tiffany.durable.history.load_run` and
    :func:`~tiffany.durable.runtime.verify` take it as they take a WAL.
    """

    def __init__(self, path: Path, meta: ExportMeta, data: bytes, frames: list[tuple[int, Frame]]):
        self.path = path
        self.meta = meta
        self._data = data
        self._frames = frames  # (seq, frame), in file order

    def __len__(self) -> int:
        return len(self._frames)

    def spans(self, from_seq: int = 1, checked: Mapping[str, int] | None = None) -> Iterator[Span]:
        """Yield the records with ``seq >= from_seq`` as :data:`~tiffany.wal.Span`."""
        data, name, width = self._data, self.path.name, SEQ.size
        for seq, (rtype, start, end) in self._frames:
            if seq >= from_seq:
                yield seq, rtype, data, start + width, end, name

    def __repr__(self) -> str:
        return f"Export({str(self.path)!r}, run_id={self.meta.run_id!r})"


def is_export(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a file that starts with the export magic."""
    try:
        with open(path, "rb") as f:
            return f.read(len(EXPORT_MAGIC)) == EXPORT_MAGIC
    except (IsADirectoryError, FileNotFoundError, NotADirectoryError, PermissionError):
        return False


def export_run(
    source: Source,
    run_id: str,
    out: str | os.PathLike[str] | IO[bytes],
    *,
    tiffany_version: str,
    journal: str | None = None,
) -> ExportMeta:
    """Write run ``run_id`` of the journal ``source`` to ``out``; return the meta written.

    A run not finished yet is exported as far as its journal goes (its
    status ``running``): its replay checks that the code reproduces that
    prefix, which is what a deploy must keep for a run in flight. ``out``
    is a path (written to a temporary file beside it, fsynced, renamed: a
    reader never sees half a file) or a binary stream.

    Raises:
        UnknownRun: No run ``run_id`` in the journal.
    """
    found, frames, status = _collect(source, run_id)
    start, first_seq = found
    last_seq = frames[-1][0] if len(frames) > 1 else first_seq
    meta = ExportMeta(
        run_id=start.run_id,
        name=start.name,
        status=status,
        journal_compat=start.compat,
        records=len(frames),
        first_seq=first_seq,
        last_seq=last_seq,
        journal=journal if journal is not None else _journal_of(source),
        tiffany_version=tiffany_version,
        exported_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    blob = _header(meta)
    if not isinstance(out, str | os.PathLike):
        out.write(blob)
        for _, frame in frames:
            out.write(frame)
        return meta
    write_file(out, [blob, *(frame for _, frame in frames)])
    return meta


def write_file(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> None:
    """Write an export to ``path`` whole or not at all (a temporary file, fsynced, renamed)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_export(path: str | os.PathLike[str]) -> Export:
    """Read and check an export file.

    Raises:
        ExportTooNew: Its format version is newer than :data:`EXPORT_VERSION`.
        ExportError: It is not an export, or is damaged or truncated (the
            error names the byte offset).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ExportError(f"{p}: cannot read: {exc.strerror or exc}", path=str(p)) from None
    return parse_export(data, p)


def parse_export(data: bytes, path: str | os.PathLike[str] = "<export>") -> Export:
    """Check an export held in memory (``path``: what errors call it); see :func:`read_export`."""
    p = Path(path)
    meta, offset = _read_head(p, data)
    frames: list[tuple[int, Frame]] = []
    prefix = b""
    last = 0
    size = len(data)
    while offset < size:
        frame = decode_frame(data, offset)
        if not isinstance(frame, Frame):
            what = "truncated" if frame in ("short header", "short payload") else "damaged"
            raise _bad(p, offset, f"{what}: record {len(frames) + 1}: {frame}")
        if frame.end - frame.start < SEQ.size + RUN_PREFIX.size:
            raise _bad(p, offset, f"record {len(frames) + 1} is too short for a seq and a run")
        (seq,) = SEQ.unpack_from(data, frame.start)
        body_at = frame.start + SEQ.size
        if not frames:
            prefix = data[body_at : body_at + RUN_PREFIX.size]
            if frame.rtype != RecordType.RUN_START:
                raise _bad(p, offset, "the first record is not the run's RUN_START")
            start = decode(frame.rtype, data[body_at : frame.end])
            if not isinstance(start, RunStart) or start.run_id != meta.run_id:
                raise _bad(p, offset, f"the RUN_START is not run {meta.run_id!r}'s")
        elif data[body_at : body_at + RUN_PREFIX.size] != prefix:
            raise _bad(p, offset, f"record {len(frames) + 1} belongs to another run")
        elif seq <= last:
            raise _bad(p, offset, f"record {len(frames) + 1}: seq {seq} after seq {last}")
        last = seq
        frames.append((seq, frame))
        offset = frame.end
    if len(frames) != meta.records or (frames and frames[-1][0] != meta.last_seq):
        got = f"{len(frames)} records up to seq {last}" if frames else "no record"
        raise _bad(
            p,
            size,
            f"truncated: the header announces {meta.records} records up to seq "
            f"{meta.last_seq}, the file holds {got}",
        )
    return Export(p, meta, data, frames)


def verify_export(export: Export, resolvers: dict[str, Resolver] | None = None) -> VerifyReport:
    """Replay an export against the code as it is now, without side effects.

    :func:`~tiffany.durable.runtime.verify_loaded` on the run the file
    holds: a finished run must replay identically to its end; an unfinished
    one must reproduce every recorded dispatch (the report says ``partial``).
    ``resolvers``: the runners besides ``callable`` (``workflow``, which
    rebuilds plan and workflow runs: ``tiffany.engine.replay_resolvers``).
    """
    info, cursor = load_run(export, export.meta.run_id)
    return verify_loaded(info, cursor, resolvers, unfinished=True)


# -- internals ---------------------------------------------------------------------


def _collect(
    source: Source, run_id: str
) -> tuple[tuple[RunStart, int], list[tuple[int, bytes]], str]:
    """Find the run and frame its records: ``((RUN_START, its seq), [(seq, frame)], status)``."""
    spans = iter(spans_of(source))
    run_start = RecordType.RUN_START
    for seq, rtype, data, start, end, _ in spans:
        if rtype == run_start:
            rec = decode(rtype, data[start:end])
            if isinstance(rec, RunStart) and rec.run_id == run_id:
                first_seq, payload = seq, bytes(data[start:end])
                break
    else:
        raise UnknownRun(f"no run {run_id!r} in the journal", run_id=run_id)
    prefix = payload[: RUN_PREFIX.size]
    frames = [(first_seq, encode_frame(run_start, SEQ.pack(first_seq) + payload))]
    status = "running"
    for seq, rtype, data, start, end, _ in spans:
        if data[start : start + RUN_PREFIX.size] != prefix or rtype == run_start:
            continue
        body = bytes(data[start:end])
        frames.append((seq, encode_frame(rtype, SEQ.pack(seq) + body)))
        if rtype == RecordType.RUN_END:
            end_rec = decode(rtype, body)
            if isinstance(end_rec, RunEnd):
                status = end_rec.status
            break  # nothing of a run follows its end
    return (rec, first_seq), frames, status


def _journal_of(source: Source) -> str | None:
    if isinstance(source, str | os.PathLike):
        return identity(source)
    stream = getattr(source, "stream", None)
    return f"postgres:{stream}" if isinstance(stream, str) else None


def _header(meta: ExportMeta) -> bytes:
    text = json.dumps(meta.to_dict(), sort_keys=True, ensure_ascii=False).encode("utf-8")
    head = HEADER.pack(EXPORT_MAGIC, EXPORT_VERSION, 0, len(text), 0)[:-4]
    return head + struct.pack("<I", crc32c(text, crc32c(head))) + text


def _read_head(p: Path, data: bytes) -> tuple[ExportMeta, int]:
    if data[: len(EXPORT_MAGIC)] != EXPORT_MAGIC:
        raise _bad(p, 0, "not a tiffany run export (it does not start with the export magic)")
    if len(data) >= _VERSION_AT + 2:
        (version,) = struct.unpack_from("<H", data, _VERSION_AT)
        if version > EXPORT_VERSION:
            raise ExportTooNew(
                f"{p}: export format version {version} is newer than this tiffany reads "
                f"({EXPORT_VERSION}): replay it with the tiffany that wrote it, or a newer one",
                path=str(p),
                offset=_VERSION_AT,
                version=version,
                supported=EXPORT_VERSION,
            )
    if len(data) < HEADER_SIZE_BYTES:
        raise _bad(p, len(data), "truncated: the file ends inside its header")
    _, version, _flags, length, crc = HEADER.unpack_from(data, 0)
    if version == 0:
        raise _bad(p, _VERSION_AT, "format version 0 is not a version")
    if length > MAX_META_BYTES:
        raise _bad(p, _LENGTH_AT, f"impossible meta length {length}")
    end = HEADER_SIZE_BYTES + length
    if end > len(data):
        raise _bad(p, len(data), "truncated: the file ends inside its meta")
    if crc32c(data[HEADER_SIZE_BYTES:end], crc32c(data[:_CRC_AT])) != crc:
        raise _bad(p, 0, "damaged: the header's checksum does not match")
    try:
        raw = json.loads(data[HEADER_SIZE_BYTES:end])
        meta = ExportMeta(
            run_id=str(raw["run_id"]),
            name=str(raw["name"]),
            status=str(raw["status"]),
            journal_compat=int(raw["journal_compat"]),
            records=int(raw["records"]),
            first_seq=int(raw["first_seq"]),
            last_seq=int(raw["last_seq"]),
            journal=raw.get("journal"),
            tiffany_version=str(raw["tiffany_version"]),
            exported_at=str(raw["exported_at"]),
            version=version,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise _bad(p, HEADER_SIZE_BYTES, f"the meta does not read: {exc!r}") from None
    if meta.journal_compat > JOURNAL_COMPAT:
        raise ExportTooNew(
            f"{p}: run {meta.run_id} started under journal version {meta.journal_compat}; "
            f"this tiffany replays up to {JOURNAL_COMPAT}",
            path=str(p),
            offset=HEADER_SIZE_BYTES,
            journal_compat=meta.journal_compat,
            supported=JOURNAL_COMPAT,
        )
    return meta, end


def _bad(p: Path, offset: int, reason: str) -> ExportError:
    return ExportError(
        f"{p}: byte offset {offset}: {reason}", path=str(p), offset=offset, reason=reason
    )
