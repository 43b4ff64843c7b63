"""The journal in PostgreSQL (tiffany.wal.pg): commits, leases, the fence, replay and recovery.

Against the real local PostgreSQL (``postgres_url``), each test in a schema of
its own migrated by Alembic, as ``tiffany db upgrade`` does.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import structlog
from sqlalchemy import text

from tiffany.durable import Runtime, scan, verify
from tiffany.durable.history import decoded_records
from tiffany.errors import WalFailedError, WalLockedError
from tiffany.wal import spans_of
from tiffany.wire.records import RecordType

HERE = Path(__file__).resolve().parent
CHILD = HERE / "crash_child.py"


@pytest.fixture
def pg_url(pg_migrated_url: str) -> str:
    """A URL whose connections use a fresh schema holding the migrated tables."""
    return pg_migrated_url


def _records(url: str, stream: str = "main") -> list[tuple[int, int, bytes]]:
    from tiffany.wal.pg import PgStream

    return [(s, t, bytes(d[a:b])) for s, t, d, a, b, _ in spans_of(PgStream(url, stream))]


def test_appends_are_invisible_until_the_commit_then_read_back_in_order(pg_url: str) -> None:
    from tiffany.wal.pg import PgLog

    with PgLog.open(pg_url) as log:
        assert (log.next_seq, log.durable_seq, log.epoch) == (1, 0, 1)
        assert [log.append(5, b"\x01\x00\x00\x00a"), log.append(6, b"\x01\x00\x00\x00bb")] == [1, 2]
        assert _records(pg_url) == []
        seen: list[tuple[int, int]] = []
        log.on_commit = lambda first, last, _s: seen.append((first, last))
        assert log.commit() == 2
        assert seen == [(1, 2)]
        assert _records(pg_url) == [(1, 5, b"\x01\x00\x00\x00a"), (2, 6, b"\x01\x00\x00\x00bb")]
        log.append(7, b"x" * 70_000)  # a payload past a page, through COPY
    with PgLog.open(pg_url) as again:  # the clean close gave the lease back: no wait
        assert (again.next_seq, again.durable_seq, again.epoch) == (4, 3, 2)
        assert _records(pg_url)[2] == (3, 7, b"x" * 70_000)
        assert [s for s, *_ in _records(pg_url)] == [1, 2, 3]
        assert _records(pg_url, "other") == []


def test_a_second_writer_is_refused_while_the_lease_is_current(pg_url: str) -> None:
    from tiffany.wal.pg import PgLog

    first = PgLog.open(pg_url, lease_s=30)
    try:
        with pytest.raises(WalLockedError) as refused:
            PgLog.open(pg_url, lease_s=30)
        assert refused.value.fields["owner"] == first.owner
        assert 0 < refused.value.fields["lease_left_s"] <= 30
        assert "leased to" in str(refused.value)
        with PgLog.open(pg_url, "another-stream", lease_s=30) as other:  # streams are independent
            assert other.epoch == 1
    finally:
        first.close()
    with PgLog.open(pg_url, lease_s=30) as second:
        assert second.epoch == first.epoch + 1


def test_a_held_lease_is_waited_for_up_to_wait_s_then_taken_once_given_back(
    pg_url: str,
) -> None:
    """``PgLog.open(wait_s=...)``: tenacity retries the lease, tells the holder once."""
    from tiffany.wal.pg import PgLog

    first = PgLog.open(pg_url, lease_s=30)
    try:
        started = time.monotonic()
        with pytest.raises(WalLockedError):
            PgLog.open(pg_url, lease_s=30, wait_s=0.5)
        assert time.monotonic() - started >= 0.5  # it waited before giving up
        taken: list[PgLog] = []
        with structlog.testing.capture_logs() as logs:
            waiter = threading.Thread(
                target=lambda: taken.append(PgLog.open(pg_url, lease_s=30, wait_s=120))
            )
            waiter.start()
            deadline = time.monotonic() + 60
            while not any(e["event"] == "pgwal.waiting" for e in logs):
                assert time.monotonic() < deadline, "the second writer never waited"
                waiter.join(0.05)
            first.close()  # the lease given back: the waiter takes it at its next try
            waiter.join(120)
        assert [e["owner"] for e in logs if e["event"] == "pgwal.waiting"] == [first.owner]
        assert [log.epoch for log in taken] == [first.epoch + 1]
    finally:
        first.close()
        for log in taken:
            log.close()


def test_a_streams_readers_share_a_pool_that_mends_a_killed_connection(pg_url: str) -> None:
    import psycopg

    from tiffany.config import conninfo
    from tiffany.wal.pg import READ_POOL_SIZE, PgLog, PgStream

    with PgLog.open(pg_url) as log:
        for i in range(3):
            log.append(5, b"\x01\x00\x00\x00" + bytes([i]))
        log.commit()
    stream = PgStream(pg_url)
    try:
        assert [seq for seq, _t, _p in stream.rows(0, 3, 10)] == [1, 2, 3]
        with stream._connection() as conn:
            pid = conn.info.backend_pid
        with psycopg.connect(conninfo(pg_url), autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
            deadline = time.monotonic() + 60  # the signal is sent; wait for the backend's exit
            alive = "SELECT 1 FROM pg_stat_activity WHERE pid = %s"
            while killer.execute(alive, (pid,)).fetchone():
                assert time.monotonic() < deadline, "the backend outlived its termination"
        results: list[list[int] | None] = []
        for _ in range(READ_POOL_SIZE + 1):  # the pool hands its connections out in turn
            try:
                results.append([seq for seq, _t, _p in stream.rows(1, 3, 10)])
            except psycopg.OperationalError:
                results.append(None)
        # The killed connection fails the one read it is handed to, and is replaced.
        assert results.count(None) == 1
        assert results[-1] == [2, 3]
    finally:
        stream.close()


def test_a_stream_dropped_unclosed_closes_its_pool(pg_url: str) -> None:
    from tiffany.wal.pg import PgStream

    stream = PgStream(pg_url)
    assert stream.first_seq() == 1
    pool = stream._pool
    assert pool is not None
    assert not pool.closed
    del stream
    gc.collect()
    assert pool.closed


def test_the_heartbeat_keeps_the_lease_past_its_length(pg_url: str) -> None:
    from tiffany.wal.pg import PgLog

    with PgLog.open(pg_url, lease_s=0.6) as holder:
        time.sleep(1.5)  # two and a half lease lengths, renewed every 0.2 s
        with pytest.raises(WalLockedError):
            PgLog.open(pg_url, lease_s=0.6)
        holder.append(1, b"\x01\x00\x00\x00")
        assert holder.commit() == 1


def test_a_writer_whose_lease_was_taken_over_is_fenced_and_writes_nothing(pg_url: str) -> None:
    from tiffany.wal.pg import PgLog

    # A paused engine: no heartbeat, so its lease runs out while it is stopped.
    paused = PgLog.open(pg_url, lease_s=0.5, heartbeat=False)
    paused.append(1, b"\x01\x00\x00\x00old")
    paused.commit()
    time.sleep(0.7)
    with PgLog.open(pg_url, lease_s=30) as taker:
        assert taker.epoch == paused.epoch + 1
        assert taker.next_seq == 2
        taker.append(1, b"\x01\x00\x00\x00new")
        taker.commit()
        # The paused engine wakes up and goes on as if nothing happened.
        assert paused.append(1, b"\x01\x00\x00\x00lost") == 2
        with pytest.raises(WalFailedError) as fenced:
            paused.commit()
        assert fenced.value.fields["reason"] == "fenced"
        assert paused.failed
        with pytest.raises(WalFailedError):
            paused.append(1, b"\x01\x00\x00\x00again")
        paused.close()  # gives back nothing: the lease is not its own
        assert _records(pg_url) == [(1, 1, b"\x01\x00\x00\x00old"), (2, 1, b"\x01\x00\x00\x00new")]
        taker.append(1, b"\x01\x00\x00\x00more")
        assert taker.commit() == 3  # the fenced writer did not disturb the holder


def test_a_run_records_replays_and_verifies_on_postgres_as_on_files(
    pg_url: str, tmp_path: Path
) -> None:
    from tiffany.wal.pg import PgLog, PgStream

    results = {}
    for where in ("file", "postgres"):
        log = PgLog.open(pg_url) if where == "postgres" else None
        with Runtime(tmp_path / where, log=log) as rt:
            run_id = rt.submit("durable_workloads:fan_in", 6, run_id="fan")
            rt.run()
            results[where] = (rt.status(run_id).status, rt.status(run_id).result)
    assert results["postgres"] == results["file"]
    assert results["postgres"][0] == "succeeded"
    report = verify(tmp_path / "unused", "fan", log=PgStream(pg_url))
    assert report.ok, report.to_dict()
    on_file = verify(tmp_path / "file", "fan")
    assert (report.records, report.dispatches) == (on_file.records, on_file.dispatches)
    kinds = [t for _s, t, _p in _records(pg_url)]
    assert kinds[0] == RecordType.RUN_START
    assert kinds[-1] == RecordType.RUN_END


def _clear_streams(url: str) -> None:
    from tiffany.store import make_engine

    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM wal_records"))
        conn.execute(text("DELETE FROM wal_streams"))
    engine.dispose()


def _journaled_steps(source: object) -> set[str]:
    """The lines whose step's completion the journal holds."""
    info = scan(source).get("crash-run")  # type: ignore[arg-type]
    return {
        rec.value  # type: ignore[union-attr]
        for _seq, rtype, rec in decoded_records(source, info)  # type: ignore[arg-type]
        if rtype == RecordType.WAKE and rec.cause == "step"  # type: ignore[union-attr]
    }


