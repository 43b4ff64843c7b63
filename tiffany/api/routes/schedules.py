"""``/api/schedules``: cron schedules of plans; each tick starts one run.

The rows are the store's (``tiffany/store/schedules.py``); engine 0 fires
the ticks (``tiffany/engine/schedules.py``). A schedule's plan is checked by
an engine when it is added (422 naming the field), like a submission.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from tiffany.api.body import InvalidBody
from tiffany.api.deps import State
from tiffany.api.schemas import ErrorBody
from tiffany.errors import TiffanyError
from tiffany.store import schedules

__all__ = ["router"]

router = APIRouter(prefix="/api/schedules", tags=["schedules"])


class ScheduleNotFound(TiffanyError):
    """No schedule has this id (HTTP 404)."""

    code = "schedule.not_found"
    http_status = 404


class ScheduleRequest(BaseModel):
    """A schedule: a plan, its inputs, when (cron, time zone) and what to do with missed ticks."""

    model_config = ConfigDict(extra="forbid")

    plan: dict[str, Any] = Field(description="The plan each tick runs.")
    inputs: dict[str, Any] = Field(default_factory=dict)
    cron: str = Field(
        description=(
            "Five fields (minute hour day month weekday) or six (and seconds, last): "
            '"0 9 * * 1-5", "*/10 * * * * *".'
        ),
        examples=["0 9 * * 1-5"],
    )
    timezone: str = Field(default="UTC", description="An IANA time zone, e.g. Europe/Paris.")
    catchup: Literal["skip", "one", "all"] = Field(
        default="skip",
        description="Ticks missed while no engine fired them: skip them, run the last, or all.",
    )


class ScheduleOut(BaseModel):
    """A schedule as the API shows it."""

    schedule_id: str
    name: str
    plan: dict[str, Any]
    inputs: dict[str, Any]
    cron: str
    timezone: str
    catchup: str
    paused: bool
    created_at: float
    last_tick: float | None = Field(description="The last tick fired or skipped (epoch s).")
    last_run_id: str | None = Field(description="The run the last fired tick started.")
    last_error: str | None = Field(description="Why the last tick started no run.")
    next_tick: float | None = Field(description="When the next tick is due (epoch s).")


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
    503: {"model": ErrorBody, "description": "The store or the engine is not available."},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such schedule."}
}


@router.post(
    "",
    status_code=201,
    response_model=ScheduleOut,
    responses={422: {"model": ErrorBody, "description": "A bad field or plan."}, **_ERRORS},
)
async def add_schedule(body: ScheduleRequest, state: State) -> dict[str, Any]:
    """Add a schedule; its first tick is the first one after now."""
    errors = schedules.check(body.cron, body.timezone, body.catchup)
    if errors:
        raise InvalidBody(["body", errors[0]["loc"]], errors[0]["msg"])
    await state.engines.check_plan(body.plan, body.inputs)
    now = time.time()  # noqa: TID251 - a schedule's ticks are wall-clock times
    return await state.read(
        lambda s: schedules.create(
            s,
            plan=body.plan,
            inputs=body.inputs,
            cron=body.cron,
            timezone=body.timezone,
            catchup=body.catchup,
            now=now,
        )
    )


@router.get("", response_model=list[ScheduleOut], responses=_ERRORS)
async def list_schedules(state: State) -> list[dict[str, Any]]:
    """Every schedule, oldest first."""
    now = time.time()  # noqa: TID251 - next_tick is a wall-clock time
    return await state.read(lambda s: schedules.list_schedules(s, now))


@router.get("/{schedule_id}", response_model=ScheduleOut, responses={**_NOT_FOUND, **_ERRORS})
async def get_schedule(schedule_id: str, state: State) -> dict[str, Any]:
    """One schedule."""
    now = time.time()  # noqa: TID251 - next_tick is a wall-clock time
    found = await state.read(lambda s: schedules.get(s, schedule_id, now))
    if found is None:
        raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}", schedule_id=schedule_id[:80])
    return found


async def _pause(state: Any, schedule_id: str, paused: bool) -> dict[str, Any]:
    now = time.time()  # noqa: TID251 - next_tick is a wall-clock time
    found = await state.read(lambda s: schedules.set_paused(s, schedule_id, paused, now))
    if found is None:
        raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}", schedule_id=schedule_id[:80])
    return dict(found)


@router.post(
    "/{schedule_id}/pause", response_model=ScheduleOut, responses={**_NOT_FOUND, **_ERRORS}
)
async def pause_schedule(schedule_id: str, state: State) -> dict[str, Any]:
    """Stop firing ticks; those due meanwhile follow ``catchup`` on resume."""
    return await _pause(state, schedule_id, True)


@router.post(
    "/{schedule_id}/resume", response_model=ScheduleOut, responses={**_NOT_FOUND, **_ERRORS}
)
async def resume_schedule(schedule_id: str, state: State) -> dict[str, Any]:
    """Fire ticks again."""
    return await _pause(state, schedule_id, False)


@router.delete("/{schedule_id}", status_code=204, responses={**_NOT_FOUND, **_ERRORS})
async def delete_schedule(schedule_id: str, state: State) -> Response:
    """Delete a schedule (the runs it started stay)."""
    if not await state.read(lambda s: schedules.remove(s, schedule_id)):
        raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}", schedule_id=schedule_id[:80])
    return Response(status_code=204)
