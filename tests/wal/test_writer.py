"""The writer on real files: sequence numbers, rotation, policies, fail-stop, the lock."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from typing import Any

import pytest

from tiffany.errors import WalFailedError, WalFormatError, WalLockedError
from tiffany.wal import FsyncPolicy, Record, Wal, iter_records
from tiffany.wal.format import (
    HEADER_SIZE_BYTES,
    MAX_RECORD_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    segment_name,
)


def test_round_trip(tmp_path, fill):
    payloads = [f"record {i}".encode() * (i % 7 + 1) for i in range(200)] + [b""]
    assert fill(tmp_path, payloads) == list(range(1, 202))
    recs = list(iter_records(tmp_path))
    assert all(isinstance(r, Record) for r in recs)
    assert [r.seq for r in recs] == list(range(1, 202))
    assert [r.payload for r in recs] == payloads
    assert [r.rtype for r in recs] == [1 + i % 7 for i in range(201)]
    assert recs[0] == Record(1, 1, payloads[0], segment_name(1), HEADER_SIZE_BYTES)
    assert [r.seq for r in iter_records(tmp_path, from_seq=150)] == list(range(150, 202))
    assert list(iter_records(tmp_path, from_seq=500)) == []


def test_sequence_numbers_have_no_gaps_across_rotation(tmp_path, fill):
    payloads = [os.urandom(20 + i % 90) for i in range(300)]
    fill(tmp_path, payloads, segment_size_bytes=1000)
    segments = sorted(tmp_path.glob("*.wal"))
    assert len(segments) > 10
    assert all(p.stat().st_size <= 1000 for p in segments)
    recs = list(iter_records(tmp_path))
    assert [r.payload for r in recs] == payloads
    assert [r.seq for r in recs] == list(range(1, 301))
    for seg in segments:  # each segment is named after its first record
        assert min(r.seq for r in recs if r.segment == seg.name) == int(seg.stem)
    assert [r.seq for r in iter_records(tmp_path, from_seq=271)] == list(range(271, 301))


def test_a_record_larger_than_a_segment_goes_alone_into_one(tmp_path):
    with Wal.open(tmp_path, segment_size_bytes=100) as wal:
        wal.append(1, b"a")
        wal.append(1, b"x" * 500)
        wal.append(1, b"b")
    assert [r.segment for r in iter_records(tmp_path)] == [segment_name(s) for s in (1, 2, 3)]


def test_reopen_continues_the_sequence(tmp_path, fill):
    fill(tmp_path, [b"a", b"b"], segment_size_bytes=60)
    with Wal.open(tmp_path, segment_size_bytes=60) as wal:
        assert wal.recovery is None
        assert (wal.next_seq, wal.durable_seq) == (3, 2)
        assert wal.append(1, b"c") == 3
    with Wal.open(tmp_path) as wal:  # a larger segment size: appends to the last one
        assert wal.append(1, b"d") == 4
    assert [r.payload for r in iter_records(tmp_path)] == [b"a", b"b", b"c", b"d"]
    assert [r.seq for r in iter_records(tmp_path)] == [1, 2, 3, 4]


def test_append_makes_no_system_call_and_commit_one_write_and_one_sync(tmp_path, syscalls):
    wal = syscalls.open(tmp_path, segment_size_bytes=400)
    syscalls.calls.clear()
    seqs = [wal.append(2, b"p" * 30) for _ in range(30)]  # 39 bytes each: several segments
    assert seqs == list(range(1, 31))
    assert syscalls.calls == []
    assert wal.durable_seq == 0
    assert wal.commit() == 30 == wal.durable_seq
    segments = sorted(p.name for p in tmp_path.glob("*.wal"))
    assert len(segments) == 4
    # every segment: its records written, then fdatasynced; each new one fsynced with its dir
    assert syscalls.of("fdatasync") == segments
    assert syscalls.of("fsync") == [x for name in segments[1:] for x in (name, "dir")]
    syscalls.calls.clear()
    assert wal.commit() == 30
    assert syscalls.calls == []  # nothing appended: nothing to do
    wal.close()


def test_new_segments_fsync_the_file_then_the_directory(tmp_path, syscalls):
    with syscalls.open(tmp_path, segment_size_bytes=200) as wal:
        for _ in range(20):
            wal.append(1, b"x" * 40)
    calls = syscalls.calls
    segments = sorted(p.name for p in tmp_path.glob("*.wal"))
    assert len(segments) == 7  # 24 + 3 * 49 bytes each
    for name in segments:
        mine = [i for i, call in enumerate(calls) if call[1] == name]
        # the header is written and synced, then the directory, before any record
        assert [calls[i] for i in mine[:3]] == [("write", name), ("fsync", name), ("write", name)]
        assert calls[mine[1] + 1] == ("fsync", "dir")


def test_policy_always_commits_every_append(tmp_path, syscalls):
    with syscalls.open(tmp_path, fsync=FsyncPolicy.ALWAYS) as wal:
        for i in range(5):
            assert wal.append(1, b"x") == i + 1
            assert wal.durable_seq == i + 1
    assert len(syscalls.of("fdatasync")) == 5


def test_policy_off_never_syncs(tmp_path, syscalls):
    with syscalls.open(tmp_path, fsync="off", segment_size_bytes=100) as wal:
        for _ in range(20):
            wal.append(1, b"y" * 30)
        assert wal.commit() == 20
    assert syscalls.of("fdatasync") == syscalls.of("fsync") == []
    assert len(list(iter_records(tmp_path))) == 20


def test_bad_types_and_sizes_are_refused(tmp_path):
    with Wal.open(tmp_path) as wal:
        with pytest.raises(ValueError, match="0 is reserved"):
            wal.append(0, b"x")
        with pytest.raises(ValueError, match=r"1\.\.255"):
            wal.append(256, b"x")
        with pytest.raises(ValueError, match="exceeds MAX_RECORD_BYTES"):
            wal.append(1, bytes(MAX_RECORD_BYTES + 1))
        assert wal.next_seq == 1
        assert wal.append(255, b"") == 1


def test_an_fdatasync_error_is_fail_stop(tmp_path, syscalls):
    syscalls.fail_on["fdatasync"] = 2
    wal = syscalls.open(tmp_path)
    wal.append(1, b"a")
    assert wal.commit() == 1
    wal.append(1, b"b")
    with pytest.raises(WalFailedError) as info:
        wal.commit()
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.EIO
    assert info.value.fields["durable_seq"] == 1
    assert wal.durable_seq == 1
    assert wal.failed
    with pytest.raises(WalFailedError) as again:
        wal.append(1, b"c")
    assert isinstance(again.value.__cause__, OSError)
    with pytest.raises(WalFailedError):
        wal.commit()
    wal.close()  # does not commit: releases the lock
    assert len(syscalls.of("fdatasync")) == 2  # never retried
    # The contract (docs/wal-format.md): what was durable is there; "b", written
    # but not synced, may or may not be; "c", refused, is not.
    with Wal.open(tmp_path) as reopened:
        assert reopened.durable_seq in (1, 2)
    assert [r.payload for r in iter_records(tmp_path)] in ([b"a"], [b"a", b"b"])


def test_a_write_error_is_fail_stop(tmp_path, syscalls):
    Wal.open(tmp_path).close()
    syscalls.fail_on["write"] = 1
    wal = syscalls.open(tmp_path)
    wal.append(1, b"x")
    with pytest.raises(WalFailedError, match="injected EIO on write"):
        wal.commit()
    assert wal.durable_seq == 0
    assert syscalls.of("fdatasync") == []
    wal.close()
    assert list(iter_records(tmp_path)) == []


def test_a_failed_segment_creation_is_fail_stop(tmp_path, syscalls):
    wal = syscalls.open(tmp_path, segment_size_bytes=100)
    # The journal's name (wal/identity.py), then the first segment: each file, then its directory.
    assert syscalls.of("fsync") == ["JOURNAL.tmp", "dir", segment_name(1), "dir"]
    syscalls.fail_on["fsync"] = 6  # the directory sync of the second segment
    for _ in range(4):
        wal.append(1, b"z" * 40)
    with pytest.raises(WalFailedError):
        wal.commit()
    assert wal.durable_seq == 0
    with pytest.raises(WalFailedError):
        wal.append(1, b"z")
    wal.close()
    with Wal.open(tmp_path) as reopened:  # the first segment's record was synced
        assert reopened.durable_seq == 1


def test_close_commits_and_is_idempotent(tmp_path):
    wal = Wal.open(tmp_path)
    wal.append(1, b"kept")
    wal.close()
    wal.close()
    assert "closed" in repr(wal)
    assert [r.payload for r in iter_records(tmp_path)] == [b"kept"]


def test_a_second_writer_is_refused_in_process_and_across_processes(tmp_path):
    with Wal.open(tmp_path / "wal"):
        with pytest.raises(WalLockedError, match=f"in use by pid {os.getpid()}") as info:
            Wal.open(tmp_path / "wal")
        assert str(tmp_path / "wal") in str(info.value)
        assert info.value.fields["pid"] == os.getpid()
        code = (
            "import sys\nfrom tiffany.wal import Wal\nfrom tiffany.errors import WalLockedError\n"
            f"try:\n    Wal.open({str(tmp_path / 'wal')!r})\n"
            "except WalLockedError as e:\n    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 3, proc.stderr
        assert f"in use by pid {os.getpid()}" in proc.stdout
    with Wal.open(tmp_path / "wal"):  # released on close
        pass


def test_a_failed_open_releases_the_lock(tmp_path, fill):
    fill(tmp_path, [b"a"])
    (tmp_path / "junk.wal").write_bytes(b"")
    for _ in range(2):
        with pytest.raises(WalFormatError, match="not a WAL segment name"):
            Wal.open(tmp_path)
    (tmp_path / "junk.wal").unlink()
    Wal.open(tmp_path).close()


def test_the_frame_layout_is_what_the_format_says(tmp_path):
    with Wal.open(tmp_path, fsync="off") as wal:
        wal.append(7, b"abc")
    data = (tmp_path / segment_name(1)).read_bytes()
    assert len(data) == HEADER_SIZE_BYTES + RECORD_HEADER_SIZE_BYTES + 3
    from tiffany.wal.frame import encode

    assert data[HEADER_SIZE_BYTES:] == encode(7, b"abc")


def test_short_writes_are_completed(tmp_path, fill):
    def dribble(fd: int, data) -> int:
        return os.write(fd, bytes(data[:7]))

    payloads = [bytes([i]) * (i * 3) for i in range(40)]
    with Wal.open(tmp_path, segment_size_bytes=300, _write=dribble) as wal:
        for i, p in enumerate(payloads):
            wal.append(1, p)
            if i % 6 == 0:
                wal.commit()
    assert [r.payload for r in iter_records(tmp_path)] == payloads
    assert len(list(tmp_path.glob("*.wal"))) > 3


def test_open_syncs_what_a_previous_writer_left_unsynced(tmp_path, syscalls, fill):
    fill(tmp_path, [b"a", b"b"], fsync=FsyncPolicy.OFF)
    with syscalls.open(tmp_path) as wal:
        assert wal.durable_seq == 2
        assert syscalls.of("fsync") == [segment_name(1)]
    syscalls.calls.clear()
    with syscalls.open(tmp_path, fsync="off"):
        assert syscalls.calls == []


def test_an_engines_wal_starts_at_its_first_seq_and_refuses_another_engines(tmp_path):
    """``serve --engines N``: engine i's WAL holds seqs of its range only.

    The ranges: tiffany/wire/shards.py.
    """
    first, limit = (1 << 40) + 1, (2 << 40) + 1
    with Wal.open(tmp_path / "e1", first_seq=first, limit_seq=limit) as wal:
        assert wal.append(1, b"a") == first
        wal.commit()
    with Wal.open(tmp_path / "e1", first_seq=first, limit_seq=limit) as wal:
        assert wal.next_seq == first + 1  # reopened: it goes on, the range is no restart
    assert [r.seq for r in iter_records(tmp_path / "e1")] == [first]
    with Wal.open(tmp_path / "e0") as wal:
        wal.append(1, b"a")
        wal.commit()
    # Engine 1 on engine 0's WAL, engine 0 on engine 1's: refused, nothing written.
    with pytest.raises(WalFormatError, match="another engine's WAL"):
        Wal.open(tmp_path / "e0", first_seq=first, limit_seq=limit)
    with pytest.raises(WalFormatError, match="another engine's WAL"):
        Wal.open(tmp_path / "e1", first_seq=1, limit_seq=first)
    assert [r.seq for r in iter_records(tmp_path / "e0")] == [1]


def test_the_first_open_names_the_wal_and_a_full_disk_leaves_it_unnamed(tmp_path, monkeypatch):
    from tiffany.wal import identity

    with Wal.open(tmp_path / "named") as wal:
        wal.append(1, b"a")
    name = identity.identity(tmp_path / "named")
    assert name is not None
    assert name.startswith("file:")
    Wal.open(tmp_path / "named").close()
    assert identity.identity(tmp_path / "named") == name  # written once, never changed

    def failing(code: int, text: str) -> Any:
        def fail(*_args: Any, **_kw: Any) -> int:
            raise OSError(code, text)

        return fail

    from tiffany.wal import writer

    # Naming fails as writing its file would on a full disk (os.open itself is the lock's too).
    monkeypatch.setattr(writer, "ensure_identity", failing(errno.ENOSPC, "No space left on device"))
    with Wal.open(tmp_path / "old") as wal:  # the engine still starts on what it holds
        wal.append(1, b"a")
    assert identity.identity(tmp_path / "old") is None
    monkeypatch.setattr(writer, "ensure_identity", failing(errno.EIO, "I/O error"))
    with pytest.raises(OSError, match="I/O error"):
        Wal.open(tmp_path / "other")
