"""Schedules, as users run them: ``tiffany serve``, ticks every second, kill -9, pause.

Each tick of a schedule starts exactly one run whose entry names the tick:
across an engine killed -9 (no tick twice; ``skip`` leaves out those missed
while it was down), and across a pause (``all`` catches every missed tick
up, ``skip`` none).
"""

from __future__ import annotations

import calendar
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
from api_support import serve, short_dir, submit_plan
from process_support import terminate, wait_for
from sqlalchemy import update

from tiffany.schedules import store as schedules
from tiffany.schedules.store import MAX_CATCHUP_TICKS
from tiffany.store import make_engine, session_factory
from tiffany.store.models import Schedule


def _plan(name: str) -> dict[str, Any]:
    step = {"id": "w", "tool": "file.write", "args": {"path": "t.txt", "content": "x"}}
    return {"name": name, "steps": [step]}


def _add(url: str, name: str, catchup: str) -> str:
    body = {"plan": _plan(name), "cron": "* * * * * *", "catchup": catchup}
    r = httpx.post(f"{url}/api/schedules", json=body, timeout=30)
    assert r.status_code == 201, r.text
    return str(r.json()["schedule_id"])


def _ticks(url: str, name: str) -> list[str]:
    """The ticks of the runs of plan ``name`` (each run's entry names its tick)."""
    runs = httpx.get(f"{url}/api/runs", params={"limit": 500}, timeout=30).json()["runs"]
    ticks = []
    for r in runs:
        if r["name"] == name:
            detail = httpx.get(f"{url}/api/runs/{r['run_id']}", timeout=30).json()
            ticks.append(detail["entry"]["schedule"]["tick"])
    return sorted(ticks)


def _seconds(ticks: list[str]) -> list[int]:
    return [calendar.timegm(time.strptime(t, "%Y-%m-%dT%H:%M:%SZ")) for t in ticks]


def test_ticks_start_one_run_each_across_a_kill_9(served) -> None:
    data_dir, url = served
    sid = _add(url, "every-second", "skip")
    caught = _add(url, "caught-up", "all")
    wait_for(lambda: len(_ticks(url, "every-second")) >= 2, 30, "two ticks")
    before = json.loads((data_dir / "serve.json").read_text())["engine_pid"]
    os.kill(before, signal.SIGKILL)
    wait_for(
        lambda: json.loads((data_dir / "serve.json").read_text())["engine_pid"] != before,
        30,
        "serve to restart the engine",
    )
    count = len(_ticks(url, "every-second"))
    wait_for(lambda: len(_ticks(url, "every-second")) >= count + 2, 30, "ticks after restart")
    for s in (sid, caught):
        assert httpx.delete(f"{url}/api/schedules/{s}").status_code == 204
    ticks = _ticks(url, "every-second")
    assert len(ticks) == len(set(ticks)), ticks  # no tick started two runs
    seconds = _seconds(ticks)
    assert all(b > a for a, b in itertools.pairwise(seconds))
    # "all": the ticks missed while the engine was down ran after its restart.
    every = _seconds(_ticks(url, "caught-up"))
    assert len(every) == len(set(every))
    assert every == list(range(every[0], every[-1] + 1)), every
    schedule = httpx.get(f"{url}/api/schedules/{sid}")
    assert schedule.status_code == 404


def test_after_a_pause_all_catches_up_every_tick_and_skip_none(served) -> None:
    _, url = served
    every = _add(url, "catch-all", "all")
    none = _add(url, "catch-none", "skip")
    wait_for(lambda: len(_ticks(url, "catch-none")) >= 1, 30, "a first tick")
    for sid in (every, none):
        r = httpx.post(f"{url}/api/schedules/{sid}/pause")
        assert (r.status_code, r.json()["paused"]) == (200, True)
    paused_at = time.time()  # noqa: TID251 - ticks are wall-clock seconds
    time.sleep(3.5)
    for sid in (every, none):
        assert httpx.post(f"{url}/api/schedules/{sid}/resume").json()["paused"] is False
    time.sleep(1.5)
    for sid in (every, none):
        httpx.post(f"{url}/api/schedules/{sid}/pause")
    all_ticks, skip_ticks = _seconds(_ticks(url, "catch-all")), _seconds(_ticks(url, "catch-none"))
    # "all": every second from its first tick to its last has its run, the paused ones too.
    assert all_ticks == list(range(all_ticks[0], all_ticks[-1] + 1)), all_ticks
    assert all_ticks[-1] - all_ticks[0] >= 4
    # "skip": the seconds of the pause (but the last, fresh at resume) started nothing.
    missed = [t for t in range(int(paused_at) + 1, int(paused_at) + 3) if t not in skip_ticks]
    assert missed, (paused_at, skip_ticks)
    listed = httpx.get(f"{url}/api/schedules").json()["schedules"]
    assert {s["schedule_id"] for s in listed} == {every, none}
    assert all(s["last_run_id"] for s in listed)


