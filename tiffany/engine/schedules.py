"""Engine 0 fires the schedules' ticks (the rows: ``tiffany/store/schedules.py``).

A thread of its own (SQL never on the loop) looks at the schedules every
:data:`POLL_S`: for each active one, the ticks due since its ``last_tick``
(or its creation; daylight-saving changes as the store's module says:
one tick of a fixed-time schedule in a repeated hour), by its ``catchup``
policy:

* ``skip``: the ticks that came due while no runner watched the schedule
  (the engine was down, the schedule paused) are skipped, with a warning
  naming the schedule and how many; a tick fires if it came due after the
  runner's previous look at the schedule, or at most :data:`SKIP_GRACE_S`
  before (see :func:`due`);
* ``one``: of the ticks missed (as for ``skip``), the last fires, the
  others are skipped;
* ``all``: every tick missed fires, oldest first: the last
  :data:`MAX_CATCHUP_TICKS` of them (the older ones are skipped).

A tick fires as a submission with the Idempotency-Key
``schedule:<id>:<tick>``, and its run's entry names the schedule and the
tick. ``last_tick`` moves once the run is durable: an engine killed between
the two fires the tick again after its restart, and the key makes that the
same run (the engine keeps keys across restarts: checkpoints hold them).
So each tick starts exactly one run, across restarts.

A row that fails (its time zone or cron expression no longer valid, a
submission that raised) fails alone: its ``last_error`` says why, the log
says so once per distinct failure (not every poll), and the other
schedules fire on time. Its ticks are tried again at each poll (not marked
done). Only the store's failures (and a busy or stopping engine) end a
poll, and those are retried for every row.

Only engine 0 runs this (``serve --engines N``: the other engines do not).
"""

from __future__ import annotations

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

from tiffany.control import ControlError
from tiffany.store import make_engine, session_factory
from tiffany.store.models import Schedule
from tiffany.store.projector import is_transient
from tiffany.store.schedules import MAX_CATCHUP_TICKS, check, fired, last_ticks

__all__ = ["MAX_BACKOFF_S", "POLL_S", "SKIP_GRACE_S", "ScheduleRunner", "due"]

log = structlog.get_logger("tiffany.engine")

#: How often the schedules are looked at, in seconds.
POLL_S: Final = 0.25
#: The longest wait between polls while the store fails, in seconds.
MAX_BACKOFF_S: Final = 5.0
#: How late a tick of a ``skip`` schedule may still fire, in seconds (a few polls).
SKIP_GRACE_S: Final = 1.0

#: ``submit(request)``: the engine's submission (the control op's handler).
Submit = Callable[[dict[str, Any]], dict[str, Any]]


