"""Retention: which segments are released, a kill -9 mid-release, reading past a released prefix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from test_checkpoint import SEGMENT_BYTES, checkpoint_now, fill

from tiffany.durable.checkpoint import Checkpoint, read_checkpoint
from tiffany.durable.history import checkpoint_of, scan
from tiffany.durable.retention import Checkpointer, Retain, releasable, release
from tiffany.durable.runtime import Runtime
from tiffany.wal import Wal, iter_records
from tiffany.wal.format import HEADER_SIZE_BYTES, segment_name
from tiffany.wal.segments import ARCHIVE_DIR_NAME, history_start, list_segments

HERE = Path(__file__).resolve().parent
EVERYTHING = 10**12


def history(wal: Path) -> list[tuple[int, int, bytes]]:
    return [(r.seq, r.rtype, r.payload) for r in iter_records(wal)]


@pytest.fixture
def sleeper_dir(tmp_path: Path) -> tuple[Path, str]:
    """A data dir: 60 finished runs, a sleeper still running, 60 more finished; a checkpoint."""
    data = tmp_path / "data"
    fill(data, 60)
    sleeper = fill(data, 0, unfinished=1)[-1]
    fill(data, 60, first=60)
    checkpoint_now(data)
    return data, sleeper


def test_only_segments_of_finished_projected_checkpointed_runs_are_released(
    sleeper_dir: tuple[Path, str],
) -> None:
    data, sleeper = sleeper_dir
    wal = data / "wal"
    before = history(wal)
    cp = read_checkpoint(wal, EVERYTHING)
    assert cp is not None
    first = scan(wal).get(sleeper).first_seq
    live = list_segments(wal)

    assert release(wal, cp, projected_seq=0, retain=Retain.ARCHIVE) == []  # nothing projected
    assert release(wal, cp, projected_seq=EVERYTHING, retain=Retain.ALL) == []
    half = live[3].first_seq - 1  # the store has the first three segments only
    assert release(wal, cp, projected_seq=half, retain=Retain.ARCHIVE) == [s.name for s in live[:3]]
    gone = release(wal, cp, projected_seq=EVERYTHING, retain=Retain.ARCHIVE)
    assert gone  # more once the store caught up, but never the sleeper's first segment
    archived = list_segments(wal / ARCHIVE_DIR_NAME)
    now_live = list_segments(wal)
    assert [s.name for s in archived] == [s.name for s in live[: len(archived)]]
    # Released up to the segment holding the sleeper's first record, not beyond.
    assert now_live[0].first_seq <= first < now_live[1].first_seq
    assert history(wal) == before  # the archive, then the live segments: one log


def test_an_older_checkpoint_bounds_the_release(sleeper_dir: tuple[Path, str]) -> None:
    data, _ = sleeper_dir
    wal = data / "wal"
    early = Checkpoint(seq=list_segments(wal)[2].first_seq - 1, max_run_no=1)
    assert [s.name for s in releasable(wal, early, EVERYTHING)] == [
        s.name for s in list_segments(wal)[:2]
    ]


def test_the_last_segment_is_never_released(tmp_path: Path) -> None:
    fill(tmp_path, 40)
    cp = checkpoint_now(tmp_path)
    wal = tmp_path / "wal"
    last = list_segments(wal)[-1]
    release(wal, cp, EVERYTHING, Retain.DELETE)
    assert list_segments(wal) == [last]
    assert history_start(wal) == last.first_seq > 1


def test_a_start_after_release_resumes_the_unfinished_run_and_numbers_on(
    sleeper_dir: tuple[Path, str],
) -> None:
    data, sleeper = sleeper_dir
    wal = data / "wal"
    cp = read_checkpoint(wal, EVERYTHING)
    assert cp is not None
    release(wal, cp, EVERYTHING, Retain.DELETE)
    assert history_start(wal) > 1
    with Runtime(data, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
        assert rt.recover() == [sleeper]
        assert rt.opened.max_run_no == 121


KILLER = """
import os, signal, sys
from pathlib import Path
import tiffany.wal.segments as segments
from tiffany.durable.checkpoint import read_checkpoint
from tiffany.durable.retention import Retain, release

