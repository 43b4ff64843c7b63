"""Schedules' ticks across daylight-saving changes (``tiffany/schedules/store.py``).

Europe/Paris falls back on 2026-10-25 (03:00 CEST is 02:00 CET: the hour
from 02:00 to 03:00 comes twice) and springs forward on 2026-03-29 (02:00
CET is 03:00 CEST: that hour never comes). As Vixie cron does, a fixed-time
schedule fires once in the repeated hour, a periodic one in both passes.
"""

from __future__ import annotations

import threading
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import event, select

from tiffany.schedules import store as schedules
from tiffany.schedules.store import last_ticks, repeats, ticks
from tiffany.store import make_engine, make_reader_engine, session_factory
from tiffany.store.models import ScheduleClock

PARIS = ZoneInfo("Europe/Paris")


def _local(cron: str, start: datetime, end: datetime) -> list[str]:
    """The ticks in ``(start, end]`` as Paris wall-clock times, checked the same both ways."""
    after, until = start.timestamp(), end.timestamp()
    forward = ticks(cron, "Europe/Paris", after, until, 1_000)
    assert last_ticks(cron, "Europe/Paris", after, until, 1_000) == forward
    return [datetime.fromtimestamp(t, PARIS).strftime("%d %H:%M:%S %Z") for t in forward]


FALL_BACK = (datetime(2026, 10, 24, 12, tzinfo=PARIS), datetime(2026, 10, 26, 12, tzinfo=PARIS))


@pytest.mark.parametrize(
    ("cron", "expected"),
    [
        # croniter gave 02:30 CEST and 02:30 CET: a daily job ran twice that night.
        ("30 2 * * *", ["25 02:30:00 CEST", "26 02:30:00 CET"]),
        (
            "0 1-3 * * *",
            [
                "25 01:00:00 CEST",
                "25 02:00:00 CEST",  # and not again at 02:00 CET
                "25 03:00:00 CET",
                "26 01:00:00 CET",
                "26 02:00:00 CET",
                "26 03:00:00 CET",
            ],
        ),
        ("30 2 * * * 15", ["25 02:30:15 CEST", "26 02:30:15 CET"]),  # seconds: still fixed-time
    ],
)
def test_a_fixed_time_schedule_fires_once_in_the_repeated_hour(cron, expected) -> None:
    assert not repeats(cron)
    assert _local(cron, *FALL_BACK) == expected


def test_a_periodic_schedule_fires_in_both_passes_of_the_repeated_hour() -> None:
    assert repeats("*/30 2 * * *")
    assert _local("*/30 2 * * *", *FALL_BACK) == [
        "25 02:00:00 CEST",
        "25 02:30:00 CEST",
        "25 02:00:00 CET",
        "25 02:30:00 CET",
        "26 02:00:00 CET",
        "26 02:30:00 CET",
    ]
    night = (datetime(2026, 10, 25, 1, 30, tzinfo=PARIS), datetime(2026, 10, 25, 3, tzinfo=PARIS))
    assert _local("*/15 * * * *", *night) == [
        *(f"25 {t} CEST" for t in ("01:45:00", "02:00:00", "02:15:00", "02:30:00", "02:45:00")),
        *(f"25 {t} CET" for t in ("02:00:00", "02:15:00", "02:30:00", "02:45:00", "03:00:00")),
    ]
    hourly = _local("0 * * * *", *night)
    assert hourly == ["25 02:00:00 CEST", "25 02:00:00 CET", "25 03:00:00 CET"]
    for cron in ("0 */2 * * *", "0-59/30 2 * * *", "* * * * * */10"):
        assert repeats(cron), cron


def test_spring_forward_fires_a_tick_of_the_missing_hour_once_at_three() -> None:
    spring = (datetime(2026, 3, 29, 1, tzinfo=PARIS), datetime(2026, 3, 29, 4, tzinfo=PARIS))
    for cron in ("30 2 * * *", "0,30 2 * * *", "*/30 2 * * *"):
        assert _local(cron, *spring) == ["29 03:00:00 CEST"], cron
    assert _local("0 * * * *", *spring) == ["29 03:00:00 CEST", "29 04:00:00 CEST"]


def test_a_version_is_seen_only_with_its_row_through_the_apis_autocommit_engine(
    pg_migrated_url: str,
) -> None:
    # The API reads PostgreSQL through an autocommit engine: there an add's
    # clock UPDATE committed at once, before its row, so a runner could read
    # a newer version from another add and never see this one.
    api = make_reader_engine(pg_migrated_url, 2)
    other = make_engine(pg_migrated_url)
    flushed, release = threading.Event(), threading.Event()
    added: list[str] = []

    def add() -> None:
        with session_factory(api)() as session:

            @event.listens_for(session, "after_flush")
            def hold(*_: object) -> None:  # the row written, not committed yet
                flushed.set()
                release.wait(30)

            row = schedules.create(
                session,
                plan={"name": "p", "steps": []},
                inputs={},
                cron="0 0 1 1 *",
                timezone="UTC",
                catchup="skip",
                now=0.0,
                max_schedules=10,
            )
            added.append(row["schedule_id"])

    clock = select(ScheduleClock.seq).where(ScheduleClock.id == 1)
    with other.connect() as conn:
        before = conn.execute(clock).scalar_one()
    thread = threading.Thread(target=add)
    thread.start()
    try:
        assert flushed.wait(30)
        with other.connect() as conn:
            assert conn.execute(clock).scalar_one() == before  # not before its row is
    finally:
        release.set()
        thread.join(30)
    with session_factory(other)() as session:
        assert [t.id for t in schedules.changed_since(session, before)] == added
    api.dispose()
    other.dispose()