def due(row: Schedule, now: float, seen: float | None = None) -> tuple[list[float], list[float]]:
    """The ticks of ``row`` to fire now, and those to skip (the last is marked done).

    Of the ticks missed, the last :data:`MAX_CATCHUP_TICKS` are looked at: the
    newest (``one``), those of them a ``skip`` grace allows, or all of them
    (``all``: older ones are skipped, as the first fired moves ``last_tick``
    past them). Rejected: the first ones since ``last_tick``, which after
    a weekend down fired a tick of Saturday for ``one`` (then, a poll later,
    one of Sunday...), and ``all`` every tick of it, beyond the cap.

    ``seen``: when the runner last looked at the row (a poll's ``now``), if
    it has watched it since, active, without a failure. A tick is late from
    then, not from ``now``: what came due while the runner was busy firing
    other ticks (a poll of many schedules, a busy engine) was not missed,
    and fires late, for ``skip`` and ``one`` alike.

    Discussion: measured from ``now``, as it was, a poll that took longer
    than :data:`SKIP_GRACE_S` (250 schedules every second on a busy engine)
    made the ticks that came due meanwhile too old for the next poll: a
    sixth of them were skipped, with no word in the log, while the engine
    was up and the schedule active. Rejected: keep skipping them and say so
    (a warning, a "last skipped" column): a tick would still start no run
    for no reason a user can act on; "each tick starts exactly one run"
    holds for every tick the runner watched. Cost: a pause and resume both
    between two looks at a row (a quarter second apart, or one long poll)
    is not seen, so the ticks of that pause fire.
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
        #: Polls that failed in a row (the store down): they back off.
        self.failures = 0
        #: Schedules failing on their own, and why (logged when it changes).
        self.failing: dict[str, str] = {}
        #: When each active schedule was last looked at (a poll's ``now``): see :func:`due`.
        self.seen: dict[str, float] = {}

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
        # backoff, one line a failure: polled every POLL_S, a store down for
        # a minute logged 240 tracebacks.
        retrying = tenacity.Retrying(
            wait=tenacity.wait_exponential(multiplier=POLL_S, max=MAX_BACKOFF_S),
            retry=tenacity.retry_if_exception(
                lambda exc: not isinstance(exc, ControlError) and not self._stop.is_set()
            ),
            sleep=self._nap,
            before_sleep=self._failed,
            reraise=True,
        )
        while not self._stop.wait(POLL_S):
            try:
                retrying(self._poll)
            except ControlError as exc:  # the engine is stopping or busy: next time
                log.info("schedules.later", reason=exc.message)
            except Exception as exc:  # noqa: BLE001 - the store still failing as the engine stops
                log.debug("schedules.stopped", error=repr(exc)[:500])

    def _nap(self, seconds: float) -> None:
        self._stop.wait(seconds)  # a stop ends the wait (and the retries: see retry=)

    def _poll(self) -> None:
        self.step(time.time())  # noqa: TID251 - cron ticks are wall-clock times
        if self.failures:
            log.info("schedules.recovered", failures=self.failures)
            self.failures = 0

    def _failed(self, state: tenacity.RetryCallState) -> None:
        """Log a failed poll in one line (a traceback only for what is not the database's)."""
        exc = state.outcome.exception() if state.outcome is not None else None
        self.failures += 1
        retry_in = state.next_action.sleep if state.next_action is not None else 0.0
        fields = {"error": repr(exc)[:500], "retry_in_s": round(retry_in, 3)}
        if exc is not None and is_transient(exc):
            log.warning("schedules.failed", **fields)
        else:
            log.error("schedules.failed", exc_info=exc, **fields)

    def step(self, now: float) -> int:
        """Fire what is due at ``now``; return how many runs started.

        Each row on its own (see the module docstring): what a row raises is
        that row's failure, but for the store's errors and the engine's
        ControlError (busy, stopping), which end the poll (it backs off).
        """
        started = 0
        with self._sessions() as session:
            rows = list(session.scalars(select(Schedule).where(Schedule.paused.is_(False))))
            for row in rows:
                if self._stop.is_set():
                    return started
                try:
                    started += self._row(session, row, now)
                except (ControlError, SQLAlchemyError, OSError):
                    raise
                except Exception as exc:  # noqa: BLE001 - the row's own: its last_error, logged once
                    session.rollback()
                    self.seen.pop(row.id, None)  # what comes due until it works is missed
                    self._row_failed(session, row, exc)
                else:
                    self.seen[row.id] = now
                    self._row_fine(session, row)
            active = {row.id for row in rows}
            for gone in self.failing.keys() - active:
                del self.failing[gone]  # deleted or paused: logged again if it fails again
            for gone in self.seen.keys() - active:
                del self.seen[gone]  # paused (or deleted): its ticks until resumed are missed
        return started

    def _row(self, session: Session, row: Schedule, now: float) -> int:
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

    def _row_failed(self, session: Session, row: Schedule, exc: Exception) -> None:
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

    def _row_fine(self, session: Session, row: Schedule) -> None:
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

    def _fire(self, session: Session, row: Schedule, tick: float) -> int:
        at = tick_iso(tick)
        request = {
            "plan": row.plan,
            "inputs": row.inputs or {},
            "key": f"schedule:{row.id}:{at}",
            "schedule": {"id": row.id, "tick": at},
        }
        try:
            answer = self._submit(request)
        except ControlError as exc:
            if exc.status == 503:
                raise
            fired(session, row.id, tick, None, f"{exc.status}: {exc.message}")
            log.warning("schedules.tick_refused", schedule=row.id, tick=at, error=exc.message)
            return 0
        fired(session, row.id, tick, str(answer["run_id"]), None)
        self.fired += 1
        log.info("schedules.tick", schedule=row.id, tick=at, run_id=answer["run_id"])
        return 1