def test_bad_schedules_are_refused_naming_the_field(served) -> None:
    _, url = served
    base = {"plan": _plan("x"), "cron": "* * * * *"}
    for field, value in (("cron", "61 * * * *"), ("timezone", "Mars/Olympus"), ("catchup", "x")):
        r = httpx.post(f"{url}/api/schedules", json={**base, field: value})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", field]
    # A cron expression's problem names its field.
    for cron, says in (
        ("61 * * * *", "minute '61': out of range"),
        ("* 25 * * *", "hour '25': out of range"),
        ("* * * * 9", "weekday '9': out of range"),
        ("* * * *", "4 fields"),
        ("0 0 30 2 *", "no date ever matches it"),  # February 30: each field alone is fine
    ):
        r = httpx.post(f"{url}/api/schedules", json={**base, "cron": cron})
        assert r.status_code == 422, r.text
        assert says in r.json()["detail"][0]["msg"], r.text
    bad_plan = {**base, "plan": {"name": "x", "steps": [{"id": "a", "tool": "nope"}]}}
    r = httpx.post(f"{url}/api/schedules", json=bad_plan)
    assert (r.status_code, r.json()["detail"][0]["loc"]) == (422, ["steps", 0, "tool"])
    assert httpx.get(f"{url}/api/schedules").json() == {"schedules": [], "next_after": None}
    assert httpx.post(f"{url}/api/schedules/nope/pause").status_code == 404
    assert httpx.delete(f"{url}/api/schedules/nope").status_code == 404


def test_a_stored_schedule_that_never_fires_stops_neither_the_others_nor_the_listing(
    served,
) -> None:
    # "0 0 30 2 *" (February 30) was taken, and then croniter's "failed to find
    # next date" failed every poll of the engine (the schedules after it never
    # fired, those before it late), every GET /api/schedules (500) and `tiffany
    # schedule list` (a traceback). A row stored before it was refused at the door:
    data_dir, url = served
    with session_factory(make_engine(f"sqlite:///{data_dir / 'tiffany.db'}"))() as session:
        session.add(
            Schedule(
                id="sched-feb30",
                name="never",
                plan=_plan("never"),
                inputs={},
                cron="0 0 30 2 *",
                timezone="UTC",
                catchup="skip",
                paused=False,
                created_at=time.time(),  # noqa: TID251 - ticks are wall-clock seconds
            )
        )
        session.commit()
    sid = _add(url, "after-the-bad-one", "skip")
    wait_for(lambda: len(_ticks(url, "after-the-bad-one")) >= 2, 30, "two ticks")
    listed = httpx.get(f"{url}/api/schedules")
    assert listed.status_code == 200, listed.text
    never = {s["schedule_id"]: s for s in listed.json()["schedules"]}["sched-feb30"]
    assert (never["next_tick"], never["last_run_id"]) == (None, None)
    cli = [sys.executable, "-m", "tiffany", "schedule", "list", "--data-dir", str(data_dir)]
    shown = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "sched-feb30" in shown.stdout
    assert sid in shown.stdout


