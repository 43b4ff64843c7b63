"""Simulated power loss, after SQLite's ``test6.c``: unsynced writes half-applied.

A file layer plugged into the WAL's injectable ``write``/``fdatasync``/``fsync``
does every write for real (the WAL runs as usual) and remembers, per file,
what a sync made durable and which writes are still pending. At a "crash"
it builds the disk as a power cut could leave it: the durable image plus,
per 512-byte sector of the pending writes, a prefix, a random subset, or
garbage of them (a write past the durable end leaves a hole of zeros), and
a file created but not yet named durably by a directory sync may be missing.
Then the log is opened from that image:

* nothing acknowledged (``seq <= durable_seq`` at the crash) is lost;
* no record that was not written is ever yielded (every record read back
  is the payload appended with that number);
* when the image is one the format calls corruption (zeros or garbage
  followed by a good but unacknowledged record: out-of-order writeback in
  the last segment), ``salvage`` still keeps every acknowledged record.

``TIFFANY_POWER_LOSS_SEEDS`` raises the number of seeded iterations (default 200).
"""

from __future__ import annotations

import os
import random  # noqa: TID251 - seeded crash points, not task code
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tiffany.errors import WalCorruptionError
from tiffany.wal import FsyncPolicy, Wal, iter_records
from tiffany.wal.salvage import salvage

SECTOR = 512
SEEDS = int(os.environ.get("TIFFANY_POWER_LOSS_SEEDS", "200"))


@dataclass
class PowerLossDisk:
    """The WAL's system calls, with a model of what a power cut keeps."""

    rng: random.Random
    durable: dict[str, bytearray] = field(default_factory=dict)
    pending: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)  # files a directory sync made durable

    @staticmethod
    def _path(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> int:
        path = self._path(fd)
        offset = os.lseek(fd, 0, os.SEEK_CUR)  # the writer writes at its own offset
        if path not in self.durable:
            # First written through the WAL now: what it held is durable (a
            # preallocated segment's zeros, synced before it was renamed in).
            self.durable[path] = bytearray(Path(path).read_bytes())
        n = os.write(fd, data)
        self.pending.setdefault(path, []).append((offset, bytes(memoryview(data)[:n])))
        return n

    def fsync(self, fd: int) -> None:
        # No real sync: the model decides what a power cut keeps.
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            folder = self._path(fd)
            self.named |= {p for p in self.durable if os.path.dirname(p) == folder}
            return
        path = self._path(fd)
        image = self.durable.setdefault(path, bytearray())
        for offset, data in self.pending.pop(path, []):
            _apply(image, offset, data)

    fdatasync = fsync

    def crash(self, into: Path) -> None:
        """Write the disk as the power cut left it into ``into``."""
        rng = self.rng
        for path, durable in self.durable.items():
            if path not in self.named and not durable and rng.random() < 0.5:
                continue  # created, never named durably: gone
            image = bytearray(durable)
            sectors = [s for off, data in self.pending.get(path, []) for s in _sectors(off, data)]
            mode = rng.choice(["none", "prefix", "subset", "garbage", "all"])
            if mode == "prefix":
                sectors = sectors[: rng.randrange(len(sectors) + 1)]
            elif mode in ("subset", "garbage"):
                sectors = [s for s in sectors if rng.random() < 0.5]
            elif mode == "none":
                sectors = []
            for off, data in sectors:
                if mode == "garbage" and rng.random() < 0.3:
                    data = rng.randbytes(len(data))
                _apply(image, off, data)
            (into / os.path.basename(path)).write_bytes(bytes(image))


def _apply(image: bytearray, offset: int, data: bytes) -> None:
    if len(image) < offset:
        image.extend(bytes(offset - len(image)))
    image[offset : offset + len(data)] = data


def _sectors(offset: int, data: bytes) -> list[tuple[int, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        cut = min(len(data), pos + SECTOR - (offset + pos) % SECTOR)
        out.append((offset + pos, data[pos:cut]))
        pos = cut
    return out


def _one(seed: int, tmp: Path) -> str:
    rng = random.Random(seed)
    live, image = tmp / f"live{seed}", tmp / f"image{seed}"
    live.mkdir()
    image.mkdir()
    disk = PowerLossDisk(rng)
    wal = Wal.open(
        live,
        FsyncPolicy.BATCH,
        segment_size_bytes=rng.choice([200, 700, 4096]),
        # Half the seeds write into zero-filled segments (prepared inline).
        preallocate=rng.random() < 0.5,
        _spawn=lambda prepare: prepare(),
        _write=disk.write,
        _fdatasync=disk.fdatasync,
        _fsync=disk.fsync,
    )
    payloads: dict[int, bytes] = {}
    try:
        for _ in range(rng.randrange(1, 60)):
            payload = rng.randbytes(rng.randrange(0, 300))
            payloads[wal.append(rng.randrange(1, 256), payload)] = payload
            if rng.random() < 0.3:
                wal.commit()
        durable = wal.durable_seq  # what callers were told is durable
        mode = "preallocated" if wal.preallocated else "growing"  # the last segment's
        if rng.random() < 0.5:  # written, not synced: an unacknowledged tail
            wal._fdatasync = lambda fd: None
            wal.commit()
        disk.crash(image)
    finally:
        wal._release()
    try:
        with Wal.open(image, FsyncPolicy.OFF) as reopened:
            got = {r.seq: r.payload for r in iter_records(image)}
            assert reopened.durable_seq == max(got, default=0)
        outcome = "opened"
    except WalCorruptionError:
        salvage(image)
        got = {r.seq: r.payload for r in iter_records(image)}
        # Renumbered after a hole: what is past the acknowledged prefix
        # need not keep its number, but it is still something we wrote.
        late = [p for s, p in got.items() if s > durable]
        assert all(p in payloads.values() for p in late), seed
        got = {s: p for s, p in got.items() if s <= durable}
        outcome = "salvaged"
    for seq in range(1, durable + 1):
        assert got.get(seq) == payloads[seq], (seed, seq, durable)
    for seq, payload in got.items():
        assert payloads.get(seq) == payload, (seed, seq)
    return f"{outcome}, {mode}"


def test_power_loss_never_loses_an_acknowledged_record(tmp_path: Path) -> None:
    outcomes: dict[str, int] = {}
    for seed in range(SEEDS):
        outcome = _one(seed, tmp_path)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"\npower loss: {SEEDS} seeded crashes: {outcomes}")
    assert outcomes.get("opened, growing", 0) > 0
    assert outcomes.get("opened, preallocated", 0) > 0


@pytest.mark.parametrize("seed", [0])
def test_the_layer_loses_unsynced_writes(tmp_path: Path, seed: int) -> None:
    """The model really drops what was not synced (else the test above proves nothing)."""
    disk = PowerLossDisk(random.Random(seed))
    wal = Wal.open(
        tmp_path / "live", _write=disk.write, _fdatasync=disk.fdatasync, _fsync=disk.fsync
    )
    wal.append(1, b"synced")
    wal.commit()
    wal._fdatasync = lambda fd: None
    wal.append(1, b"x" * 2000)
    wal.commit()
    wal._release()
    kept = set()
    for i in range(20):
        (tmp_path / f"img{i}").mkdir()
        disk.rng = random.Random(i)
        disk.crash(tmp_path / f"img{i}")
        kept.add((tmp_path / f"img{i}" / "00000000000000000001.wal").stat().st_size)
    assert len(kept) > 1