def _child(data_dir: Path, out: Path, kill_at: int, url: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]),
        CRASH_PG_URL=url,
        CRASH_PG_STREAM="crash",
        CRASH_PG_LEASE_S="1",
    )
    return subprocess.run(
        [sys.executable, str(CHILD), str(data_dir), str(out), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_kill_9_mid_run_then_another_engine_takes_the_stream_and_finishes(
    pg_url: str, tmp_path: Path
) -> None:
    from tiffany.wal.pg import PgLog, PgStream

    ref = _child(tmp_path / "ref", tmp_path / "ref.txt", 0, pg_url)
    assert ref.returncode == 0, ref.stderr
    # (structlog, unconfigured in the child, prints its events on stdout too)
    reference = json.loads(next(x for x in ref.stdout.splitlines() if x.startswith("{")))
    expected = sorted(reference["result"])
    _clear_streams(pg_url)  # the crashed twin starts from an empty stream
    out = tmp_path / "crash.txt"
    crashed = _child(tmp_path / "crash", out, reference["dispatches"] // 2, pg_url)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    done = _journaled_steps(PgStream(pg_url, "crash"))
    assert 0 < len(done) < len(expected)  # died mid-run, with steps done and to do
    # The dead engine's lease (1 s) still stands: a successor waits it out.
    deadline = time.monotonic() + 10
    while True:
        try:
            log = PgLog.open(pg_url, "crash", lease_s=5)
            break
        except WalLockedError:
            assert time.monotonic() < deadline, "the dead engine's lease never expired"
            time.sleep(0.1)
    assert log.epoch == 2
    with Runtime(tmp_path / "successor", log=log) as rt:
        assert rt.recover() == ["crash-run"]
        rt.run()
        state = rt.status("crash-run")
    assert (state.status, state.result) == ("succeeded", expected)
    counts = Counter(out.read_text().splitlines())
    assert sorted(counts) == expected
    for line in done:
        assert counts[line] == 1, (line, "completed before the crash, ran again")
    assert all(c <= 2 for c in counts.values()), counts  # in-flight steps at most once more
    assert verify(tmp_path / "unused", "crash-run", log=PgStream(pg_url, "crash")).ok


def _cli(*args: str, url: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]),
        TIFFANY_LOG_FORMAT="json",
        TIFFANY_JOURNAL="postgres",
        TIFFANY_DATABASE_URL=url,
    )
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_cli_reads_verifies_and_rebuilds_from_the_postgres_journal(
    pg_url: str, tmp_path: Path
) -> None:
    from tiffany.wal.pg import PgLog

    with Runtime(tmp_path / "engine", log=PgLog.open(pg_url)) as rt:
        rt.submit("durable_workloads:fan_in", 4, run_id="fan")
        rt.run()
    data_dir = tmp_path / "cli"  # no WAL here: everything comes from the database
    listed = _cli("runs", "--json", url=pg_url, data_dir=data_dir)
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(x)["run_id"] for x in listed.stdout.splitlines()] == ["fan"]
    dumped = _cli("wal", "dump", "--run", "fan", "--json", url=pg_url, data_dir=data_dir)
    assert dumped.returncode == 0, dumped.stderr
    rows = [json.loads(x) for x in dumped.stdout.splitlines()]
    assert rows[-1]["type"] == "RUN_END"
    assert {r["segment"] for r in rows} == {"main"}
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
    checked = _cli("wal", "verify", url=pg_url, data_dir=data_dir)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"journal ok: {rows[-1]['seq']} records in stream 'main'")
    replayed = _cli("replay", "fan", "--verify", "--json", url=pg_url, data_dir=data_dir)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["ok"] is True
    rebuilt = _cli("db", "rebuild", "--json", url=pg_url, data_dir=data_dir)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout)["runs"] == 1
    listed_streams = _cli("wal", "streams", "--json", url=pg_url, data_dir=data_dir)
    assert listed_streams.returncode == 0, listed_streams.stderr
    (stream,) = [json.loads(x) for x in listed_streams.stdout.splitlines()]
    assert (stream["stream"], stream["head"], stream["epoch"]) == ("main", rows[-1]["seq"], 1)
    assert stream["held"] is False  # the engine closed cleanly: the lease was given back
    refused = _cli("wal", "repair", "--yes", url=pg_url, data_dir=data_dir)
    assert refused.returncode == 2, refused.stderr  # USAGE: not for this journal
    assert "TIFFANY_JOURNAL=postgres" in refused.stderr
    assert not (data_dir / "wal").exists()  # nothing fell back to a file WAL
    # An engine on the stream again: the rebuild is refused, the store left as it is.
    with PgLog.open(pg_url) as held:
        busy = _cli("db", "rebuild", url=pg_url, data_dir=data_dir)
        assert held.durable_seq == rows[-1]["seq"]
    assert busy.returncode == 1, busy.stdout + busy.stderr
    assert "the journal stream 'main' is held by" in busy.stderr
    assert "an engine is running on it" in busy.stderr


