"""Bounds of ``/api/schedules``: pages, a cap on how many, cron expressions that do not move.

The list was one answer of every schedule (20,000 of them: 6 MB); it comes
in pages now (``limit``, ``after``), and ``tiffany schedule list`` reads them
a page at a time. At most ``TIFFANY_MAX_SCHEDULES`` exist (429 naming it).
croniter's ``R`` (random) and ``H`` (hashed) are refused naming ``cron``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import clean_env, make_settings, short_dir
from fastapi.testclient import TestClient

from tiffany.api import create_app
from tiffany.config import Settings
from tiffany.schedules import store as schedules
from tiffany.store import make_engine, session_factory
from tiffany.store.migrate import upgrade_url

#: Once a year: an idle schedule (the engine serving these tests fires none of them).
YEARLY = "0 0 1 1 *"


def _body(cron: str = YEARLY) -> dict[str, Any]:
    step = {"id": "w", "tool": "sleep", "args": {"seconds": 0}}
    return {"plan": {"name": "bounds", "steps": [step]}, "cron": cron}


@pytest.fixture(scope="module")
def client(engine) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(engine.data_dir)), raise_server_exceptions=False) as c:
        yield c


def _add(client: TestClient) -> str:
    r = client.post("/api/schedules", json=_body())
    assert r.status_code == 201, r.text
    return str(r.json()["schedule_id"])


def _all(client: TestClient, limit: int) -> list[str]:
    """Every schedule's id, page by page."""
    ids: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        page = client.get("/api/schedules", params=params)
        assert page.status_code == 200, page.text
        got = page.json()
        assert len(got["schedules"]) <= limit
        ids += [s["schedule_id"] for s in got["schedules"]]
        after = got["next_after"]
        if after is None:
            return ids


def test_the_list_comes_in_pages_oldest_first(client) -> None:
    added = [_add(client) for _ in range(7)]
    whole = _all(client, schedules.MAX_PAGE)
    assert whole[-7:] == added
    assert _all(client, 3) == whole
    first = client.get("/api/schedules", params={"limit": 2}).json()
    assert len(first["schedules"]) == 2
    assert first["next_after"]
    # A row deleted between two pages costs the next page nothing.
    assert client.delete(f"/api/schedules/{whole[2]}").status_code == 204
    rest = client.get("/api/schedules", params={"limit": 100, "after": first["next_after"]})
    assert [s["schedule_id"] for s in rest.json()["schedules"]] == whole[3:]
    assert (
        client.get("/api/schedules").json()["schedules"]
        == (
            client.get("/api/schedules", params={"limit": schedules.DEFAULT_PAGE}).json()[
                "schedules"
            ]
        )
    )


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"limit": schedules.MAX_PAGE + 1}, ["query", "limit"]),
        ({"limit": 0}, ["query", "limit"]),
        ({"after": "not-a-cursor"}, ["query", "after"]),
        ({"after": "nan:sched-x"}, ["query", "after"]),
    ],
)
def test_a_bad_page_request_is_a_422_naming_it(client, params, loc) -> None:
    r = client.get("/api/schedules", params=params)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc


def test_one_schedule_over_the_cap_is_a_429_naming_the_setting(client, engine) -> None:
    count = len(_all(client, schedules.MAX_PAGE))
    settings = make_settings(engine.data_dir, max_schedules=count + 2)
    with TestClient(create_app(settings), raise_server_exceptions=False) as capped:
        _add(capped)
        _add(capped)
        r = capped.post("/api/schedules", json=_body())
    assert r.status_code == 429, r.text
    answer = r.json()
    assert answer["code"] == "schedule.too_many"
    assert "TIFFANY_MAX_SCHEDULES" in answer["message"]
    assert (answer["limit"], answer["setting"]) == (count + 2, "TIFFANY_MAX_SCHEDULES")
    assert len(_all(client, schedules.MAX_PAGE)) == count + 2


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        ("R * * * *", "minute 'R': 'R' (random)"),
        ("0 r * * *", "hour 'r': 'R' (random)"),
        ("R/5 * * * *", "minute 'R/5': 'R' (random)"),
        ("* * * * * R", "second 'R': 'R' (random)"),
        ("H * * * *", "minute 'H': 'H' (hashed)"),
        ("H(0-29)/10 * * * *", "'H' (hashed)"),
    ],
)
def test_crons_whose_ticks_move_at_each_look_are_refused_naming_cron(client, cron, says) -> None:
    r = client.post("/api/schedules", json=_body(cron))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "cron"]
    assert says in detail["msg"]


def test_month_and_weekday_names_are_not_taken_for_r_or_h(client) -> None:
    r = client.post("/api/schedules", json=_body("0 9 1 MAR THU"))
    assert r.status_code == 201, r.text
    assert r.json()["next_tick"] is not None
    assert client.delete(f"/api/schedules/{r.json()['schedule_id']}").status_code == 204


def test_the_cli_adds_under_the_cap_and_lists_every_page(tmp_path) -> None:
    data_dir = short_dir("tfb-")
    try:
        settings = Settings(data_dir=data_dir)
        upgrade_url(settings.database_url)
        many = schedules.MAX_PAGE + 5
        with session_factory(make_engine(settings.database_url))() as session:
            for _ in range(many):
                step = {"id": "w", "tool": "sleep", "args": {"seconds": 0}}
                schedules.create(
                    session,
                    plan={"name": "many", "steps": [step]},
                    inputs={},
                    cron=YEARLY,
                    timezone="UTC",
                    catchup="skip",
                    now=time.time(),  # noqa: TID251 - ticks are wall-clock seconds
                    max_schedules=many,
                )
        cli = [sys.executable, "-m", "tiffany", "schedule"]
        where = ["--data-dir", str(data_dir)]
        shown = subprocess.run(
            [*cli, "list", "--json", *where],
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(),
        )
        assert shown.returncode == 0, shown.stderr
        ids = [json.loads(line)["schedule_id"] for line in shown.stdout.splitlines()]
        assert len(ids) == len(set(ids)) == many
        plan = tmp_path / "p.json"
        plan.write_text(json.dumps(_body()["plan"]))
        env = {"TIFFANY_MAX_SCHEDULES": str(many)}
        added = subprocess.run(
            [*cli, "add", str(plan), "--cron", YEARLY, *where],
            capture_output=True,
            text=True,
            timeout=120,
            env={**clean_env(), **env},
        )
        assert added.returncode == 1, added.stdout
        assert "TIFFANY_MAX_SCHEDULES" in added.stderr
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
