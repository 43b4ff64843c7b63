"""``/api/runs/{run_id}/...``: what the engine is asked about one run.

Cancel, re-run, signal, export and verify a run: each goes to the engine
that holds the run over the control channel (``state.engines.commands``),
which answers a re-run or a signal only once it is durable in the WAL.
Submitting a run and reading runs from the store are ``runs.py``'s; the
app registers this router right after that one, on the same prefix and
tag, so the OpenAPI document reads as one resource.
"""

from __future__ import annotations

import base64
import re
import uuid
from typing import Annotated, Any, Final

import structlog
from fastapi import APIRouter, Header, Path, Request, Response
from pydantic import ValidationError

from tiffany.api.body import InvalidBody, parse_json_off_loop, read_capped
from tiffany.api.deps import State
from tiffany.api.openapi import request_body
from tiffany.api.routes.runs import ERRORS, NOT_FOUND, check_run_id, json_response
from tiffany.api.schemas import (
    CancelAnswer,
    ErrorBody,
    RerunRequest,
    RunWaits,
    SignalAnswer,
    SubmitAnswer,
)
from tiffany.wire.documents import SIGNAL_NAME_PATTERN
from tiffany.wire.records import RESERVED_SIGNAL_PREFIXES, reserved_signal, reserved_signal_message

__all__ = ["EXPORT_MEDIA_TYPE", "SIGNAL_NAME_SCHEMA_PATTERN", "router"]

log = structlog.get_logger("tiffany.api")

_SIGNAL_NAME: Final = re.compile(SIGNAL_NAME_PATTERN)
#: What the schema says of a signal name: the pattern, less the engine's own names.
SIGNAL_NAME_SCHEMA_PATTERN: Final = (
    "^(?!"
    + "|".join(re.escape(p) for p in RESERVED_SIGNAL_PREFIXES)
    + ")"
    + SIGNAL_NAME_PATTERN[1:]
)
#: How long a ``verify`` replay may take, in seconds (a little over the engine's own limit).
VERIFY_TIMEOUT_S: Final = 630.0
#: How long an export may take (the engine reads the run's journal once).
EXPORT_TIMEOUT_S: Final = 120.0

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.post(
    "/{run_id}/cancel",
    status_code=202,
    response_model=CancelAnswer,
    responses={
        **NOT_FOUND,
        409: {"model": ErrorBody, "description": "The run has already finished."},
        **ERRORS,
    },
)
async def cancel_run(run_id: str, state: State) -> CancelAnswer:
    """Ask the engine to cancel a running run (it ends ``cancelled`` shortly)."""
    check_run_id(run_id)
    answer = await state.engines.commands.cancel(run_id, "cancelled over HTTP")
    log.info("run cancel requested")
    return CancelAnswer(run_id=answer.run_id)


