"""Engines' shares of one data dir or database: seq ranges, homes and streams.

``tiffany serve --engines N`` runs N engine processes beside one API and one
store. Each engine writes its own journal (docs/engines.md): on the embedded
default a WAL under its home directory, on PostgreSQL a stream of its own.
Engine ``i`` numbers its journal's records from :func:`seq_base` ``(i) + 1``
on, so the seqs of different engines never collide: a seq names its engine
(:func:`engine_of`), the store keys records and dead letters by seq alone,
and a reader's ``min_seq`` says which engine's projection it waits for.

Engine 0's journal starts at seq 1, as a single engine's always did: a data
dir served by one engine serves on with several, unchanged.

Discussion: a pair ``(engine, seq)`` everywhere would have done too, at the
cost of a second key column in every table and a second number in every
event, cursor and ``min_seq``. Splitting one 64-bit space keeps one number
and fits JavaScript's safe integers (2^53): 2^40 records an engine (seqs
only grow: 35 years at 1,000 records a second) and 8,192 engines. Run
numbers (a record's 4-byte prefix) stay per journal: the store finds a
run's records by its number within its engine's seq range.
"""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from pathlib import Path
from typing import Final

__all__ = [
    "ENGINE_SEQ_BITS",
    "MAX_ENGINES",
    "engine_for_key",
    "engine_home",
    "engine_of",
    "engine_stream",
    "homes",
    "note_owner",
    "owners_here",
    "seq_base",
    "seq_last",
]

#: Bits of an engine's own seqs: engine ``i`` writes ``(i << 40) + 1 .. (i + 1) << 40``.
ENGINE_SEQ_BITS: Final = 40
#: Engines one data dir or database may have (their seqs stay below 2^53).
MAX_ENGINES: Final = 1 << (53 - ENGINE_SEQ_BITS)
#: Where engines 1.. live under the data dir (engine 0 lives in the data dir itself).
ENGINES_DIR: Final = "engines"
#: Where the data dir's engines note the names they hold journal leases under.
OWNERS_DIR: Final = "lease-owners"
#: A dead engine's owner note goes after this long (its lease ended long before).
STALE_NOTE_S: Final = 86_400.0


def seq_base(engine: int) -> int:
    """Return the seq before engine ``engine``'s first record (0 for engine 0)."""
    if not 0 <= engine < MAX_ENGINES:
        raise ValueError(f"engine {engine} is out of range (0 to {MAX_ENGINES - 1})")
    return engine << ENGINE_SEQ_BITS


def seq_last(engine: int) -> int:
    """Return the last seq engine ``engine`` may write (its range is ``base+1..last``)."""
    return seq_base(engine) + (1 << ENGINE_SEQ_BITS)


def engine_of(seq: int) -> int:
    """Return the engine whose journal wrote ``seq`` (0 for seq 0)."""
    return max(0, seq - 1) >> ENGINE_SEQ_BITS if seq > 0 else 0


def engine_for_key(key: str, engines: int) -> int:
    """Return the engine, of ``engines``, that takes a submission with idempotency key ``key``.

    Each engine remembers the keys of the runs it started, so every path
    that submits to an engine's control socket (the API, the CLI, ``serve
    --demo``) sends a key to the same engine: CRC-32 of the key modulo the
    number of engines. A repeated key then meets the engine that remembers it.
    """
    return zlib.crc32(key.encode()) % engines if engines > 1 else 0


def engine_home(data_dir: str | Path, engine: int) -> Path:
    """Return engine ``engine``'s directory: its WAL, sockets and workspaces."""
    seq_base(engine)  # range check
    root = Path(data_dir)
    return root if engine == 0 else root / ENGINES_DIR / str(engine)


def homes(data_dir: str | Path, engines: int = 1) -> list[Path]:
    """Return the homes of engines ``0..engines-1`` and of any more the data dir holds.

    An engine directory left by an earlier ``serve --engines M`` (M larger)
    counts: its journal may hold unfinished runs, which only its engine resumes.
    """
    root = Path(data_dir)
    found = 0
    extra = root / ENGINES_DIR
    if extra.is_dir():
        for child in extra.iterdir():
            if child.name.isdigit() and (child / "wal").is_dir():
                found = max(found, int(child.name) + 1)
    return [engine_home(root, i) for i in range(max(engines, found, 1))]


def engine_stream(stream: str, engine: int) -> str:
    """Return the PostgreSQL journal stream of engine ``engine`` (``main``, ``main-1``, ...)."""
    seq_base(engine)
    return stream if engine == 0 else f"{stream}-{engine}"


def note_owner(data_dir: str | Path, owner: str) -> Path:
    """Note that an engine of ``data_dir`` holds (or is about to take) leases as ``owner``.

    An engine writes this before it takes its stream's lease and removes it
    when it stops (see :func:`owners_here`). Notes of processes gone from this
    host (a ``kill -9``) are removed on the way once :data:`STALE_NOTE_S`
    old: until then a dead engine's lease, still current, is not counted as
    an engine elsewhere either. Returns the note's path.

    Discussion: with the journal in PostgreSQL an API with no engine
    answering beside it is ready while engines elsewhere hold their streams
    (a standby's, an API replica's). Its own engine, between taking its lease
    and listening on its socket, is not elsewhere: counted, the API said
    ready and its first submissions waited for an engine still starting
    (``bench/read_your_writes.py``). A lease row does not say
    which data dir its holder serves; this note does.
    """
    folder = Path(data_dir) / OWNERS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    host = owner.split(":", 1)[0]
    now = time.time()  # noqa: TID251 - compared with a file's mtime
    for old in folder.iterdir():
        parts = old.name.split(":")
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > STALE_NOTE_S and not _alive(int(parts[1])):
                old.unlink()
    note = folder / owner
    note.touch()
    return note


def owners_here(data_dir: str | Path) -> list[str]:
    """The lease owners noted by ``data_dir``'s engines (:func:`note_owner`)."""
    try:
        return sorted(p.name for p in (Path(data_dir) / OWNERS_DIR).iterdir())
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's: alive
    return True