def test_journal_postgres_needs_a_postgres_url(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from tiffany.config import Settings

    with pytest.raises(ValidationError, match="journal=postgres needs a PostgreSQL database_url"):
        Settings(data_dir=tmp_path, journal="postgres")


def test_a_start_reads_only_the_stream_after_its_checkpoint(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiffany.durable import history
    from tiffany.durable.retention import Checkpointer
    from tiffany.wal.pg import PgLog, PgStream

    with Runtime(tmp_path / "a", log=PgLog.open(pg_url)) as rt:
        for i in range(20):
            rt.submit("durable_workloads:fan_in", 3, run_id=f"r{i}")
        rt.run()
        total = rt.wal.durable_seq
    log = PgLog.open(pg_url)
    with Runtime(tmp_path / "b", log=log) as rt:  # a full read: no checkpoint yet
        assert rt.checkpoint is None
        # One pass of the engine's checkpointer thread.
        Checkpointer(log, rt.opened, durable_seq=lambda: log.durable_seq, projected_seq=int).step()
    assert [seq for seq, _data in PgStream(pg_url).checkpoints()] == [total]
    read: list[int] = []
    real = history.spans_of

    def counted(
        source: object, from_seq: int = 1, checked: object = None, at: object = None
    ) -> object:
        read.append(from_seq)
        return real(source, from_seq, checked, at)  # type: ignore[arg-type]

    monkeypatch.setattr(history, "spans_of", counted)
    with Runtime(tmp_path / "c", log=PgLog.open(pg_url)) as rt:
        assert rt.checkpoint is not None
        assert rt.checkpoint.seq == total
        assert rt.opened.max_run_no == 20  # new runs are numbered above the history
        assert rt.recover() == []
        rt.submit("durable_workloads:fan_in", 3, run_id="after")
        rt.run()
        assert rt.status("after").status == "succeeded"
    assert all(seq > total for seq in read), read  # nothing before the checkpoint was read
    assert verify(tmp_path / "unused", "after", log=PgStream(pg_url)).ok


def test_retain_delete_releases_the_finished_prefix_of_a_stream(
    pg_url: str, tmp_path: Path
) -> None:
    import retention_workloads as work
    from test_checkpoint import stop_when_done

    from tiffany.durable.retention import Checkpointer, Retain
    from tiffany.wal.pg import PgLog, PgStream

    log = PgLog.open(pg_url)
    with Runtime(tmp_path / "a", log=log) as rt:
        done = [rt.submit(work.quick, i) for i in range(10)]
        sleeper = rt.submit(work.dozer, 3600.0)  # stays unfinished
        later = [rt.submit(work.quick, i) for i in range(10, 15)]
        rt.sched.spawn(stop_when_done(rt, done + later), name="stop")
        rt.run()
    log = PgLog.open(pg_url)
    with Runtime(tmp_path / "b", log=log) as rt:
        sleeper_first = rt.opened.oldest_needed
        before = _records(pg_url)
        head = log.durable_seq
        cp = Checkpointer(
            log, rt.opened, durable_seq=lambda: head, projected_seq=lambda: 0, retain=Retain.DELETE
        )
        cp.step()
        assert _records(pg_url) == before  # nothing projected yet: nothing released
        cp = Checkpointer(
            log,
            rt.opened,
            durable_seq=lambda: head,
            projected_seq=lambda: head,
            retain=Retain.DELETE,
        )
        cp.step()
    stream = PgStream(pg_url)
    assert stream.first_seq() == sleeper_first  # the finished runs before the sleeper: gone
    assert _records(pg_url) == [r for r in before if r[0] >= sleeper_first]
    # The next start reads past the released prefix, resumes the sleeper, numbers on.
    with Runtime(tmp_path / "c", log=PgLog.open(pg_url)) as rt:
        assert rt.checkpoint is not None
        assert rt.recover() == [sleeper]
        assert rt.opened.max_run_no == 16
        rt.submit(work.quick, 99, run_id="after")
        rt.sched.spawn(stop_when_done(rt, ["after"]), name="stop")
        rt.run()
        assert rt.status("after").result == 99
    checked = _cli("wal", "verify", url=pg_url, data_dir=tmp_path / "cli")
    assert checked.returncode == 0, checked.stderr
    assert f"(seq {sleeper_first}.." in checked.stdout


def test_an_engines_stream_starts_at_its_first_seq_and_refuses_another_engines(
    pg_url: str,
) -> None:
    """``serve --engines N``: stream ``main-1`` holds engine 1's seqs (tiffany/wire/shards.py)."""
    from tiffany.errors import WalFormatError
    from tiffany.wal.pg import PgLog

    first = (1 << 40) + 1
    with PgLog.open(pg_url, "main-1", first_seq=first) as log:
        assert (log.next_seq, log.durable_seq) == (first, first - 1)
        assert log.append(5, b"\x01\x00\x00\x00a") == first
        log.commit()
    with PgLog.open(pg_url, "main-1", first_seq=first) as log:
        assert log.next_seq == first + 1
    with PgLog.open(pg_url, "main") as log:  # engine 0's stream: from seq 1
        log.append(5, b"\x01\x00\x00\x00a")
        log.commit()
    with pytest.raises(WalFormatError, match="another engine's stream"):
        PgLog.open(pg_url, "main", first_seq=first)
    assert [s for s, *_ in _records(pg_url, "main-1")] == [first]
