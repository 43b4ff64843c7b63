"""Schedules of plans: cron, time zone, catch-up policy; each tick starts one run.

The rows live in the store (``schedules``): the API and the CLI write them,
engine 0 fires their ticks (``tiffany/schedules/runner.py``). A schedule's
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

Invariants:

* A tick is a function of the row: croniter's ``R`` (a random value,
  drawn again each time the expression is read) and ``H`` (a hash of an
  id croniter is not given) are refused (:func:`check`), and a row that
  holds one anyway (stored by an older version) has no ticks: it fails
  alone, its ``last_error`` says why. A schedule read twice fired twice:
  ``R * * * *`` once a minute fired 35 times in 125 s, each poll drawing
  its minute anew.
* Every add, pause and resume takes the next seq of ``schedule_clock``
  (its row's lock orders the seqs as the commits) as the row's ``version``:
  the runner reads the rows changed since the last seq it saw
  (:func:`changed_since`), never every row. A delete takes none: the runner
  finds the row gone when its next tick comes.
* At most ``max_schedules`` rows (``TIFFANY_MAX_SCHEDULES``): an add beyond
  is :class:`TooManySchedules`, counted under the clock's lock.

Rejected: pinning ``H`` with the schedule's id (Jenkins' rule). It spreads
load, but a schedule's time would then depend on an id the user never chose
and a copy of the schedule would fire at another minute; writing the
minute is as short and says what happens.
"""

from __future__ import annotations

import copy
import functools
import math
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from tiffany.errors import TiffanyError
from tiffany.store.models import Schedule, ScheduleClock

__all__ = [
    "CATCHUP",
    "DEFAULT_PAGE",
    "MAX_CATCHUP_TICKS",
    "MAX_PAGE",
    "BadCursor",
    "Timing",
    "TooManySchedules",
    "changed_since",
    "check",
    "create",
    "fired",
    "get",
    "last_ticks",
    "list_schedules",
    "next_tick",
    "next_ticks",
    "remove",
    "repeats",
    "schedule_dict",
    "set_paused",
    "ticks",
    "timing",
]

#: What happens to ticks missed while no engine fired them.
CATCHUP: Final = ("skip", "one", "all")
#: Most missed ticks ``all`` catches up at once.
MAX_CATCHUP_TICKS: Final = 1_000
#: Cron expressions kept parsed (most schedules share a few expressions).
CRON_CACHE: Final = 4_096
#: Schedules a page of ``GET /api/schedules`` holds unless ``limit`` says fewer.
DEFAULT_PAGE: Final = 100
#: Most schedules a page may hold (``limit`` above it is a 422).
MAX_PAGE: Final = 1_000
#: Upcoming ticks a schedule's answer lists (``next_ticks``): what the dashboard shows.
NEXT_TICKS: Final = 5


@dataclass(frozen=True, slots=True)
class Timing:
    """What the runner needs to know of a row to say when it ticks (not its plan).

    Its fields are :data:`TIMING`'s columns, in that order.
    """

    id: str
    cron: str
    timezone: str
    catchup: str
    paused: bool
    created_at: float
    last_tick: float | None
    version: int


#: The columns of a :class:`Timing`, in its fields' order.
TIMING: Final = (
    Schedule.id,
    Schedule.cron,
    Schedule.timezone,
    Schedule.catchup,
    Schedule.paused,
    Schedule.created_at,
    Schedule.last_tick,
    Schedule.version,
)

#: croniter's ``R`` (random) and ``H`` (hashed) in a field: a letter alone, not in a name (THU).
_MOVING: Final = re.compile(r"(?<![A-Za-z])[RrHh](?![A-Za-z])")


class TooManySchedules(TiffanyError):
    """There are ``max_schedules`` schedules already (HTTP 429)."""

    code = "schedule.too_many"
    http_status = 429


class BadCursor(TiffanyError):
    """An ``after`` cursor no page gave."""

    code = "request.invalid"


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
    moving = _moving(cron)
    if moving is not None:
        return moving
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


def _moving(cron: str) -> str | None:
    """Why ``cron``'s ticks would move from one look to the next (``R``, ``H``), or None."""
    for name, part in zip(_CRON_FIELDS, cron.split(), strict=False):
        found = _MOVING.search(part)
        if found is None:
            continue
        if found.group().upper() == "R":
            why = "'R' (random) is drawn again at every look, so the tick would move"
        else:
            why = "'H' (hashed) is not supported"
        return f"{name} {part!r}: {why}; write the {name} it should fire at"
    return None


