"""Liveness, readiness, metrics and the dashboard's files.

``/healthz`` never needs the token. ``/`` and ``/static/*`` do not either:
they are the dashboard's files, which hold no data and must load before the
page can ask the user for the token; the data they show comes from the
protected routes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from tiffany.api.deps import State, StoreUnavailable
from tiffany.api.engines import merge_metrics
from tiffany.api.schemas import Readiness
from tiffany.errors import EngineUnavailable, Refusal
from tiffany.store import queries
from tiffany.wire.shards import owners_here

__all__ = ["STATIC_DIR", "router"]

#: The dashboard's files (written by the dashboard's own change).
STATIC_DIR: Final = Path(__file__).resolve().parent.parent / "static"
#: How long ``/readyz`` and ``/metrics`` wait for the engine, in seconds.
ENGINE_PROBE_TIMEOUT_S: Final = 2.0

_PLACEHOLDER: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tiffany</title></head>
<body><h1>Tiffany</h1>
<p>The dashboard is not installed. The API is: see <a href="/docs">/docs</a>,
<code>GET /api/runs</code> and <code>WS /ws/activity</code>.</p></body></html>
"""

router = APIRouter()


@router.get("/healthz", tags=["system"])
async def healthz() -> dict[str, bool]:
    """Liveness: the API process answers (no token needed, no engine asked)."""
    return {"ok": True}


@router.get(
    "/readyz",
    tags=["system"],
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready, and why."}},
)
async def readyz(state: State) -> Any:
    """Readiness: the engine is reachable, done recovering, and its store is not stuck.

    With several engines (``serve --engines N``): ready while at least one
    is; ``reason`` then names the others.

    The store counts as stuck when the projector is stalled (records wait
    and none was applied for a few seconds), keeps failing, or its process
    restarts in a loop: then the answer is 503 with ``"store stalled:
    <reason>"``. Lag alone, while the projector makes progress, is not
    unready: a burst of submissions makes lag and the store catches up.
    """
    answers = await state.engines.commands.status(ENGINE_PROBE_TIMEOUT_S)
    several = len(answers) > 1
    reasons: list[str] = []
    stores: list[Any] = []
    for engine, status in enumerate(answers):
        # With several engines the reason names the one that is not ready.
        who = f"engine {engine}" if several else "engine"
        stores.append(status.get("projector") if isinstance(status, dict) else None)
        if isinstance(status, EngineUnavailable):
            reasons.append(f"{who} unreachable")
        elif isinstance(status, Refusal):
            reasons.append(f"{who}: {status.message}")
        elif isinstance(status, BaseException):
            raise status
        elif not status.get("ready"):
            phase = status.get("phase")
            doing = {
                "stopping": "stopping",
                "ready": "starting its store's projector",  # its first report is due
            }.get(str(phase), "recovering")
            reasons.append(f"{who} {doing}")
        elif isinstance(stores[-1], dict) and stores[-1].get("stalled"):
            stalled = f"store stalled: {stores[-1].get('stalled_reason')}"
            reasons.append(f"{who}'s {stalled}" if several else stalled)
    store = stores if several else stores[0]
    # Ready while some engine takes work: submissions pass over the others
    # (a standby's engine waiting for its stream, one restarting).
    commands = state.engines.commands
    nobody_here = all(isinstance(status, EngineUnavailable) for status in answers)
    if nobody_here and commands.remote and state.relay.connected:
        # No engine here (a standby's waits for its stream before it listens),
        # but the database carries requests, the feed and the store's marks:
        # ready while engines elsewhere hold their streams. An engine here
        # that answers "recovering" is this host's own start: not ready yet.
        try:
            alive = await commands.engines_elsewhere(owners_here(state.settings.data_dir))
        except EngineUnavailable:
            alive = 0
        if alive:
            return {"ready": True, "reason": f"{alive} engine(s) elsewhere", "store": None}
    if len(reasons) == len(answers):
        body: dict[str, Any] = {"ready": False, "reason": "; ".join(reasons)}
        if any(s is not None for s in stores):
            body["store"] = store
        return JSONResponse(body, status_code=503)
    return {"ready": True, "reason": "; ".join(reasons) or None, "store": store}


@router.get("/metrics", tags=["system"], response_class=Response)
async def metrics_text(state: State) -> Response:
    """Prometheus metrics: this process's registry, then the engine's (see ``api/metrics.py``)."""
    texts = await state.engines.commands.metrics(ENGINE_PROBE_TIMEOUT_S)
    # Engine 0's text alone, or every engine's, each sample labelled engine="i".
    engine_text = None if None in texts else merge_metrics(texts)
    try:
        counts: dict[str, int] | None = await state.read(queries.counts_by_status)
    except StoreUnavailable:
        counts = None
    body = state.metrics.render(counts, engine_text)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/", include_in_schema=False)
async def dashboard() -> Response:
    """The dashboard's page (a placeholder when it is not installed)."""
    index = STATIC_DIR / "index.html"
    if index.is_file():
        return FileResponse(index, media_type="text/html")
    return HTMLResponse(_PLACEHOLDER)
