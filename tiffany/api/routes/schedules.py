"""``/api/schedules``: cron schedules of plans or workflows; each tick starts one run.

The rows are the store's (``tiffany/schedules/store.py``); engine 0 fires
the ticks (``tiffany/schedules/runner.py``). A schedule's plan (or its
workflow's name and inputs) is checked by an engine when it is added (422
naming the field), like a submission. Its
body is read as a submission's is (``tiffany/api/body.py``: 413 over
``TIFFANY_MAX_PLAN_BYTES`` before it is buffered, 422 naming the byte or
the path), at most ``TIFFANY_MAX_SCHEDULES`` schedules exist (429 beyond),
and the list comes in pages (``limit``, ``after``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query, Request, Response
from pydantic import ValidationError

from tiffany.api.body import InvalidBody, parse_document_off_loop, read_capped
from tiffany.api.deps import State
from tiffany.api.openapi import request_body
from tiffany.api.schemas import ErrorBody, ScheduleList, ScheduleOut, ScheduleRequest
from tiffany.errors import TiffanyError
from tiffany.schedules import store as schedules

__all__ = ["router"]

router = APIRouter(prefix="/api/schedules", tags=["schedules"])

#: What a page's ``next_after`` looks like: the last row's creation time (a finite
#: float's repr) and id. Anything else was no page's (422 naming ``after``).
CURSOR_PATTERN: Final = r"^[0-9]{1,20}(\.[0-9]{1,20})?(e[-+][0-9]{1,2})?:[A-Za-z0-9_.-]{1,100}$"


class ScheduleNotFound(TiffanyError):
    """No schedule has this id (HTTP 404)."""

    code = "schedule.not_found"
    http_status = 404


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
    openapi_extra={"requestBody": request_body(ScheduleRequest, yaml=True)},
    responses={
        413: {"model": ErrorBody, "description": "The body is larger than max_plan_bytes."},
        422: {
            "model": ErrorBody,
            "description": "A bad field or plan, or a body that is not UTF-8 or nested too deep.",
        },
        429: {"model": ErrorBody, "description": "There are max_schedules schedules already."},
        **_ERRORS,
    },
)
async def add_schedule(request: Request, state: State) -> dict[str, Any]:
    """Add a schedule; its first tick is the first one after now.

    The body (JSON, or YAML by its ``Content-Type``) is read as a
    submission's: capped at ``TIFFANY_MAX_PLAN_BYTES`` and parsed with the
    document limits.
    """
    raw = await read_capped(
        request.headers.get("content-length"), request.stream(), state.settings.max_plan_bytes
    )
    doc = await parse_document_off_loop(raw, request.headers.get("content-type"), ["body"])
    if doc is None:
        raise InvalidBody(["body"], "the body is empty; send a schedule")
    try:
        body = ScheduleRequest.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise InvalidBody(["body", *first["loc"]], first["msg"]) from None
    errors = schedules.check(body.cron, body.timezone, body.catchup)
    if errors:
        raise InvalidBody(["body", errors[0]["loc"]], errors[0]["msg"])
    if (body.plan is None) == (body.workflow is None):
        raise InvalidBody(["body", "workflow"], "send either a plan or a workflow (one of them)")
    await state.engines.commands.check_plan(body.plan, body.inputs, workflow=body.workflow)
    now = time.time()  # noqa: TID251 - a schedule's ticks are wall-clock times
    limit = state.settings.max_schedules
    return await state.read(
        lambda s: schedules.create(
            s,
            plan=body.plan,
            workflow=body.workflow,
            inputs=body.inputs,
            cron=body.cron,
            timezone=body.timezone,
            catchup=body.catchup,
            now=now,
            max_schedules=limit,
        )
    )


@router.get("", response_model=ScheduleList, responses=_ERRORS)
async def list_schedules(
    state: State,
    limit: Annotated[
        int,
        Query(ge=1, le=schedules.MAX_PAGE, description="Schedules a page holds at most."),
    ] = schedules.DEFAULT_PAGE,
    after: Annotated[
        str | None,
        Query(
            max_length=200,
            pattern=CURSOR_PATTERN,
            description="The previous page's ``next_after`` (paging).",
        ),
    ] = None,
) -> dict[str, Any]:
    """A page of schedules, oldest first; the next with ``after=<next_after>``."""
    now = time.time()  # noqa: TID251 - next_tick is a wall-clock time
    try:
        return await state.read(
            lambda s: schedules.list_schedules(s, now, after=after, limit=limit)
        )
    except schedules.BadCursor as exc:
        raise InvalidBody(["query", "after"], exc.message) from None


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