def _fixed(cron: str) -> None:
    """Raise ValueError if ``cron`` has no fixed ticks (:func:`_moving`): the row fails alone."""
    moving = _moving(cron)
    if moving is not None:
        raise ValueError(moving)


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


@functools.lru_cache(maxsize=CRON_CACHE)
def _parsed(cron: str) -> croniter:
    """``cron`` parsed once (croniter's expansion is most of the cost of a look)."""
    return croniter(cron, 0.0)


def _iterator(cron: str, start: datetime) -> croniter:
    """A croniter of ``cron`` at ``start``: a copy of the parsed one (it moves as it is read)."""
    it = copy.copy(_parsed(cron))
    it.set_current(start, force=True)
    return it


def ticks(cron: str, timezone: str, after: float, until: float, limit: int) -> list[float]:
    """The schedule's ticks in ``(after, until]`` (epoch seconds), the first ``limit``.

    A cron expression whose dates never come ("0 0 30 2 *") has none: croniter
    gives up looking (``CroniterBadDateError``), and so do we, for that row only.
    A fixed-time expression has no tick in the second pass of a repeated hour
    (croniter gives one: the module docstring).
    """
    _fixed(cron)
    zone = ZoneInfo(timezone)
    once = not repeats(cron)
    it = _iterator(cron, datetime.fromtimestamp(after, zone))
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
    _fixed(cron)
    zone = ZoneInfo(timezone)
    once = not repeats(cron)
    it = _iterator(cron, datetime.fromtimestamp(math.floor(until) + 1, zone))
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


def next_tick(row: Schedule | Timing, now: float) -> float | None:
    """When ``row`` ticks next; None: never, or its settings are no longer valid.

    A row stored before a check (or by another version: another tzdata, another
    croniter) may name a zone or an expression refused here; it is listed
    with its ``last_error`` (the engine's), not a 500 for every schedule.
    """
    found = next_ticks(row, now, 1)
    return found[0] if found else None


def next_ticks(row: Schedule | Timing, now: float, limit: int = NEXT_TICKS) -> list[float]:
    """The next ``limit`` ticks of ``row`` (epoch seconds), as :func:`next_tick` finds the first.

    Empty when it never ticks again, or its settings are no longer valid.
    """
    after = max(row.last_tick or row.created_at, now)
    try:
        return ticks(row.cron, row.timezone, after, float("inf"), limit)
    except (CroniterError, ValueError, KeyError):  # KeyError: ZoneInfoNotFoundError
        return []


def schedule_dict(row: Schedule, now: float) -> dict[str, Any]:
    """A schedule as the API shows it (``next_tick``: when the next tick is due).

    ``next_ticks``: the next :data:`NEXT_TICKS` ticks (none while paused).
    """
    upcoming = [] if row.paused else next_ticks(row, now)
    return {
        "schedule_id": row.id,
        "name": row.name,
        "plan": row.plan,
        "workflow": row.workflow,
        "inputs": row.inputs,
        "cron": row.cron,
        "timezone": row.timezone,
        "catchup": row.catchup,
        "paused": row.paused,
        "created_at": row.created_at,
        "last_tick": row.last_tick,
        "last_run_id": row.last_run_id,
        "last_error": row.last_error,
        "next_tick": upcoming[0] if upcoming else None,
        "next_ticks": upcoming,
    }