def test_after_weeks_down_one_fires_one_tick_and_all_the_last_thousand(tmp_path) -> None:
    # Ticks missed were taken from the first MAX_CATCHUP_TICKS after the last
    # one: 1,500 hourly ticks missed, "one" fired a tick of the first 1,000
    # hours and, a poll later, the last (two runs); "all" fired all 1,500.
    data_dir = short_dir("tfs-")
    now = time.time()  # noqa: TID251 - ticks are wall-clock seconds
    minute = (int(now // 60) - 30) % 60  # half an hour from now either way: no tick meanwhile
    last = (now // 3600) * 3600 + minute * 60  # the newest tick
    last = last - 3600 if last > now else last
    try:
        for name, catchup in (("weeks-one", "one"), ("weeks-all", "all")):
            plan = tmp_path / f"{name}.json"
            plan.write_text(json.dumps(_plan(name)))
            cron = ["--cron", f"{minute} * * * *", "--catchup", catchup]
            cli = [sys.executable, "-m", "tiffany", "schedule", "add", str(plan), *cron]
            added = subprocess.run(
                [*cli, "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60
            )
            assert added.returncode == 0, added.stderr
        store = make_engine(f"sqlite:///{data_dir / 'tiffany.db'}")
        with session_factory(store)() as session:  # as if added 1,500 hours ago, and not served
            session.execute(update(Schedule).values(created_at=last - 1_500 * 3600 + 1))
            session.commit()
        proc, url = serve(data_dir)
        try:

            def caught_up() -> bool:
                listed = httpx.get(f"{url}/api/schedules", timeout=30).json()["schedules"]
                return all(s["last_tick"] == last for s in listed)

            wait_for(caught_up, 120, "both schedules to fire their last tick")
            seq = submit_plan(url, _plan("after"))["seq"]  # the store holds what came before
            counts = {}
            for name in ("weeks-one", "weeks-all"):
                counts[name] = sum(page_of(url, name, seq)["counts"].values())
            assert counts == {"weeks-one": 1, "weeks-all": MAX_CATCHUP_TICKS}, counts
            (one,) = page_of(url, "weeks-one", seq)["runs"]
            tick = httpx.get(f"{url}/api/runs/{one['run_id']}", timeout=30).json()["entry"]
            assert _seconds([tick["schedule"]["tick"]]) == [int(last)]
        finally:
            terminate(proc)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def page_of(url: str, name: str, min_seq: int) -> dict[str, Any]:
    """The newest runs of plan ``name`` and their counts, as of ``min_seq``."""
    params: dict[str, Any] = {"name": name, "min_seq": min_seq, "limit": 5}
    page: dict[str, Any] = httpx.get(f"{url}/api/runs", params=params, timeout=30).json()
    return page


def test_a_row_that_fails_fails_alone_with_its_error_logged_once(served) -> None:
    # A row whose time zone (or cron expression) no longer loads, say stored by
    # another version with another tzdata, made every poll of the engine fail:
    # no schedule fired, ever, the log said "schedules.failed" with a traceback
    # at every backoff, and GET /api/schedules answered 500.
    data_dir, url = served
    kinds = {"mars": ("* * * * * *", "Mars/Olympus"), "61": ("61 * * * *", "UTC")}
    bad = {}
    with session_factory(make_engine(f"sqlite:///{data_dir / 'tiffany.db'}"))() as session:
        for kind, (cron, zone) in kinds.items():  # through the store, its check left out
            row = schedules.create(
                session,
                plan=_plan(kind),
                inputs={},
                cron=cron,
                timezone=zone,
                catchup="skip",
                now=time.time() - 3600,  # noqa: TID251 - ticks are wall-clock seconds
                max_schedules=100,
            )
            bad[kind] = row["schedule_id"]
    sid = _add(url, "beside-the-bad-ones", "skip")
    wait_for(lambda: len(_ticks(url, "beside-the-bad-ones")) >= 3, 30, "three ticks")
    listed = httpx.get(f"{url}/api/schedules")
    assert listed.status_code == 200, listed.text
    by_id = {s["schedule_id"]: s for s in listed.json()["schedules"]}
    assert by_id[sid]["last_error"] is None
    assert "timezone: unknown time zone 'Mars/Olympus'" in by_id[bad["mars"]]["last_error"]
    assert "cron: not a cron expression (minute '61'" in by_id[bad["61"]]["last_error"]
    for b in bad.values():
        assert (by_id[b]["next_tick"], by_id[b]["last_run_id"]) == (None, None)
    # Three ticks are several retries of each bad row: each was logged once, no look failed.
    events = [
        json.loads(line)
        for line in (data_dir / "serve.log").read_text().splitlines()
        if line.startswith("{")
    ]
    failed = [e for e in events if e.get("event") == "schedules.row_failed"]
    assert sorted(e["schedule"] for e in failed) == sorted(bad.values()), failed
    assert not [e for e in events if e.get("event") == "schedules.failed"]
    cli = [sys.executable, "-m", "tiffany", "schedule", "list", "--data-dir", str(data_dir)]
    shown = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert bad["mars"] in shown.stdout
