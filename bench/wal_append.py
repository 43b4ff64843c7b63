"""WAL append throughput by fsync policy, payload size and commit interval.

    python bench/wal_append.py             # the full run (~1 min)
    python bench/wal_append.py --quick     # a smoke run
    python bench/wal_append.py --dir /mnt/ssd/tmp  # measure another filesystem

Table 1 -- appends/s for payloads of 64 and 256 bytes, committing every 1,
100 or 1,000 records, under the policies ``always`` (each append commits:
the commit interval does not apply), ``batch`` (one fdatasync per commit:
group commit) and ``off`` (no sync). Each cell runs for ``--seconds`` and
reports records/s, microseconds per record and fdatasyncs/s.

Table 2 -- references measured in the same run: one ``os.write`` +
``os.fdatasync`` per record on a plain file (what ``always`` cannot beat),
one ``os.write`` per record (what ``off``/commit-every-1 cannot beat), and
the cost of encoding a typical ~60-byte dispatch record with stdlib ``json``
and with ``msgspec`` (JSON and MessagePack), next to the WAL's own per-record
cost, so the codec choice can be weighed against the log.

Table 3 -- reading back: ``iter_records`` records/s and ``Wal.open`` (which
checks every record) on the log the run wrote.

Table 4 -- preallocation (docs/wal-format.md): group commits of one 5 KB
record each (about what the engine commits at 500 req/s), ``batch``, into
segments that grow and into segments zero-filled ahead
(``preallocate=True``), alternating, after a 2 MiB warm-up that lets the
preallocating log move into a prepared segment: commits/s and the mean
fdatasync, and their ratio.

The files go under ``--dir`` (default: a temporary directory beside this
script, i.e. on the repository's filesystem, not a tmpfs). Numbers depend
on the disk's fdatasync latency; ratios printed in the same run compare
like with like. This is a measurement, never an assertion.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import structlog

from tiffany.wal import FsyncPolicy, Wal, iter_records
from tiffany.wire.records import Dispatch

PAYLOAD_SIZES = (64, 256)
COMMIT_EVERY = (1, 100, 1000)
POLICIES = (FsyncPolicy.ALWAYS, FsyncPolicy.BATCH, FsyncPolicy.OFF)
RTYPE = 3


class Counted:
    """Counts fdatasync calls made through the WAL."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, fd: int) -> None:
        self.n += 1
        os.fdatasync(fd)


def run_wal(
    root: Path, policy: FsyncPolicy, size: int, every: int, seconds: float
) -> tuple[float, float]:
    """Append ``size``-byte payloads, committing every ``every``; return (records/s, syncs/s)."""
    path = Path(tempfile.mkdtemp(dir=root))
    sync = Counted()
    wal = Wal.open(path, fsync=policy, _fdatasync=sync)
    payload = os.urandom(size)
    append, commit = wal.append, wal.commit
    n = 0
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    deadline = start + seconds
    try:
        while True:
            for _ in range(every):
                append(RTYPE, payload)
            commit()
            n += every
            if n % 1000 < every and time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
        wal.close()
    shutil.rmtree(path)
    return n / elapsed, sync.n / elapsed


