"""Schedules of plans: cron, time zone, catch-up policy; each tick starts one run.

The rows live in the store (``schedules``): the API and the CLI write them,
engine 0 fires their ticks (``tiffany/engine/schedules.py``). A schedule's
``cron`` has five fields (minute hour day-of-month month day-of-week) or six
(and the second, last: ``* * * * * */10`` every ten seconds), evaluated in
its IANA ``timezone``, daylight-saving changes included, as Vixie cron does:

* spring forward: a tick in the skipped hour fires once, when the clocks
  have moved on (a 02:30 tick fires at 03:00);
* fall back: a fixed-time schedule (minute and hour fields without ``*`` or
  a ``/`` step: ``30 2 * * *``, ``0 1-3 * * *``) fires once in the repeated
  hour, the first time (02:30 summer time, not again at 02:30 winter time);
  one with ``*`` or a step in its minute or hour field (``*/15 * * * *``,
  ``0 * * * *``, ``*/30 2 * * *``) is periodic and fires in both, an hour of
  real time apart (:func:`repeats`).

``catchup`` says what happens to ticks
missed while no engine fired them (it was down, or the schedule paused):
``skip`` them, run ``one`` (the last) or ``all`` (the last
:data:`MAX_CATCHUP_TICKS` of them).
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from tiffany.store.models import Schedule

__all__ = [
    "CATCHUP",
    "MAX_CATCHUP_TICKS",
    "check",
    "create",
    "fired",
    "get",
    "last_ticks",
    "list_schedules",
    "remove",
    "repeats",
    "schedule_dict",
    "set_paused",
    "ticks",
]

#: What happens to ticks missed while no engine fired them.
CATCHUP: Final = ("skip", "one", "all")
#: Most missed ticks ``all`` catches up at once.
MAX_CATCHUP_TICKS: Final = 1_000


def check(cron: Any, timezone: Any, catchup: Any) -> list[dict[str, str]]:
    """Every problem of a schedule's settings, ``[{"loc", "msg"}]`` (empty: valid)."""
    errors = []
    why = _cron_problem(cron)
    if why is not None:
        errors.append(
            {
                "loc": "cron",
                "msg": f"not a cron expression ({why}): five fields (minute hour day month "
                "weekday) or six (and seconds)",
            }
        )
    try:
        ZoneInfo(timezone if isinstance(timezone, str) else "")
    except (ZoneInfoNotFoundError, ValueError):
        errors.append({"loc": "timezone", "msg": f"unknown time zone {timezone!r}"})
    if catchup not in CATCHUP:
        errors.append({"loc": "catchup", "msg": f"must be one of {', '.join(CATCHUP)}"})
    return errors


def _cron_problem(cron: Any) -> str | None:
    """What is wrong with ``cron`` (croniter's reason, or the field count), or None."""
    if not isinstance(cron, str):
        return f"a {type(cron).__name__}, not text"
    fields = len(cron.split())
    if fields not in (5, 6):
        return f"{fields} fields"
    reason = _croniter_refuses(cron)
    if reason is None:
        # Each field may be fine and their dates none ("0 0 30 2 *": February 30).
        return None if ticks(cron, "UTC", 0.0, float("inf"), 1) else "no date ever matches it"
    # croniter names no field: find the first that is refused with the others "*".
    parts = cron.split()
    for i, part in enumerate(parts):
        alone = " ".join(part if j == i else "*" for j in range(len(parts)))
        refused = _croniter_refuses(alone)
        if refused is not None:
            return f"{_CRON_FIELDS[i]} {part!r}: {refused}"
    return reason


#: The fields of a cron expression, in order (croniter's sixth is the second).
_CRON_FIELDS: Final = ("minute", "hour", "day", "month", "weekday", "second")


def _croniter_refuses(cron: str) -> str | None:
    """The reason croniter refuses ``cron`` for (None: it takes it)."""
    try:
        croniter(cron)
    except (CroniterError, ValueError, KeyError) as exc:
        # "[61 * * * *] is not acceptable, out of range": the part after the expression.
        reason = str(exc).split("] ", 1)[-1].removeprefix("is not acceptable, ")
        return reason[:200] if reason and reason != "is not acceptable" else "not acceptable"
    return None


def repeats(cron: str) -> bool:
    """True if ``cron`` fires in both passes of a repeated (fall-back) hour.

    Vixie cron's rule: a job with a ``*`` (a step ``*/15`` included) in its
    minute or hour field is periodic; the others are fixed-time jobs, run
    once. A step over a range (``0-59/15``) is periodic here too.
    """
    minute, hour = cron.split()[:2]
    return any(c in field for field in (minute, hour) for c in "*/")


def _again(tick: float, zone: ZoneInfo) -> bool:
    """True if ``tick``'s wall-clock time in ``zone`` came once already (the fall-back pass)."""
    return datetime.fromtimestamp(tick, zone).fold == 1


