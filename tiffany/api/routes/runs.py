"""``/api/runs``: submit, list, inspect and page the journal of runs.

Reads come from the SQL store (a projection of the journal, sync
SQLAlchemy in the threadpool); a submission goes to the engine over the
control channel, which answers it only once the run is durable in the WAL.
A run's other commands (cancel, re-run, signal, export, verify) are
``run_commands.py``'s, on the same prefix.

The WAL seq is the clock (docs/clock.md): a submission answers the seq of
the run's RUN_START, and a read with ``min_seq=N`` answers once the store
has projected seq N (waiting, bounded by :data:`~tiffany.api.deps.MIN_SEQ_WAIT_S`,
for the engine to say so; then 503 naming the seq the store is at). A
client that passes its submission's seq reads its own write, with no sleep
and no 404. Without ``min_seq``, the store is read as it is: an unknown run
is a 404 at once.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Final

import msgspec
import structlog
from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from tiffany.api.body import InvalidBody, parse_off_loop, read_capped
from tiffany.api.deps import State
from tiffany.api.openapi import request_body
from tiffany.api.schemas import (
    AgentConversation,
    ErrorBody,
    Plan,
    RunDetail,
    RunEvents,
    RunList,
    SubmitAnswer,
    SubmitRequest,
    WorkflowSubmitRequest,
)
from tiffany.api.timing import timed
from tiffany.errors import TiffanyError
from tiffany.store import Run, RunStatus, queries
from tiffany.store.conversation import NotAgentStep, agent_conversation

__all__ = [
    "DEFAULT_EVENTS_PAGE",
    "ERRORS",
    "MAX_EVENTS_PAGE",
    "NOT_FOUND",
    "check_run_id",
    "json_response",
    "router",
]

log = structlog.get_logger("tiffany.api")

#: Journal records per ``/events`` page unless asked, and the most allowed.
DEFAULT_EVENTS_PAGE: Final = 200
MAX_EVENTS_PAGE: Final = 1_000
#: Largest run number or WAL seq a query may name (SQL BIGINT; beyond: 422, never a 500).
MAX_INT64: Final = 2**63 - 1
#: What a run id can look like; anything else (NUL, surrogates, 10 kB) is a 404 at once.
_RUN_ID: Final = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
#: What ``since`` and ``until`` take (the schema's pattern; the calendar is checked after):
#: nothing, epoch seconds, or an ISO-8601 date or date-time, with or without a zone.
INSTANT_PATTERN: Final = (
    r"^(|-?[0-9]{1,11}(\.[0-9]{1,20})?"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})?)?)$"
)
_INSTANT: Final = re.compile(INSTANT_PATTERN)

router = APIRouter(prefix="/api/runs", tags=["runs"])


class RunNotFound(TiffanyError):
    """No run has this id (HTTP 404)."""

    code = "run.not_found"
    http_status = 404


class StepNotFound(TiffanyError):
    """The run has no step of this id (HTTP 404)."""

    code = "step.not_found"
    http_status = 404


class NoConversation(TiffanyError):
    """The step is not an ``agent`` step: it holds no conversation (HTTP 422)."""

    code = "step.no_conversation"
    http_status = 422


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
    503: {"model": ErrorBody, "description": "The engine or the store is not available."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such run."}
}

#: The ``min_seq`` query parameter of every read.
MinSeq = Annotated[
    int | None,
    Query(
        ge=0,
        le=MAX_INT64,
        description=(
            "Answer once the store has projected this WAL seq (a submission's ``seq``): "
            "waits a few seconds at most, then 503 with the seq the store is at."
        ),
    ),
]

_SUBMIT_BODY = request_body(
    SubmitRequest,
    WorkflowSubmitRequest,
    Plan,
    yaml=True,
    description=(
        "The envelope, a workflow's name and inputs, or the bare plan (with its own "
        "inputs), as JSON or YAML."
    ),
)


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``doc`` as a JSON response, encoded by msgspec.

    Discussion: the routes a client calls at every submission answer this
    way rather than through their ``response_model``, which FastAPI
    validates and serializes through pydantic on every response (for a
    run's detail, a third of the request's time). The model still
    documents the answer in the OpenAPI schema, and the schema tests
    (tests/fault/test_api_fuzz.py) check every answer against it.
    """
    return Response(msgspec.json.encode(doc), status, headers, media_type="application/json")