@router.post(
    "/{run_id}/rerun",
    status_code=201,
    response_model=SubmitAnswer,
    openapi_extra={"requestBody": request_body(RerunRequest, required=False)},
    responses={
        200: {"model": SubmitAnswer, "description": "The Idempotency-Key named an earlier re-run."},
        **NOT_FOUND,
        409: {"model": ErrorBody, "description": "The run has not finished."},
        413: {"model": ErrorBody, "description": "The body is larger than max_plan_bytes."},
        422: {"model": ErrorBody, "description": "No such step, no failed step, or a bad body."},
        **ERRORS,
    },
)
async def rerun_run(
    run_id: str,
    request: Request,
    state: State,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    """Re-run a finished run from a step (default: from its failed steps).

    The new run reuses the recorded output of every step not downstream of
    the restart point, without calling its tool again (each says which run
    and WAL seq it came from), copies the earlier run's workspace, and runs
    the rest. It replays and verifies on its own. Answers like a submission:
    201 ``{"run_id", "seq"}`` once journaled.
    """
    check_run_id(run_id)
    body = await read_capped(
        request.headers.get("content-length"), request.stream(), state.settings.max_plan_bytes
    )
    doc = await parse_json_off_loop(body, ["body"])
    try:
        asked = RerunRequest.model_validate({} if doc is None else doc)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise InvalidBody(["body", *errors[0]["loc"]], errors[0]["msg"]) from None
    answer = await state.engines.commands.rerun(
        run_id, inputs=asked.inputs or {}, from_step=asked.from_step, key=idempotency_key
    )
    new_id, seq, created = answer.run_id, answer.seq, answer.created
    structlog.contextvars.bind_contextvars(run_id=new_id, rerun_of=run_id, seq=seq)
    return json_response(
        {"run_id": new_id, "seq": seq, "created": created},
        status=201 if created else 200,
        headers={"Location": f"/api/runs/{new_id}?min_seq={seq}"},
    )


@router.post(
    "/{run_id}/signals/{name:path}",  # "a/b" is a bad name (422), not another route
    status_code=202,
    response_model=SignalAnswer,
    openapi_extra={
        "requestBody": {
            "description": "The signal's payload: any JSON (an empty body is null).",
            "content": {"application/json": {"schema": {}}},
        }
    },
    responses={
        **NOT_FOUND,
        409: {"model": ErrorBody, "description": "The run has already finished."},
        413: {
            "model": ErrorBody,
            "description": "The body is larger than max_signal_bytes, or the run holds "
            "max_pending_signal_bytes of signals no step has received.",
        },
        422: {
            "model": ErrorBody,
            "description": "A bad signal name (one in the engine's reserved namespace: "
            "child:, concurrency., tiffany.), a malformed body, or a payload the waiting "
            "step's schema refuses (code signal.payload_invalid; each detail item names the "
            "field: loc, its JSON pointer, the step). Nothing is journaled.",
        },
        429: {
            "model": ErrorBody,
            "description": "The run holds max_pending_signals signals no step has received.",
        },
        **ERRORS,
    },
)
async def signal_run(
    run_id: str,
    name: Annotated[
        str,
        Path(
            description=(
                "The signal's name; names starting with "
                + ", ".join(RESERVED_SIGNAL_PREFIXES)
                + " are the engine's own."
            ),
            # In the schema only: the route checks it, answering 422 in its own words.
            json_schema_extra={"pattern": SIGNAL_NAME_SCHEMA_PATTERN},
        ),
    ],
    request: Request,
    state: State,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    """Send signal ``name`` to a running run; 202 once it is journaled.

    A step ``{"tool": "signal.wait", "args": {"name": NAME}}`` outputs the
    payload; a signal sent before the step waits is kept for it, and each
    wait takes one signal, oldest first. With an ``Idempotency-Key``, sending
    the same signal again journals it once (the answer names the first).
    Names starting with ``child:``, ``concurrency.`` or ``tiffany.`` are the
    engine's own (422); a run holds a bounded number and size of signals no
    step has received (429, 413, naming the setting). A payload that does not
    satisfy the ``schema`` of the steps waiting for ``name`` is refused (422
    naming the field, nothing journaled); a name no step waits for is taken
    with a ``warning`` naming what the run waits for.
    """
    check_run_id(run_id)
    if _SIGNAL_NAME.match(name) is None:
        raise InvalidBody(["path", "name"], f"a signal name must match {SIGNAL_NAME_PATTERN}")
    if reserved_signal(name) is not None:  # the engine's own (a sub-plan's end, a slot)
        raise InvalidBody(["path", "name"], reserved_signal_message(name))
    body = await read_capped(
        request.headers.get("content-length"),
        request.stream(),
        state.settings.max_signal_bytes,
        "TIFFANY_MAX_SIGNAL_BYTES",
    )
    payload = await parse_json_off_loop(body, ["body"])
    answer = await state.engines.commands.signal(
        run_id, name, payload, idempotency_key or uuid.uuid4().hex
    )
    seq = answer.seq
    structlog.contextvars.bind_contextvars(run_id=run_id, signal=name, seq=seq)
    sent: dict[str, Any] = {
        "run_id": run_id,
        "name": name,
        "seq": seq,
        "signal_id": answer.signal_id,
    }
    if answer.warning:  # no step waits for that name (it may be early)
        sent["warning"] = answer.warning
        log.warning("signal not awaited", warning=sent["warning"])
    return json_response(sent, status=202)


#: The media type of a run export (docs/replay.md, "Export format").
EXPORT_MEDIA_TYPE: Final = "application/vnd.tiffany.run-export"


@router.get(
    "/{run_id}/waits",
    response_model=RunWaits,
    responses={
        **NOT_FOUND,
        409: {"model": ErrorBody, "description": "The run has finished: it waits for nothing."},
        **ERRORS,
    },
)
async def run_waits(run_id: str, state: State) -> RunWaits:
    """The signals a running run's tasks wait for now, with each wait's payload schema.

    Asked of the engine that holds the run: a workflow's waits are told to
    the engine as its code reaches them, and their schemas are not in the
    store (the dashboard's signal form is drawn from them).
    """
    check_run_id(run_id)
    answer = await state.engines.commands.waits(run_id)
    return RunWaits.model_validate(answer)


@router.get(
    "/{run_id}/export",
    response_class=Response,
    responses={
        200: {
            "description": "The run's journal in one file (`tiffany export`'s; docs/replay.md): "
            "replay it with `tiffany replay FILE --verify` or `tiffany.testing.replay_file`. "
            "A run not finished yet is exported as far as its journal goes.",
            "content": {EXPORT_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        },
        **NOT_FOUND,
        413: {"model": ErrorBody, "description": "Too large to send: export it on the host."},
        **ERRORS,
    },
)
async def export_run(run_id: str, state: State) -> Response:
    """The run's export file: its journal records as journaled, with a header.

    Read from the journal by the engine that holds the run (the store's
    decoded records, ``/events``, are not the bytes a replay compares).
    """
    check_run_id(run_id)
    answer = await state.engines.commands.export(run_id, EXPORT_TIMEOUT_S)
    data = base64.b64decode(str(answer.get("export", "")))
    log.info("run exported", bytes=len(data), records=answer.get("records"))
    return Response(
        data,
        media_type=EXPORT_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{run_id}.tfx"'},
    )


@router.post(
    "/{run_id}/verify",
    responses={
        200: {"description": "The replay report (as `tiffany replay --verify --json`)."},
        **NOT_FOUND,
        409: {"model": ErrorBody, "description": "The run has not finished."},
        **ERRORS,
    },
)
async def verify_run(run_id: str, state: State) -> dict[str, Any]:
    """Replay a finished run against its journal and report whether it matches.

    The report is ``tiffany replay --verify --json``'s: ``ok`` (also as
    ``identical``), ``status``, ``dispatches``, ``records``, ``divergence``
    (where the replay first differed) and ``problems``.
    """
    check_run_id(run_id)
    answer = await state.engines.commands.verify(run_id, VERIFY_TIMEOUT_S)
    nested = answer.get("report")
    report = nested if isinstance(nested, dict) else {k: v for k, v in answer.items() if k != "id"}
    # Over the control channel "ok" is the envelope's; the verdict is "identical".
    if "identical" in report:
        report["ok"] = bool(report["identical"])
    log.info("run verified", ok=report.get("ok"))
    return report
