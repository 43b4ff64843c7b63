"""Engine 0 fires the schedules' ticks (the rows: ``tiffany/schedules/store.py``).

A thread of its own (SQL never on the loop) keeps a heap of when each
active schedule is next due, and sleeps until the earliest, or at most
:data:`CHANGE_CHECK_S`, when it asks the store for the rows added, paused
or resumed since it last asked (:func:`~tiffany.schedules.store.changed_since`:
an index range scan, empty when nothing changed). So an idle schedule
costs nothing between its ticks, however many there are: the runner's
idle cost is one small query every :data:`CHANGE_CHECK_S`. When a row
comes due, the runner reads it again (a delete or a pause it has not heard
of yet ends there), fires the ticks due since its ``last_tick`` (or its
creation; daylight-saving changes as the store's module says: one tick of
a fixed-time schedule in a repeated hour) by its ``catchup`` policy, and
puts it back at its next tick:

* ``skip``: the ticks that came due while no runner watched the schedule
  (the engine was down, the schedule paused) are skipped, with a warning
  naming the schedule and how many; a tick fires if it came due after the
  runner's previous look at the schedule, or at most :data:`SKIP_GRACE_S`
  before (see :func:`due`);
* ``one``: of the ticks missed (as for ``skip``), the last fires, the
  others are skipped;
* ``all``: every tick missed fires, oldest first: the last
  :data:`MAX_CATCHUP_TICKS` of them (the older ones are skipped).

A tick fires as a submission (of the row's plan, or of its ``@workflow`` by
name: the engine's ``Submit`` takes either) with the Idempotency-Key
``schedule:<id>:<tick>``, and its run's entry names the schedule and the
tick. ``last_tick`` moves once the run is durable: an engine killed between
the two fires the tick again after its restart, and the key makes that the
same run (the engine keeps keys across restarts: checkpoints hold them).
So each tick starts exactly one run, across restarts.

A row that fails (its time zone or cron expression no longer valid, a
submission that raised) fails alone: its ``last_error`` says why, the log
says so once per distinct failure (not every look), and the other
schedules fire on time. It is looked at again :data:`ROW_RETRY_S` later,
twice as late after each failure in a row, up to :data:`ROW_RETRY_MAX_S`.
Only the store's failures (and a busy or stopping engine) end a look, and
those are retried, the heap kept as it was.

Invariants:

* Changes made anywhere (the API, the CLI, another host on a PostgreSQL
  store) are seen within :data:`CHANGE_CHECK_S` (less than
  :data:`SKIP_GRACE_S`: the first tick of a schedule just added still
  fires), because every add, pause and resume takes a new ``version`` in
  commit order. A row written around the store's functions (raw SQL) is
  seen at the engine's next start.
* Every entry of the heap is at a time still to come once a look ends
  (or at its retry): the thread never spins.

Rejected: a poll of every row every 0.25 s, as this runner did: its cost
grew with the number of schedules, idle or not, taken from the engine's
loop by the GIL (``bench/schedules.py``). A PostgreSQL ``LISTEN`` for
changes: it would not cover SQLite, and the check is one indexed query
either way.

Only engine 0 runs this (``serve --engines N``: the other engines do not).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import structlog
import tenacity
from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from tiffany.errors import EngineNotReady, Refusal
from tiffany.projector.apply import is_transient
from tiffany.schedules.store import (
    MAX_CATCHUP_TICKS,
    Timing,
    changed_since,
    check,
    fired,
    last_ticks,
    ticks,
    timing,
)
from tiffany.store import make_engine, session_factory
from tiffany.store.models import Schedule

__all__ = [
    "BUSY_RETRY_S",
    "CHANGE_CHECK_S",
    "MAX_BACKOFF_S",
    "ROW_RETRY_MAX_S",
    "ROW_RETRY_S",
    "SKIP_GRACE_S",
    "ScheduleRunner",
    "due",
]

log = structlog.get_logger("tiffany.engine")

#: How often the runner asks the store for schedules added, paused or resumed, in seconds.
CHANGE_CHECK_S: Final = 0.5
#: The first wait after the store failed or the engine was busy, in seconds (then doubled).
BUSY_RETRY_S: Final = 0.25
#: The longest wait between looks while the store fails, in seconds.
MAX_BACKOFF_S: Final = 5.0
#: How late a tick of a ``skip`` schedule may still fire, in seconds.
SKIP_GRACE_S: Final = 1.0
#: When a row that failed on its own is looked at again, in seconds (doubled each time).
ROW_RETRY_S: Final = 0.25
#: The longest wait before a failing row is looked at again, in seconds.
ROW_RETRY_MAX_S: Final = 30.0
#: The row's backoff: tenacity's exponential wait, by failures in a row.
_ROW_BACKOFF: Final = tenacity.wait_exponential(multiplier=ROW_RETRY_S, max=ROW_RETRY_MAX_S)


def _row_retry_s(tries: int) -> float:
    """When a row that failed ``tries`` times in a row is looked at again, in seconds from now.

    A deadline in the runner's heap, not a sleep: the thread keeps firing
    the other schedules meanwhile, so only the wait strategy is tenacity's.
    """
    state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = tries
    return float(_ROW_BACKOFF(state))


#: ``submit(request)``: the engine's submission (the control op's handler).
Submit = Callable[[dict[str, Any]], dict[str, Any]]


def due(row: Timing, now: float, seen: float | None = None) -> tuple[list[float], list[float]]:
    """The ticks of ``row`` to fire now, and those to skip (the last is marked done).

    Of the ticks missed, the last :data:`MAX_CATCHUP_TICKS` are looked at: the
    newest (``one``), those of them a ``skip`` grace allows, or all of them
    (``all``: older ones are skipped, as the first fired moves ``last_tick``
    past them). Rejected: the first ones since ``last_tick``, which after
    a weekend down fired a tick of Saturday for ``one`` (then, a poll later,
    one of Sunday...), and ``all`` every tick of it, beyond the cap.

    ``seen``: when the runner last looked at the row (that look's ``now``),
    if it has watched it since, active, without a failure. A tick is late
    from then, not from ``now``: what came due while the runner was busy
    firing other ticks (many schedules due at once, a busy engine) was not
    missed, and fires late, for ``skip`` and ``one`` alike.

    Discussion: measured from ``now``, as it was, a poll that took longer
    than :data:`SKIP_GRACE_S` (250 schedules every second on a busy engine)
    made the ticks that came due meanwhile too old for the next poll: a
    sixth of them were skipped, with no word in the log, while the engine
    was up and the schedule active. Rejected: keep skipping them and say so
    (a warning, a "last skipped" column): a tick would still start no run
    for no reason a user can act on; "each tick starts exactly one run"
    holds for every tick the runner watched. Cost: a pause and resume both
    between two changes checks (:data:`CHANGE_CHECK_S`) is seen as one
    change: the row is looked at as if resumed then, and ``skip`` skips
    what came due more than :data:`SKIP_GRACE_S` before.
    """
    after = row.last_tick if row.last_tick is not None else row.created_at
    missed = last_ticks(row.cron, row.timezone, after, now, MAX_CATCHUP_TICKS)
    if not missed:
        return [], []
    if row.catchup == "all":
        return missed, []
    if seen is None and row.catchup == "one":
        return missed[-1:], missed[:-1]
    since = now if seen is None else min(seen, now)
    watched = [t for t in missed if since - t <= SKIP_GRACE_S]
    unwatched = [t for t in missed if since - t > SKIP_GRACE_S]
    if row.catchup == "one" and unwatched:
        return [unwatched[-1], *watched], unwatched[:-1]
    return watched, unwatched


def tick_iso(tick: float) -> str:
    """A tick as the key and the run's entry name it (UTC, to the second)."""
    return datetime.fromtimestamp(tick, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ScheduleRunner:
    """Fires due ticks through ``submit`` (see the module docstring)."""

    def __init__(self, database_url: str, submit: Submit) -> None:
        self._engine = make_engine(database_url)
        self._sessions = session_factory(self._engine)
        self._submit = submit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = 0
        #: Looks that failed in a row (the store down): they back off.
        self.failures = 0
        #: Schedules failing on their own, and why (logged when it changes).
        self.failing: dict[str, str] = {}
        #: When each watched schedule was last looked at: see :func:`due`.
        self.seen: dict[str, float] = {}
        #: Rows looked at (``due`` evaluated), for tests and the bench: not per check.
        self.looks = 0
        #: When each active schedule is next looked at; the heap's live entries.
        self._due: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        #: Rows read by the last changes check, looked at without reading them again.
        self._fresh: dict[str, Timing] = {}
        #: The newest ``version`` read (None: nothing yet, the first check reads every row).
        self._version: int | None = None
        #: Failures in a row of each failing schedule (its retry backs off).
        self._retries: dict[str, int] = {}
        #: ``(cron, timezone) -> (after, the first tick after it)``: see :meth:`_upcoming`.
        self._upcoming_memo: dict[tuple[str, str], tuple[float, float]] = {}

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name="tiffany-schedules", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop firing (a tick in flight finishes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._engine.dispose()

    def _run(self) -> None:
        # A store that fails (down, unreachable) is retried with exponential
        # backoff, one line a failure: retried at each check, a store down
        # for a minute logged 240 tracebacks.
        retrying = tenacity.Retrying(
            wait=tenacity.wait_exponential(multiplier=BUSY_RETRY_S, max=MAX_BACKOFF_S),
            retry=tenacity.retry_if_exception(
                lambda exc: not isinstance(exc, Refusal) and not self._stop.is_set()
            ),
            sleep=self._nap,
            before_sleep=self._failed,
            reraise=True,
        )
        wait = 0.0
        while not self._stop.wait(wait):
            try:
                retrying(self._poll)
            except Refusal as exc:  # the engine is stopping or busy: a little later
                log.info("schedules.later", reason=exc.message)
                wait = BUSY_RETRY_S
                continue
            except Exception as exc:  # noqa: BLE001 - the store still failing as the engine stops
                log.debug("schedules.stopped", error=repr(exc)[:500])
            wait = self._wait(time.time())  # noqa: TID251 - cron ticks are wall-clock times

    def _wait(self, now: float) -> float:
        """How long to sleep: until the earliest due row, or the next changes check."""
        while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # dropped or moved since it was pushed
        if not self._heap:
            return CHANGE_CHECK_S
        return min(CHANGE_CHECK_S, max(0.0, self._heap[0][0] - now))

    def _nap(self, seconds: float) -> None:
        self._stop.wait(seconds)  # a stop ends the wait (and the retries: see retry=)

    def _poll(self) -> None:
        self.step(time.time())  # noqa: TID251 - cron ticks are wall-clock times
        if self.failures:
            log.info("schedules.recovered", failures=self.failures)
            self.failures = 0

    def _failed(self, state: tenacity.RetryCallState) -> None:
        """Log a failed look in one line (a traceback only for what is not the database's)."""
        exc = state.outcome.exception() if state.outcome is not None else None
        self.failures += 1
        retry_in = state.next_action.sleep if state.next_action is not None else 0.0
        fields = {"error": repr(exc)[:500], "retry_in_s": round(retry_in, 3)}
        if exc is not None and is_transient(exc):
            log.warning("schedules.failed", **fields)
        else:
            log.error("schedules.failed", exc_info=exc, **fields)

    def step(self, now: float) -> int:
        """Read the changes, then fire what is due at ``now``; return how many runs started.

        Each row on its own (see the module docstring): what a row raises is
        that row's failure, but for the store's errors and the engine's
        Refusal (busy, stopping), which end the look (it backs off)
        and leave the row due.
        """
        started = 0
        with self._sessions() as session:
            self._changes(session, now)
            while self._heap and self._heap[0][0] <= now and not self._stop.is_set():
                at, sid = heapq.heappop(self._heap)
                if self._due.get(sid) != at:
                    continue  # dropped or moved since it was pushed
                del self._due[sid]
                try:
                    started += self._look(session, sid, now)
                except (Refusal, SQLAlchemyError, OSError):
                    self._push(sid, at)
                    raise
        return started

    def _changes(self, session: Session, now: float) -> None:
        """Read the rows added, paused or resumed since the last check (every row the first time).

        An active row is looked at now (a new one, or one resumed: its ticks
        missed while paused follow its ``catchup``); a paused one is dropped.
        """
        rows = changed_since(session, self._version)
        watching = self._version is not None
        self._version = max([self._version or 0, *(r.version for r in rows)])
        for row in rows:
            if row.paused:
                self._forget(row.id)
                continue
            if watching:  # paused and resumed since the last check, or new
                self.seen.pop(row.id, None)
            self._fresh[row.id] = row
            self._push(row.id, now)
        if len(self._heap) > 2 * len(self._due) + 64:  # mostly entries dropped or moved
            self._heap = [(at, sid) for sid, at in self._due.items()]
            heapq.heapify(self._heap)

    def _push(self, sid: str, at: float) -> None:
        self._due[sid] = at
        heapq.heappush(self._heap, (at, sid))

    def _forget(self, sid: str) -> None:
        """Stop watching ``sid`` (paused or deleted): its ticks until resumed are missed."""
        self._due.pop(sid, None)
        self._fresh.pop(sid, None)
        self.seen.pop(sid, None)
        self.failing.pop(sid, None)  # logged again if it fails again
        self._retries.pop(sid, None)

    def _look(self, session: Session, sid: str, now: float) -> int:
        """Fire what ``sid`` has due at ``now`` and put it back at its next tick."""
        row = self._fresh.pop(sid, None) or timing(session, sid)
        if row is None or row.paused:  # deleted or paused since the last check
            self._forget(sid)
            return 0
        self.looks += 1
        try:
            # The first tick since the last one fired: if it is still to come,
            # nothing is due and it is when to look again (one croniter step;
            # due() walks back from now, the cost of a look that fires).
            after = row.last_tick if row.last_tick is not None else row.created_at
            upcoming = self._upcoming(row, after)
            started = 0
            if upcoming is not None and upcoming <= now:
                started = self._row(session, row, now)
                upcoming = self._upcoming(row, now)
        except (Refusal, SQLAlchemyError, OSError):
            raise
        except Exception as exc:  # noqa: BLE001 - the row's own: its last_error, logged once
            session.rollback()
            self.seen.pop(sid, None)  # what comes due until it works is missed
            self._row_failed(session, row, exc)
            tries = self._retries[sid] = self._retries.get(sid, 0) + 1
            self._push(sid, now + _row_retry_s(tries))
            return 0
        self.seen[sid] = now
        self._retries.pop(sid, None)
        self._row_fine(session, row)
        if upcoming is not None:
            self._push(sid, upcoming)
        else:  # no date ever comes: looked at again if it changes
            self.seen.pop(sid, None)
        return started

    def _upcoming(self, row: Timing, after: float) -> float | None:
        """``row``'s first tick after ``after`` (None: none ever).

        Discussion: a runner's first look computes this for every row, and
        a croniter step is most of its cost (20,000 rows: seconds of the
        engine's CPU). Rows that share an expression and a time zone share
        the answer: if the first tick after ``a`` is ``n``, none comes in
        ``(a, n)``, so it is ``n`` for any ``after`` in ``[a, n)`` (the
        daylight-saving rule is ``ticks()``'s, the same for both). One
        entry per expression and zone, so at most one per schedule.
        """
        key = (row.cron, row.timezone)
        known = self._upcoming_memo.get(key)
        if known is not None and known[0] <= after < known[1]:
            return known[1]
        found = ticks(row.cron, row.timezone, after, math.inf, 1)
        if not found:
            return None
        self._upcoming_memo[key] = (after, found[0])
        return found[0]

    def _row(self, session: Session, row: Timing, now: float) -> int:
        """Fire the ticks of ``row`` due at ``now``; return how many runs started."""
        started = 0
        fire, skipped = due(row, now, self.seen.get(row.id))
        if skipped:
            log.warning(
                "schedules.skipped",
                schedule=row.id,
                catchup=row.catchup,
                skipped=len(skipped),
                first=tick_iso(skipped[0]),
                last=tick_iso(skipped[-1]),
            )
            if not fire:
                fired(session, row.id, skipped[-1], None, None)
        for tick in fire:
            if self._stop.is_set():
                break
            started += self._fire(session, row, tick)
        return started

    def _row_failed(self, session: Session, row: Timing, exc: Exception) -> None:
        """Record why ``row`` failed in its ``last_error``; log it if it is news."""
        problems = check(row.cron, row.timezone, row.catchup)
        if problems:  # stored before a check, or by another version (tzdata, croniter)
            error = "invalid schedule: " + "; ".join(f"{p['loc']}: {p['msg']}" for p in problems)
        else:
            error = f"{type(exc).__name__}: {exc}"
        error = error[:1000]
        if self.failing.get(row.id) == error:
            return  # logged and recorded already
        self.failing[row.id] = error
        fields = {"schedule": row.id, "error": error}
        if problems:
            log.warning("schedules.row_failed", **fields)
        else:  # a bug somewhere: its traceback, once
            log.error("schedules.row_failed", exc_info=exc, **fields)
        session.execute(update(Schedule).where(Schedule.id == row.id).values(last_error=error))
        session.commit()

    def _row_fine(self, session: Session, row: Timing) -> None:
        """``row`` worked again after failing: say so, and clear the error it left."""
        error = self.failing.pop(row.id, None)
        if error is None:
            return
        log.info("schedules.row_recovered", schedule=row.id)
        session.execute(
            update(Schedule)
            .where(Schedule.id == row.id, Schedule.last_error == error)
            .values(last_error=None)
        )
        session.commit()

    def _fire(self, session: Session, row: Timing, tick: float) -> int:
        at = tick_iso(tick)
        stored = session.execute(
            select(Schedule.plan, Schedule.workflow, Schedule.inputs).where(Schedule.id == row.id)
        ).first()
        if stored is None:
            return 0  # deleted meanwhile
        plan, workflow, inputs = stored
        # A workflow's schedule submits it by name, as POST /api/runs does (no plan).
        what = {"workflow": workflow} if workflow is not None else {"plan": plan}
        request = {
            **what,
            "inputs": inputs or {},
            "key": f"schedule:{row.id}:{at}",
            "schedule": {"id": row.id, "tick": at},
        }
        try:
            answer = self._submit(request)
        except Refusal as exc:
            if isinstance(exc, EngineNotReady):
                raise
            fired(session, row.id, tick, None, f"{exc.kind}: {exc.message}")
            log.warning("schedules.tick_refused", schedule=row.id, tick=at, error=exc.message)
            return 0
        fired(session, row.id, tick, str(answer["run_id"]), None)
        self.fired += 1
        log.info("schedules.tick", schedule=row.id, tick=at, run_id=answer["run_id"])
        return 1