def _transaction(session: Session) -> None:
    """Make what ``session`` does next one transaction, on an autocommit engine too.

    The API reads PostgreSQL through an autocommit engine
    (:func:`~tiffany.store.session.make_reader_engine`): there the clock's
    ``UPDATE`` committed at once, its lock released before the row was
    written, and a change with a smaller version could commit after a
    runner had read a larger one (and never be seen). Called first, before
    the session has a connection; the level goes back with the connection.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "READ COMMITTED"})


def _next_version(session: Session) -> int:
    """Take the clock's next seq in the caller's transaction (its row locked until commit)."""
    session.execute(
        update(ScheduleClock).where(ScheduleClock.id == 1).values(seq=ScheduleClock.seq + 1)
    )
    return int(session.scalars(select(ScheduleClock.seq).where(ScheduleClock.id == 1)).one())


def create(
    session: Session,
    *,
    plan: dict[str, Any] | None,
    inputs: dict[str, Any],
    cron: str,
    timezone: str,
    catchup: str,
    now: float,
    max_schedules: int,
    workflow: str | None = None,
) -> dict[str, Any]:
    """Add a schedule (its settings :func:`check`-ed by the caller); return it.

    ``workflow``: the registered ``@workflow`` each tick runs, instead of
    ``plan`` (None then): one of the two, as the caller checked.

    Raises:
        TooManySchedules: ``max_schedules`` exist already (counted after the
            clock's row is locked: two adds cannot both take the last place).
    """
    _transaction(session)
    version = _next_version(session)
    count = int(session.scalars(select(func.count()).select_from(Schedule)).one())
    if count >= max_schedules:
        session.rollback()
        raise TooManySchedules(
            f"there are {count} schedules, the most max_schedules "
            f"(TIFFANY_MAX_SCHEDULES) allows: delete one first",
            limit=max_schedules,
            setting="TIFFANY_MAX_SCHEDULES",
        )
    row = Schedule(
        id=f"sched-{uuid.uuid4().hex[:12]}",
        name=(workflow if workflow is not None else str((plan or {}).get("name") or "plan"))[:200],
        plan=plan,
        workflow=workflow,
        inputs=inputs,
        cron=cron,
        timezone=timezone,
        catchup=catchup,
        paused=False,
        created_at=now,
        version=version,
    )
    session.add(row)
    session.commit()
    return schedule_dict(row, now)


def list_schedules(
    session: Session, now: float, *, after: str | None = None, limit: int = DEFAULT_PAGE
) -> dict[str, Any]:
    """A page of schedules, oldest first: ``{"schedules", "next_after"}``.

    ``after``: the previous page's ``next_after`` (None: the first page), a
    cursor of the last row's creation time and id, so a row deleted
    meanwhile costs the next page nothing. ``next_after`` is None on the
    last page.

    Raises:
        BadCursor: ``after`` is no cursor a page gave.
    """
    stmt = select(Schedule).order_by(Schedule.created_at, Schedule.id)
    if after is not None:
        created, sid = _cursor(after)
        stmt = stmt.where(
            or_(
                Schedule.created_at > created,
                and_(Schedule.created_at == created, Schedule.id > sid),
            )
        )
    rows = list(session.scalars(stmt.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "schedules": [schedule_dict(r, now) for r in rows],
        "next_after": f"{rows[-1].created_at!r}:{rows[-1].id}" if more else None,
    }


def _cursor(after: str) -> tuple[float, str]:
    """The creation time and id an ``after`` cursor names."""
    created, _, sid = after.partition(":")
    try:
        at = float(created)
    except ValueError:
        at = math.nan
    if not sid or not math.isfinite(at):
        raise BadCursor(f"after: {after[:80]!r} is not a cursor a page gave (next_after)")
    return at, sid


def get(session: Session, schedule_id: str, now: float) -> dict[str, Any] | None:
    """One schedule, or None."""
    row = session.get(Schedule, schedule_id)
    return None if row is None else schedule_dict(row, now)


def set_paused(
    session: Session, schedule_id: str, paused: bool, now: float
) -> dict[str, Any] | None:
    """Pause or resume a schedule; None if unknown. Ticks due while paused follow ``catchup``.

    A change takes a new ``version`` (the runner sees it); pausing a paused
    schedule (or resuming an active one) changes nothing.
    """
    _transaction(session)
    row = session.get(Schedule, schedule_id)
    if row is None:
        return None
    if row.paused != paused:
        row.version = _next_version(session)
        row.paused = paused
    session.commit()
    return schedule_dict(row, now)


def remove(session: Session, schedule_id: str) -> bool:
    """Delete a schedule (its runs stay); False if unknown."""
    done = session.execute(delete(Schedule).where(Schedule.id == schedule_id))
    session.commit()
    return bool(done.rowcount)  # type: ignore[attr-defined]


def changed_since(session: Session, version: int | None) -> list[Timing]:
    """The rows added, paused or resumed after ``version``, oldest change first.

    ``version`` None reads every row (a runner's first look). Otherwise an
    index range scan: nothing changed, nothing read.
    """
    stmt = select(*TIMING)
    if version is not None:
        stmt = stmt.where(Schedule.version > version).order_by(Schedule.version)
    return [Timing(*row) for row in session.execute(stmt)]


def timing(session: Session, schedule_id: str) -> Timing | None:
    """One row's :class:`Timing`, or None if it was deleted."""
    row = session.execute(select(*TIMING).where(Schedule.id == schedule_id)).first()
    return None if row is None else Timing(*row)


def fired(
    session: Session, schedule_id: str, tick: float, run_id: str | None, error: str | None
) -> None:
    """Record that ``tick`` is done: its run started (``run_id``), skipped, or failed."""
    values: dict[str, Any] = {"last_tick": tick, "last_error": error}
    if run_id is not None:
        values["last_run_id"] = run_id
    session.execute(update(Schedule).where(Schedule.id == schedule_id).values(**values))
    session.commit()