def run_raw(root: Path, size: int, seconds: float, *, sync: bool) -> float:
    """One os.write (+ os.fdatasync) per record on a plain file; return records/s."""
    fd = os.open(root / "raw.dat", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    record = os.urandom(size + 9)
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    try:
        while True:
            os.write(fd, record)
            if sync:
                os.fdatasync(fd)
            n += 1
            if n % 64 == 0 and time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(root / "raw.dat")
    return n / elapsed


class Timed:
    """Times fdatasync calls made through the WAL."""

    def __init__(self) -> None:
        self.n = 0
        self.seconds = 0.0

    def __call__(self, fd: int) -> None:
        t0 = time.perf_counter()
        os.fdatasync(fd)
        self.seconds += time.perf_counter() - t0
        self.n += 1


def run_commits(root: Path, seconds: float, *, preallocate: bool) -> tuple[float, float]:
    """One 5 KB record a group commit; return (commits/s, mean fdatasync ms) after a warm-up."""
    path = Path(tempfile.mkdtemp(dir=root))
    wal = Wal.open(path, fsync=FsyncPolicy.BATCH, preallocate=preallocate)
    payload = os.urandom(5_000)
    try:
        written = 0
        warm_until = time.perf_counter() + 10.0
        # Warm up past the 1 MiB after which a growing segment asks for a
        # prepared one, and (preallocating) until the writer moved into it.
        while written < 2 << 20 or (preallocate and not wal.preallocated):
            wal.append(RTYPE, payload)
            wal.commit()
            written += len(payload)
            if time.perf_counter() > warm_until:
                raise RuntimeError("no prepared segment after 10 s")
        timed = Timed()
        wal._fdatasync = timed
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            wal.append(RTYPE, payload)
            wal.commit()
        elapsed = time.perf_counter() - start
    finally:
        wal.close()
        shutil.rmtree(path)
    return timed.n / elapsed, timed.seconds / max(1, timed.n) * 1000


def per_call_ns(fn: Callable[[], object], n: int) -> float:
    """Best of 5 runs of ``n`` calls, in nanoseconds per call."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e9


def codec_costs(n: int) -> dict[str, float]:
    """ns per record: encoding a typical dispatch record, and the WAL's own append."""
    record = {"k": "dispatch", "run": 7, "tid": 123, "call": "Sleep", "seq": 456, "a": [0.01]}
    as_tuple = ("dispatch", 7, 123, "Sleep", 456, [0.01])
    json_enc = msgspec.json.Encoder()
    pack_enc = msgspec.msgpack.Encoder()
    out = {
        "stdlib json.dumps (dict)": per_call_ns(lambda: json.dumps(record), n),
        "stdlib json.dumps (dict, compact)": per_call_ns(
            lambda: json.dumps(record, separators=(",", ":")), n
        ),
        "msgspec.json encode (dict)": per_call_ns(lambda: json_enc.encode(record), n),
        "msgspec.msgpack encode (dict)": per_call_ns(lambda: pack_enc.encode(record), n),
        "msgspec.msgpack encode (tuple)": per_call_ns(lambda: pack_enc.encode(as_tuple), n),
        # What the journal does per dispatch: build the record, encode it.
        "journal DISPATCH: build list + encode": per_call_ns(
            lambda: pack_enc.encode([456, 3, "sleep", 0.01]), n
        ),
        "journal DISPATCH: build typed struct + encode": per_call_ns(
            lambda: pack_enc.encode(Dispatch(456, 3, "sleep", 0.01)), n
        ),
    }
    with tempfile.TemporaryDirectory() as d, Wal.open(d, fsync=FsyncPolicy.OFF) as wal:
        payload = pack_enc.encode(record)
        out[f"Wal.append, {len(payload)}-byte payload (no commit)"] = per_call_ns(
            lambda: wal.append(RTYPE, payload), n
        )
    return out


def read_back(root: Path, n: int) -> tuple[float, float]:
    """Write ``n`` 64-byte records, then time iter_records and Wal.open; records/s each."""
    path = Path(tempfile.mkdtemp(dir=root))
    payload = os.urandom(64)
    with Wal.open(path, fsync=FsyncPolicy.OFF) as wal:
        for _ in range(n):
            wal.append(RTYPE, payload)
    best_iter = best_open = 0.0
    for _ in range(3):
        start = time.perf_counter()
        count = sum(1 for _ in iter_records(path))
        best_iter = max(best_iter, count / (time.perf_counter() - start))
        start = time.perf_counter()
        Wal.open(path, fsync=FsyncPolicy.OFF).close()
        best_open = max(best_open, n / (time.perf_counter() - start))
    shutil.rmtree(path)
    return best_iter, best_open


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="short cells (smoke run)")
    parser.add_argument("--seconds", type=float, default=1.5, help="time per cell")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the logs")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    seconds = 0.3 if args.quick else args.seconds
    base = args.dir or Path(__file__).resolve().parent
    root = Path(tempfile.mkdtemp(prefix="wal-bench-", dir=base))
    try:
        report(root, seconds, quick=args.quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(root: Path, seconds: float, *, quick: bool) -> None:
    """Run every table and print it."""
    print(
        f"# WAL append benchmark: Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs\n# files under {root} ({seconds:g} s per cell)\n"
    )
    results: dict[tuple[str, int, int], float] = {}
    print("Table 1 -- appends/s")
    print(
        f"{'policy':<8} {'payload B':>9} {'commit every':>12} {'appends/s':>12} "
        f"{'us/append':>10} {'fdatasync/s':>12}"
    )
    for policy in POLICIES:
        for size in PAYLOAD_SIZES:
            for every in COMMIT_EVERY:
                if policy is FsyncPolicy.ALWAYS and every != 1:
                    continue  # always commits inside append: the interval does not apply
                rate, syncs = run_wal(root, policy, size, every, seconds)
                results[(policy.value, size, every)] = rate
                print(
                    f"{policy.value:<8} {size:>9} {every:>12} {rate:>12,.0f} "
                    f"{1e6 / rate:>10.2f} {syncs:>12,.0f}"
                )
    print()
    print("Table 2a -- references (one system call per record, plain file)")
    raw: dict[tuple[str, int], float] = {}
    for size in PAYLOAD_SIZES:
        raw[("sync", size)] = run_raw(root, size, seconds, sync=True)
        raw[("write", size)] = run_raw(root, size, seconds, sync=False)
        print(f"  os.write+os.fdatasync per record, {size:>3} B: {raw[('sync', size)]:>12,.0f}/s")
        print(f"  os.write per record,              {size:>3} B: {raw[('write', size)]:>12,.0f}/s")
    print()
    print("Ratios (same run)")
    for size in PAYLOAD_SIZES:
        per_sync = raw[("sync", size)]
        print(
            f"  {size:>3} B: always / raw write+fdatasync      = "
            f"{results[('always', size, 1)] / per_sync:6.2f}"
        )
        for every in COMMIT_EVERY:
            print(
                f"  {size:>3} B: batch commit/{every:<4} / raw write+fdatasync = "
                f"{results[('batch', size, every)] / per_sync:9.1f}"
            )
        print(
            f"  {size:>3} B: off commit/1 / raw os.write          = "
            f"{results[('off', size, 1)] / raw[('write', size)]:6.2f}"
        )
        print(
            f"  {size:>3} B: batch commit/1000 / off commit/1000  = "
            f"{results[('batch', size, 1000)] / results[('off', size, 1000)]:6.2f}"
        )
    print()
    print("Table 2b -- encoding one ~60-byte dispatch record (ns per record, best of 5)")
    costs = codec_costs(20_000 if quick else 200_000)
    stdlib = costs["stdlib json.dumps (dict)"]
    for name, ns in costs.items():
        print(f"  {name:<44} {ns:>8.0f} ns   {stdlib / ns:5.2f}x vs json.dumps")
    print()
    n = 100_000 if quick else 1_000_000
    it, op = read_back(root, n)
    print(f"Table 3 -- reading {n:,} records of 64 B")
    print(f"  iter_records: {it:>12,.0f} records/s")
    print(f"  Wal.open (checks every record): {op:>12,.0f} records/s")
    print()
    print("Table 4 -- group commits of one 5 KB record (batch), segments growing vs zero-filled")
    print(f"{'round':>5} {'segments':<14} {'commits/s':>10} {'fdatasync ms':>13}")
    figures: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i in range(1 if quick else 3):
        for prealloc in (False, True):
            rate, sync_ms = run_commits(root, seconds * 2, preallocate=prealloc)
            figures[prealloc].append((rate, sync_ms))
            name = "zero-filled" if prealloc else "growing"
            print(f"{i + 1:>5} {name:<14} {rate:>10,.0f} {sync_ms:>13.3f}")
    grow = sum(r for r, _ in figures[False]) / len(figures[False])
    pre = sum(r for r, _ in figures[True]) / len(figures[True])
    grow_ms = sum(m for _, m in figures[False]) / len(figures[False])
    pre_ms = sum(m for _, m in figures[True]) / len(figures[True])
    print(f" zero-filled / growing: commits/s {pre / grow:.2f}x, fdatasync {pre_ms / grow_ms:.2f}x")


if __name__ == "__main__":
    main()
