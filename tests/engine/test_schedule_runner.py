"""The schedule runner: backoff while the store is away, ticks across daylight-saving changes.

The runner is stepped by hand (``step(now)``: a changes check, then what is
due at ``now``) on a store of its own and fires through a real engine's
submission, or one that records the requests.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import structlog
from engine_process import EngineProc
from process_support import wait_for

from tiffany.schedules import runner as schedules_runner
from tiffany.schedules import store as schedules
from tiffany.schedules.runner import BUSY_RETRY_S, ScheduleRunner
from tiffany.store import make_engine, session_factory
from tiffany.store.migrate import upgrade
from tiffany.store.models import Schedule

PARIS = ZoneInfo("Europe/Paris")

#: Once a year: an idle schedule.
YEARLY = "0 0 1 1 *"

#: Nothing listens on port 1 of loopback: every connection is refused at once.
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/test"


def test_a_store_that_refuses_connections_is_polled_less_and_less_often() -> None:
    submitted: list[dict] = []
    runner = ScheduleRunner(UNREACHABLE, lambda request: submitted.append(request) or {})
    seconds = 2.2
    with structlog.testing.capture_logs() as logs:
        runner.start()
        time.sleep(seconds)
        runner.stop()
    failed = [e for e in logs if e["event"] == "schedules.failed"]
    # Retried every BUSY_RETRY_S it failed seconds / BUSY_RETRY_S = 8 times; backing off
    # (0.25, 0.5, 1, 2 s) it fails at most 4 times in 2.2 s.
    assert 1 <= len(failed) <= 4 < seconds / BUSY_RETRY_S, failed
    assert runner.failures == len(failed)
    for event in failed:  # one line each: what failed and when it is tried again
        assert event["log_level"] == "warning"
        assert "exc_info" not in event
        assert "Connection refused" in event["error"] or "connection" in event["error"].lower()
        assert event["retry_in_s"] > 0
    assert [e["retry_in_s"] for e in failed] == sorted(e["retry_in_s"] for e in failed)
    assert submitted == []


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    """A real engine (its own store holds no schedule: the tests' runner has its own)."""
    proc = EngineProc(tmp_path_factory.mktemp("sched") / "data")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A migrated SQLite store of schedules, for a runner stepped by hand."""
    url = f"sqlite:///{tmp_path / 'schedules.db'}"
    made = make_engine(url)
    upgrade(made)
    made.dispose()
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated store of schedules: SQLite, or a private schema of the test PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("store"))
    return str(request.getfixturevalue("pg_migrated_url"))


class Fired:
    """The engine's submission, recording each tick it is given (``schedule id -> ticks``)."""

    def __init__(self, engine: EngineProc) -> None:
        self.engine = engine
        self.ticks: dict[str, list[str]] = {}

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = self.engine.call("submit", **request)
        self.ticks.setdefault(request["schedule"]["id"], []).append(request["schedule"]["tick"])
        return answer


def _add(url: str, sid: str, cron: str, catchup: str, created_at: float, zone: str) -> None:
    plan = {
        "name": sid,
        "steps": [{"id": "w", "tool": "file.write", "args": {"path": "t", "content": "x"}}],
    }
    with session_factory(make_engine(url))() as session:
        session.add(
            Schedule(
                id=sid,
                name=sid,
                plan=plan,
                inputs={},
                cron=cron,
                timezone=zone,
                catchup=catchup,
                paused=False,
                created_at=created_at,
            )
        )
        session.commit()


def _paris(ticks: list[str]) -> list[str]:
    """UTC ticks (as the keys name them) as Paris wall-clock times."""
    out = []
    for tick in ticks:
        utc = datetime.strptime(tick, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        out.append(utc.astimezone(PARIS).strftime("%H:%M %Z"))
    return out


def test_a_daily_schedule_fires_once_on_the_fall_back_night_and_a_periodic_one_in_both_hours(
    engine: EngineProc, store: str
) -> None:
    # "30 2 * * *" in Europe/Paris fired at 02:30 CEST and again at 02:30 CET
    # on 2026-10-25 (croniter gives both): a daily job ran twice that night.
    midnight = datetime(2026, 10, 25, 0, 0, tzinfo=PARIS).timestamp()
    _add(store, "sched-daily", "30 2 * * *", "all", midnight, "Europe/Paris")
    _add(store, "sched-quarter", "*/15 * * * *", "all", midnight, "Europe/Paris")
    fired = Fired(engine)
    runner = ScheduleRunner(store, fired)
    try:
        for minute in range(0, 5 * 60 + 1):  # 00:00 CEST to 04:00 CET, a poll a minute
            runner.step(midnight + minute * 60 + 0.5)
    finally:
        runner.stop()
    assert _paris(fired.ticks["sched-daily"]) == ["02:30 CEST"]
    quarters = _paris(fired.ticks["sched-quarter"])
    assert quarters[7:17] == [
        *(f"02:{m} CEST" for m in ("00", "15", "30", "45")),
        *(f"02:{m} CET" for m in ("00", "15", "30", "45")),
        "03:00 CET",
        "03:15 CET",
    ], quarters
    assert len(quarters) == 5 * 4  # five real hours from midnight: 01:00 to 04:00 and 02:00 again
    assert runner.fired == 1 + len(quarters)


def test_skip_fires_the_ticks_that_came_due_while_a_poll_was_busy(
    engine: EngineProc, store: str
) -> None:
    # A poll that ran long (250 schedules every second on a busy engine: a
    # few seconds) made the ticks that came due meanwhile more than
    # SKIP_GRACE_S old at the next poll: "skip" dropped them, without a word,
    # while the engine was up; a sixth of the ticks started no run.
    nine = datetime(2027, 3, 1, 9, 0, 0, tzinfo=UTC).timestamp()
    _add(store, "sched-nine", "0 9 * * *", "skip", nine - 60, "UTC")
    _add(store, "sched-second", "* * * * * *", "skip", nine - 0.5, "UTC")
    _add(store, "sched-one", "* * * * * *", "one", nine - 0.5, "UTC")
    fired = Fired(engine)
    runner = ScheduleRunner(store, fired)
    try:
        with structlog.testing.capture_logs() as logs:
            assert runner.step(nine - 0.1) == 0  # 08:59:59.9, and it took 3 s
            assert runner.step(nine + 3.1) == 1 + 4 + 4
        assert fired.ticks == {
            "sched-nine": ["2027-03-01T09:00:00Z"],
            "sched-second": [f"2027-03-01T09:00:0{s}Z" for s in range(4)],
            "sched-one": [f"2027-03-01T09:00:0{s}Z" for s in range(4)],
        }
        assert not [e for e in logs if e["event"] == "schedules.skipped"]
        # A runner that did not watch them (the engine restarted) skips what it
        # missed, and says how many: 09:00:04 to 09:00:09 are skipped, 09:00:10 fires.
        again = ScheduleRunner(store, fired)
        try:
            with structlog.testing.capture_logs() as logs:
                assert again.step(nine + 10.5) == 2
        finally:
            again.stop()
    finally:
        runner.stop()
    skipped = {e["schedule"]: e for e in logs if e["event"] == "schedules.skipped"}
    assert skipped.keys() == {"sched-second", "sched-one"}
    for sid in skipped:
        assert fired.ticks[sid][-1] == "2027-03-01T09:00:10Z"
        assert (skipped[sid]["skipped"], skipped[sid]["log_level"]) == (6, "warning")
        assert (skipped[sid]["first"], skipped[sid]["last"]) == (
            "2027-03-01T09:00:04Z",
            "2027-03-01T09:00:09Z",
        )


class Recorded:
    """A submission that records each request and answers a run id (no engine)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        return {"run_id": f"run-{len(self.requests)}", "seq": len(self.requests)}

    def ticks(self, sid: str) -> list[str]:
        return [r["schedule"]["tick"] for r in self.requests if r["schedule"]["id"] == sid]


def _create(url: str, cron: str, catchup: str, now: float, zone: str = "UTC") -> str:
    """Add a schedule as the API and the CLI do (``schedules.create``: it takes a version)."""
    plan = {"name": cron, "steps": [{"id": "w", "tool": "sleep", "args": {"seconds": 0}}]}
    with session_factory(make_engine(url))() as session:
        row = schedules.create(
            session,
            plan=plan,
            inputs={},
            cron=cron,
            timezone=zone,
            catchup=catchup,
            now=now,
            max_schedules=100_000,
        )
    return str(row["schedule_id"])


def _paused(url: str, sid: str, paused: bool, now: float) -> None:
    with session_factory(make_engine(url))() as session:
        assert schedules.set_paused(session, sid, paused, now) is not None


def test_idle_schedules_are_looked_at_once_not_at_every_check(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every schedule was read and its ticks computed every 0.25 s: 20,000
    # idle ones cost the engine 88% of a core. Now a row is looked at when
    # it is added (or changed) and when its tick comes, not at each check.
    start = datetime(2027, 3, 1, 9, 0, 0, tzinfo=UTC).timestamp()
    idle = [_create(store, YEARLY, "skip", start - 60) for _ in range(200)]
    busy = _create(store, "* * * * * *", "skip", start - 60)
    computed: Counter[str] = Counter()  # croniter walks of the runner, by expression

    def counting(real: Any) -> Any:
        def count(cron: str, *args: Any) -> Any:
            computed[cron] += 1
            return real(cron, *args)

        return count

    for name in ("ticks", "last_ticks"):
        if hasattr(schedules_runner, name):
            monkeypatch.setattr(schedules_runner, name, counting(getattr(schedules_runner, name)))
    submitted = Recorded()
    runner = ScheduleRunner(store, submitted)
    try:
        for second in range(40):  # 40 checks (and a second's tick each)
            runner.step(start + second + 0.5)
    finally:
        runner.stop()
    assert computed[YEARLY] <= len(idle), "an idle row was looked at again"
    assert len(submitted.ticks(busy)) == 40
    assert submitted.ticks(idle[0]) == []


def test_a_random_cron_stored_by_an_older_version_never_fires(store: str) -> None:
    # "R * * * *" (croniter draws the minute again at every look) was accepted:
    # once a minute, it fired 35 times in 125 s. A row that holds one fails
    # alone: no tick, its last_error names the field.
    start = datetime(2027, 3, 1, 9, 0, 0, tzinfo=UTC).timestamp()
    _add(store, "sched-random", "R * * * *", "all", start - 3600, "UTC")
    _add(store, "sched-minute", "* * * * *", "skip", start - 1, "UTC")
    submitted = Recorded()
    runner = ScheduleRunner(store, submitted)
    try:
        with structlog.testing.capture_logs() as logs:
            for quarter in range(125 * 4):
                runner.step(start + quarter / 4)
    finally:
        runner.stop()
    assert submitted.ticks("sched-random") == []
    assert submitted.ticks("sched-minute") == [f"2027-03-01T09:0{m}:00Z" for m in range(3)]
    failed = [e for e in logs if e["event"] == "schedules.row_failed"]
    assert [e["schedule"] for e in failed] == ["sched-random"]  # once, not at every retry
    with session_factory(make_engine(store))() as session:
        error = session.get(Schedule, "sched-random").last_error
    assert "cron: not a cron expression (minute 'R': 'R' (random)" in error


def test_adds_pauses_resumes_and_deletes_by_others_are_seen_at_the_next_check(
    any_store: str,
) -> None:
    store = any_store
    start = datetime(2027, 3, 1, 9, 0, 0, tzinfo=UTC).timestamp()
    submitted = Recorded()
    runner = ScheduleRunner(store, submitted)
    try:
        assert runner.step(start) == 0  # nothing yet: the first check read every (no) row
        every = _create(store, "* * * * * *", "all", start + 0.2)
        skip = _create(store, "* * * * * *", "skip", start + 0.2)
        gone = _create(store, "* * * * * *", "skip", start + 0.2)
        assert runner.step(start + 1.5) == 3  # 09:00:01 for each
        for sid in (every, skip):
            _paused(store, sid, True, start + 1.6)
        with session_factory(make_engine(store))() as session:
            assert schedules.remove(session, gone)
        assert runner.step(start + 2.5) == 0
        assert runner.step(start + 5.5) == 0
        for sid in (every, skip):
            _paused(store, sid, False, start + 5.6)
        with structlog.testing.capture_logs() as logs:
            started = runner.step(start + 6.2)
    finally:
        runner.stop()
    # "all" catches up 09:00:02 to 09:00:06; "skip" skips what came due while paused.
    assert started == 5 + 1
    assert submitted.ticks(every) == [f"2027-03-01T09:00:0{s}Z" for s in range(1, 7)]
    assert submitted.ticks(skip) == ["2027-03-01T09:00:01Z", "2027-03-01T09:00:06Z"]
    assert submitted.ticks(gone) == ["2027-03-01T09:00:01Z"]
    (skipped,) = [e for e in logs if e["event"] == "schedules.skipped"]
    assert (skipped["schedule"], skipped["skipped"]) == (skip, 4)


def test_a_schedule_added_while_the_runner_sleeps_fires_on_time(store: str) -> None:
    """The thread, on the wall clock: an add from elsewhere wakes it within a check."""
    submitted = Recorded()
    runner = ScheduleRunner(store, submitted)
    runner.start()
    try:
        wait_for(lambda: runner.failures == 0 and runner._version is not None, 30, "a first check")
        sid = _create(store, "* * * * * *", "skip", time.time())  # noqa: TID251 - ticks are wall-clock
        wait_for(lambda: len(submitted.ticks(sid)) >= 3, 60, "three ticks")
    finally:
        runner.stop()
    seconds = [datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ") for t in submitted.ticks(sid)]
    assert len(set(seconds)) == len(seconds)