@router.post(
    "",
    status_code=201,
    response_model=SubmitAnswer,
    openapi_extra={"requestBody": _SUBMIT_BODY},
    responses={
        200: {"model": SubmitAnswer, "description": "The Idempotency-Key named an earlier run."},
        413: {"model": ErrorBody, "description": "The body is larger than max_plan_bytes."},
        422: {"model": ErrorBody, "description": "Malformed body or invalid plan."},
        409: {"model": ErrorBody, "description": "Idempotency-Key reused for another plan."},
        **ERRORS,
    },
)
async def submit_run(
    request: Request,
    state: State,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    """Submit a plan; answers ``{"run_id", "seq"}`` once the run is durable in the WAL.

    The body is ``{"plan": ..., "inputs": {...}}``, ``{"workflow": NAME,
    "inputs": {...}}`` (a ``@workflow`` the server imported), or the bare
    plan, as JSON or YAML. With an ``Idempotency-Key`` header, repeating the submission
    answers 200 with the first run's id and seq instead of starting another.
    ``GET /api/runs/{run_id}?min_seq={seq}`` (the ``Location``) reads it back.
    """
    body = await read_capped(
        request.headers.get("content-length"), request.stream(), state.settings.max_plan_bytes
    )
    # Up to max_plan_bytes of JSON or YAML: parsed off the event loop, with limits.
    with timed("parse"):
        sub = await parse_off_loop(body, request.headers.get("content-type"))
    with timed("engine"):  # until the run is durable
        plan = None if sub.workflow is not None else sub.plan  # a workflow's has none
        answer = await state.engines.commands.submit(
            plan, sub.inputs, idempotency_key, workflow=sub.workflow
        )
    run_id, created, seq = answer.run_id, answer.created, answer.seq
    # On the request's own log line (one line a request: see api/middleware.py).
    structlog.contextvars.bind_contextvars(
        run_id=run_id,
        created=created,
        seq=seq,
        **(
            {"workflow": sub.workflow}
            if sub.workflow is not None
            else {"plan": sub.plan.get("name")}
        ),
    )
    return json_response(
        {"run_id": run_id, "seq": seq, "created": created},
        status=201 if created else 200,
        headers={"Location": f"/api/runs/{run_id}?min_seq={seq}"},
    )


def instant(value: str | None, param: str) -> float | None:
    """Epoch seconds of a ``since``/``until`` query value; 422 naming ``param`` if unreadable.

    Takes epoch seconds (``1714557600``, ``1714557600.5``) or ISO-8601
    (``2024-05-01``, ``2024-05-01T10:00``, ``2024-05-01T10:00:00+02:00``,
    ``...Z``). A time without a zone is UTC, a date alone its midnight UTC:
    the dashboard sends its local times with their offset.
    """
    if not value:
        return None
    text = value
    if _INSTANT.fullmatch(text) is None:  # the schema's pattern: float() took "1_0", " 1"
        raise InvalidBody(
            ["query", param],
            f"{param}: {text[:80]!r} is neither epoch seconds nor an ISO-8601 date-time",
        )
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(number) or abs(number) > 1e11:
            raise InvalidBody(["query", param], f"{param}: {text!r} is not a time in range")
        return number
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidBody(
            ["query", param],
            f"{param}: {text[:80]!r} is neither epoch seconds nor an ISO-8601 date-time",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _page(
    session: Session,
    status: RunStatus | None,
    limit: int,
    before: int | None,
    *,
    by_time: bool = False,
    where: queries.RunFilter | None = None,
) -> dict[str, Any]:
    """A page of runs, newest first: by RUN_START seq, or (``by_time``) by start time.

    Several engines (``by_time``) write seqs of their own ranges
    (tiffany/wire/shards.py), which order runs by engine before time: their runs
    are ordered by the RUN_START's journal time, then seq. ``before`` is
    always a run's ``start_seq`` (the previous page's ``next_before``).
    """
    if not by_time:
        stmt = queries.summary_select().order_by(Run.start_seq.desc())
        if before is not None:
            stmt = stmt.where(Run.start_seq < before)
    else:
        stmt = queries.summary_select().order_by(Run.created_at.desc(), Run.start_seq.desc())
        if before is not None:
            at = session.scalar(select(Run.created_at).where(Run.start_seq == before))
            if at is None:
                stmt = stmt.where(Run.start_seq < before)
            else:
                stmt = stmt.where(
                    (Run.created_at < at) | ((Run.created_at == at) & (Run.start_seq < before))
                )
    if status is not None:
        stmt = stmt.where(Run.status == status.value)
    if where is not None:
        stmt = stmt.where(*where.clauses())
    rows = list(session.execute(stmt.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "runs": [queries.run_summary(r) for r in rows],
        "counts": queries.counts_by_status(session, where),
        "next_before": rows[-1].start_seq if more else None,
    }


@router.get("", response_model=RunList, responses=ERRORS)
async def list_runs(
    state: State,
    status: Annotated[
        RunStatus | None,
        Query(
            description=(
                "Only runs with this status (``waiting``: the runs that need someone, "
                "a signal or an operator)."
            )
        ),
    ] = None,
    name: Annotated[
        str | None,
        Query(max_length=200, description="Only runs whose name contains this (any case)."),
    ] = None,
    q: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Only runs whose inputs (keys or values, as JSON) contain this (any case).",
        ),
    ] = None,
    since: Annotated[
        str | None,
        Query(
            max_length=64,
            description=(
                "Only runs created at or after this time: epoch seconds or ISO-8601 (no zone: UTC)."
            ),
            json_schema_extra={"pattern": INSTANT_PATTERN},  # checked by instant(), its words
        ),
    ] = None,
    until: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Only runs created at or before this time (as ``since``).",
            json_schema_extra={"pattern": INSTANT_PATTERN},
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=queries.MAX_PAGE_SIZE)] = queries.DEFAULT_PAGE_SIZE,
    before: Annotated[
        int | None,
        Query(ge=0, le=MAX_INT64, description="Only runs older than this cursor (paging)."),
    ] = None,
    min_seq: Annotated[
        list[Annotated[int, Field(ge=0, le=MAX_INT64)]] | None,
        Query(
            description=(
                "Answer once the store has projected this WAL seq; repeat it for several "
                "engines' seqs (``serve --engines N``): waits a few seconds at most, then "
                "503 with the seq the store is at."
            ),
        ),
    ] = None,
) -> dict[str, Any]:
    """List runs, newest first (by their RUN_START's seq), with the count of runs by status.

    Page with ``before=<next_before>`` from the previous answer. With
    several engines, runs are ordered by their start time, then seq.
    ``name``, ``q``, ``since`` and ``until`` narrow the list and its counts.
    """
    where = queries.RunFilter(
        name=name or None,
        q=q or None,
        since=instant(since, "since"),
        until=instant(until, "until"),
    )
    if where.since is not None and where.until is not None and where.since > where.until:
        raise InvalidBody(["query", "until"], "until: is before since")
    if min_seq:  # one wait an engine, side by side (each bounded)
        await asyncio.gather(*(state.wait_projected(seq) for seq in set(min_seq)))
    by_time = len(state.engines) > 1
    return await state.read(lambda s: _page(s, status, limit, before, by_time=by_time, where=where))