def ticks(cron: str, timezone: str, after: float, until: float, limit: int) -> list[float]:
    """The schedule's ticks in ``(after, until]`` (epoch seconds), the first ``limit``.

    A cron expression whose dates never come ("0 0 30 2 *") has none: croniter
    gives up looking (``CroniterBadDateError``), and so do we, for that row only.
    A fixed-time expression has no tick in the second pass of a repeated hour
    (croniter gives one: the module docstring).
    """
    zone = ZoneInfo(timezone)
    once = not repeats(cron)
    it = croniter(cron, datetime.fromtimestamp(after, zone))
    out: list[float] = []
    while len(out) < limit:
        try:
            tick = float(it.get_next(float))
        except CroniterBadDateError:
            break
        if tick > until:
            break
        if once and _again(tick, zone):
            continue
        out.append(tick)
    return out


def last_ticks(cron: str, timezone: str, after: float, until: float, limit: int) -> list[float]:
    """The schedule's ticks in ``(after, until]`` (epoch seconds), the last ``limit``, oldest first.

    Walked back from ``until``: what a schedule missed over a weekend costs
    its last ``limit`` ticks, not every tick since (croniter's ``get_prev``
    leaves out where it starts: it starts at the next whole second).
    """
    zone = ZoneInfo(timezone)
    once = not repeats(cron)
    it = croniter(cron, datetime.fromtimestamp(math.floor(until) + 1, zone))
    out: list[float] = []
    while len(out) < limit:
        try:
            tick = float(it.get_prev(float))
        except CroniterBadDateError:
            break
        if tick <= after:
            break
        if tick <= until and not (once and _again(tick, zone)):
            out.append(tick)
    out.reverse()
    return out


def _next(row: Schedule, now: float) -> float | None:
    """When ``row`` ticks next; None: never, or its settings are no longer valid.

    A row stored before a check (or by another version: another tzdata, another
    croniter) may name a zone or an expression refused here; it is listed
    with its ``last_error`` (the engine's), not a 500 for every schedule.
    """
    after = max(row.last_tick or row.created_at, now)
    try:
        found = ticks(row.cron, row.timezone, after, float("inf"), 1)
    except (CroniterError, ValueError, KeyError):  # KeyError: ZoneInfoNotFoundError
        return None
    return found[0] if found else None


def schedule_dict(row: Schedule, now: float) -> dict[str, Any]:
    """A schedule as the API shows it (``next_tick``: when the next tick is due)."""
    return {
        "schedule_id": row.id,
        "name": row.name,
        "plan": row.plan,
        "inputs": row.inputs,
        "cron": row.cron,
        "timezone": row.timezone,
        "catchup": row.catchup,
        "paused": row.paused,
        "created_at": row.created_at,
        "last_tick": row.last_tick,
        "last_run_id": row.last_run_id,
        "last_error": row.last_error,
        "next_tick": None if row.paused else _next(row, now),
    }


def create(
    session: Session,
    *,
    plan: dict[str, Any],
    inputs: dict[str, Any],
    cron: str,
    timezone: str,
    catchup: str,
    now: float,
) -> dict[str, Any]:
    """Add a schedule (its settings :func:`check`-ed by the caller); return it."""
    row = Schedule(
        id=f"sched-{uuid.uuid4().hex[:12]}",
        name=str(plan.get("name") or "plan")[:200],
        plan=plan,
        inputs=inputs,
        cron=cron,
        timezone=timezone,
        catchup=catchup,
        paused=False,
        created_at=now,
    )
    session.add(row)
    session.commit()
    return schedule_dict(row, now)


def list_schedules(session: Session, now: float) -> list[dict[str, Any]]:
    """Every schedule, oldest first."""
    rows = session.scalars(select(Schedule).order_by(Schedule.created_at, Schedule.id))
    return [schedule_dict(r, now) for r in rows]


def get(session: Session, schedule_id: str, now: float) -> dict[str, Any] | None:
    """One schedule, or None."""
    row = session.get(Schedule, schedule_id)
    return None if row is None else schedule_dict(row, now)


def set_paused(
    session: Session, schedule_id: str, paused: bool, now: float
) -> dict[str, Any] | None:
    """Pause or resume a schedule; None if unknown. Ticks due while paused follow ``catchup``."""
    row = session.get(Schedule, schedule_id)
    if row is None:
        return None
    row.paused = paused
    session.commit()
    return schedule_dict(row, now)


def remove(session: Session, schedule_id: str) -> bool:
    """Delete a schedule (its runs stay); False if unknown."""
    done = session.execute(delete(Schedule).where(Schedule.id == schedule_id))
    session.commit()
    return bool(done.rowcount)  # type: ignore[attr-defined]


def fired(
    session: Session, schedule_id: str, tick: float, run_id: str | None, error: str | None
) -> None:
    """Record that ``tick`` is done: its run started (``run_id``), skipped, or failed."""
    values: dict[str, Any] = {"last_tick": tick, "last_error": error}
    if run_id is not None:
        values["last_run_id"] = run_id
    session.execute(update(Schedule).where(Schedule.id == schedule_id).values(**values))
    session.commit()