wal, at, retain = Path(sys.argv[1]), int(sys.argv[2]), Retain(sys.argv[3])
real, calls = segments.fsync_dir, [0]

def fsync_dir(path, fsync=os.fsync):
    calls[0] += 1
    if calls[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
    real(path, fsync)

segments.fsync_dir = fsync_dir
release(wal, read_checkpoint(wal, 10**12), 10**12, retain)
"""


@pytest.mark.parametrize("retain", [Retain.ARCHIVE, Retain.DELETE])
def test_a_kill_9_at_any_step_of_a_release_loses_nothing(
    sleeper_dir: tuple[Path, str], tmp_path: Path, retain: Retain
) -> None:
    data, sleeper = sleeper_dir
    before = history(data / "wal")
    cp = read_checkpoint(data / "wal", EVERYTHING)
    assert cp is not None
    releasing = len(releasable(data / "wal", cp, EVERYTHING))
    assert releasing >= 3
    # Directory syncs: archive, the new archive dir, then two per segment; delete, one each.
    syncs = 2 * releasing + 1 if retain is Retain.ARCHIVE else releasing
    killed = 0
    for at in range(1, syncs + 2):  # the last one is not reached: the release completes
        copy = tmp_path / f"kill-{at}"
        shutil.copytree(data, copy)
        wal = copy / "wal"
        proc = subprocess.run(
            [sys.executable, "-c", KILLER, str(wal), str(at), str(retain)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode in (0, -9), proc.stderr
        killed += proc.returncode == -9
        kept = history(wal)
        if retain is Retain.ARCHIVE:
            assert kept == before  # every record still readable, in order, no gap
        else:
            assert kept == before[-len(kept) :]  # a suffix: only whole released segments went
        with Runtime(copy, fsync="off", segment_size_bytes=SEGMENT_BYTES) as rt:
            assert rt.recover() == [sleeper]  # the WAL opens; the unfinished run is whole
        # Releasing again after the restart finishes the job.
        release(wal, cp, EVERYTHING, retain)
        assert len(list_segments(wal)) == len(list_segments(data / "wal")) - releasing
    assert killed == syncs


def test_a_reader_finds_a_segment_archived_after_it_listed_it(tmp_path: Path) -> None:
    fill(tmp_path, 40)
    wal = tmp_path / "wal"
    before = history(wal)
    records = iter_records(wal)
    assert next(records).seq == 1  # the live segments are listed now
    release(wal, checkpoint_now(tmp_path), EVERYTHING, Retain.ARCHIVE)
    assert [(r.seq, r.rtype, r.payload) for r in records] == before[1:]


def test_a_torn_creation_of_the_only_live_segment_is_reset(tmp_path: Path) -> None:
    fill(tmp_path, 40)
    wal = tmp_path / "wal"
    cp = checkpoint_now(tmp_path)
    release(wal, cp, EVERYTHING, Retain.ARCHIVE)
    (last,) = list_segments(wal)
    end = cp.seq + 1
    (wal / segment_name(end)).write_bytes(b"\x00" * (HEADER_SIZE_BYTES // 2))  # torn rotation
    release(wal, cp, EVERYTHING, Retain.ARCHIVE)  # now the torn file is the only live one
    assert [s.first_seq for s in list_segments(wal)] == [end]
    with Wal.open(wal, fsync="off") as log:
        assert log.next_seq == end
        assert log.recovery is not None
        log.append(1, b"\x01\x00\x00\x00after")
    assert history(wal)[-1][0] == end
    assert last.name in {s.name for s in list_segments(wal / ARCHIVE_DIR_NAME)}


def test_the_checkpointer_writes_checkpoints_and_releases_as_the_store_catches_up(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    fill(data, 80)
    wal = data / "wal"
    projected = [0]
    base = checkpoint_of(scan(wal, read_checkpoint(wal, EVERYTHING)))
    durable = base.seq
    done = threading.Event()
    cpr = Checkpointer(
        wal,
        Checkpoint(0, 0),
        durable_seq=lambda: durable,
        projected_seq=lambda: projected[0],
        retain=Retain.ARCHIVE,
    )
    cpr.step()
    assert read_checkpoint(wal, EVERYTHING) == base
    assert cpr.released == 0  # the store has nothing yet
    projected[0] = durable
    real_step = cpr.step

    def step() -> None:
        real_step()
        done.set()

    cpr.step = step  # type: ignore[method-assign]
    cpr.start()
    assert done.wait(10)
    cpr.stop()
    assert cpr.released == len(list_segments(wal / ARCHIVE_DIR_NAME)) > 0
    assert len(list_segments(wal)) == 1


def tiffany(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    env["TIFFANY_LOG_FORMAT"] = "json"
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def archived_dir(tmp_path: Path, retain: Retain) -> tuple[Path, list[str]]:
    data = tmp_path / "data"
    ids = fill(data, 60)
    cp = checkpoint_now(data)
    assert release(data / "wal", cp, EVERYTHING, retain)
    return data, ids


def test_replay_verify_and_dump_read_an_archived_run(tmp_path: Path) -> None:
    data, ids = archived_dir(tmp_path, Retain.ARCHIVE)
    first = scan(data / "wal").get(ids[0])
    assert first.first_seq < list_segments(data / "wal")[0].first_seq  # it is archived
    proc = tiffany(data, "replay", ids[0], "--verify", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["status"] == "succeeded"
    dump = tiffany(data, "wal", "dump", "--run", ids[0], "--json")
    assert dump.returncode == 0, dump.stderr
    rows = [json.loads(line) for line in dump.stdout.splitlines()]
    assert rows[0]["type"] == "RUN_START"
    assert rows[-1]["type"] == "RUN_END"


def test_wal_verify_checks_the_archive_and_a_released_prefix(tmp_path: Path) -> None:
    data, _ = archived_dir(tmp_path, Retain.ARCHIVE)
    total = scan(data / "wal").last_seq
    proc = tiffany(data, "wal", "verify")
    assert proc.returncode == 0, proc.stderr
    archived = len(list_segments(data / "wal" / ARCHIVE_DIR_NAME))
    assert f"WAL ok: {total} records" in proc.stdout
    assert f"{archived} of them archived" in proc.stdout
    assert f"(seq 1..{total})" in proc.stdout

    shutil.rmtree(data / "wal" / ARCHIVE_DIR_NAME)  # as if deleted
    start = list_segments(data / "wal")[0].first_seq
    proc = tiffany(data, "wal", "verify", "--json")
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert report["first_seq"] == start > 1
    assert report["last_seq"] == total
    assert report["corruption"] is None


def test_db_rebuild_reads_the_archive_and_refuses_a_deleted_prefix(tmp_path: Path) -> None:
    data, ids = archived_dir(tmp_path, Retain.ARCHIVE)
    proc = tiffany(data, "db", "rebuild", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["runs"] == len(ids)
    assert report["last_seq"] == scan(data / "wal").last_seq

    deleted, _ = archived_dir(tmp_path / "other", Retain.DELETE)
    proc = tiffany(deleted, "db", "rebuild")
    assert proc.returncode == 1
    assert "deleted" in proc.stderr
    assert f"starts at seq {history_start(deleted / 'wal')}" in proc.stderr


def test_a_deleted_run_is_not_found_by_dump_or_replay_and_they_say_why(tmp_path: Path) -> None:
    """A run in deleted segments: exit 3 (no traceback), naming the deletion and the store."""
    deleted, ids = archived_dir(tmp_path, Retain.DELETE)
    start = history_start(deleted / "wal")
    for argv in (("wal", "dump", "--run", ids[0]), ("replay", ids[0], "--verify")):
        proc = tiffany(deleted, *argv)
        assert proc.returncode == 3, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"no run '{ids[0]}' in the WAL" in proc.stderr
        assert f"its segments before seq {start} were deleted" in proc.stderr
    # The engine's verify (the dashboard's "Verify replay") says the same.
    from tiffany.config import Settings
    from tiffany.engine.verifier import _verify
    from tiffany.errors import RunNotFound

    kind, message = _verify(Settings(data_dir=deleted), ids[0])
    assert kind == RunNotFound.kind
    assert f"its segments before seq {start} were deleted" in message
    kept, _ = archived_dir(tmp_path / "kept", Retain.ARCHIVE)
    proc = tiffany(kept, "wal", "dump", "--run", "run-nobody")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == "tiffany: no run 'run-nobody' in the WAL"