def check_run_id(run_id: str) -> None:
    """Answer 404 at once for an id no run can have (never reaches SQL or the engine)."""
    if _RUN_ID.fullmatch(run_id) is None:
        shown = run_id[:80].encode("utf-8", "backslashreplace").decode("ascii", "replace")
        raise RunNotFound(f"no run {shown!r}", run_id=shown)


async def _read_run(
    state: State,
    run_id: str,
    min_seq: int | None,
    fn: Any,
    *,
    read: Callable[[], Awaitable[Any]] | None = None,
) -> Any:
    """Return ``fn(session)`` once the store holds ``min_seq``; 404 if it is None.

    ``read``: the same read through another of the store's ports
    (``state.reads.run_detail``: off the thread hop, on the store it has).
    """
    check_run_id(run_id)
    if min_seq is not None:
        await state.wait_projected(min_seq)
    result = await (read() if read is not None else state.read(fn))
    if result is None:
        raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
    return result


@router.get("/{run_id}", response_model=RunDetail, responses={**NOT_FOUND, **ERRORS})
async def get_run(
    run_id: str,
    state: State,
    min_seq: MinSeq = None,
    outputs: Annotated[
        bool,
        Query(
            description=(
                "false: without what the run produced (the run's ``outputs``, each step's "
                "``output``, each task's ``result`` are null, their sizes in "
                "``outputs_size``, ``output_size``, ``result_size``): what a client that "
                "polls a run's status should ask for."
            )
        ),
    ] = True,
) -> Response:
    """A run with its steps and tasks (as of at least ``min_seq``, when given)."""
    return json_response(
        await _read_run(
            state,
            run_id,
            min_seq,
            lambda s: queries.run_detail_of(s, run_id, outputs=outputs),
            read=lambda: state.reads.run_detail(run_id, outputs=outputs),
        )
    )


