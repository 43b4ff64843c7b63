"""Fixtures for the WAL tests: small logs on real files, and a syscall recorder."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tiffany.wal import FsyncPolicy, Wal

#: ``fill(path, payloads, segment_size_bytes=..., fsync=...) -> [seq, ...]``
Fill = Callable[..., list[int]]


def _fill(
    path: Path,
    payloads: Sequence[bytes],
    segment_size_bytes: int = 1 << 20,
    fsync: FsyncPolicy = FsyncPolicy.BATCH,
) -> list[int]:
    with Wal.open(path, fsync=fsync, segment_size_bytes=segment_size_bytes) as wal:
        seqs = [wal.append(1 + i % 7, p) for i, p in enumerate(payloads)]
        wal.commit()
    return seqs


@pytest.fixture
def fill() -> Fill:
    """Write ``payloads`` (types 1..7 in turn) into a new log at ``path``."""
    return _fill


@dataclass
class Syscalls:
    """Records the WAL's injected system calls; can make one of them fail."""

    calls: list[tuple[str, str]] = field(default_factory=list)  # (call, what)
    fail_on: dict[str, int] = field(default_factory=dict)  # call -> fail at its n-th use
    counts: dict[str, int] = field(default_factory=dict)

    def _note(self, call: str, fd: int) -> None:
        n = self.counts[call] = self.counts.get(call, 0) + 1
        mode = os.fstat(fd).st_mode
        what = "dir" if stat.S_ISDIR(mode) else os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        self.calls.append((call, what))
        if self.fail_on.get(call) == n:
            raise OSError(5, f"injected EIO on {call} #{n}")

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> int:
        self._note("write", fd)
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        self._note("fdatasync", fd)
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        self._note("fsync", fd)
        os.fsync(fd)

    def open(self, path: Path, **kwargs: object) -> Wal:
        return Wal.open(
            path, _write=self.write, _fdatasync=self.fdatasync, _fsync=self.fsync, **kwargs
        )

    def of(self, call: str) -> list[str]:
        return [what for c, what in self.calls if c == call]


@pytest.fixture
def syscalls() -> Syscalls:
    return Syscalls()