@router.get("/{run_id}/events", response_model=RunEvents, responses={**NOT_FOUND, **ERRORS})
async def run_events(
    run_id: str,
    state: State,
    after: Annotated[int, Query(ge=0, le=MAX_INT64, description="Records after this WAL seq.")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_INT64, description="Page size (capped).")
    ] = DEFAULT_EVENTS_PAGE,
    min_seq: MinSeq = None,
) -> dict[str, Any]:
    """The run's journal records, decoded, in WAL order; page with ``after=<next_after>``."""
    limit = min(limit, MAX_EVENTS_PAGE)
    result: dict[str, Any] = await _read_run(
        state, run_id, min_seq, lambda s: queries.run_records(s, run_id, after, limit)
    )
    return result


@router.get(
    "/{run_id}/steps/{step_id}/conversation",
    response_model=AgentConversation,
    responses={
        404: {"model": ErrorBody, "description": "No such run, or no such step in it."},
        422: {"model": ErrorBody, "description": "The step is not an agent step."},
        **ERRORS,
    },
)
async def step_conversation(
    run_id: str, step_id: str, state: State, min_seq: MinSeq = None
) -> Response:
    """An ``agent`` step's conversation: each turn's text, tool calls with results, tokens, cost.

    Read from the step's journaled model and tool calls (as of at least
    ``min_seq``, when given); a running step's turns so far.
    """
    check_run_id(run_id)
    if min_seq is not None:
        await state.wait_projected(min_seq)

    def read(session: Session) -> Any:
        try:
            return agent_conversation(session, run_id, step_id)
        except NotAgentStep as exc:
            return exc

    found = await state.read(read)
    if isinstance(found, NotAgentStep):
        raise NoConversation(
            f"step {step_id!r} of run {run_id} is a {found.tool} step: only agent steps "
            "hold a conversation",
            run_id=run_id,
            step_id=step_id,
            tool=found.tool,
        )
    if found is None:
        exists = await state.read(lambda s: queries.start_seq_of(s, run_id) is not None)
        if not exists:
            raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
        raise StepNotFound(
            f"run {run_id} has no step {step_id[:80]!r}", run_id=run_id, step_id=step_id[:80]
        )
    return json_response(found)
