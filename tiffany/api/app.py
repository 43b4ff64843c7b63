"""``create_app(settings)``: the API side-process's FastAPI application.

The app reads state from the SQL store, sends commands to the engine over
the control channel (``<data dir>/control.sock``) and relays the engine's
activity feed (``<data dir>/feed.sock``) to websockets. It never imports the
kernel, the WAL or the agents: it runs in a process of its own, which the
engine process does not wait for.

The ports (``tiffany/ports``) are chosen here, once, from the settings: the
store's reads, the watermark that read-your-writes waits on, and the source
of the activity relay (the engines' sockets or PostgreSQL); nothing below
asks again which transport it runs on.

Lifespan: start-up starts the feed relay (which connects, and reconnects,
to the engine on its own: the API may start before the engine) and the
watermark; shutdown cuts the websockets off, closes the control and
watermark connections and the store's.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

import tiffany
from tiffany.api import openapi, problems, timing
from tiffany.api.deps import ApiState
from tiffany.api.middleware import RequestLog, TokenAuth
from tiffany.api.routes import (
    activity,
    memory,
    meta,
    run_commands,
    runs,
    schedules,
    system,
    tools,
)
from tiffany.api.schemas import (
    RerunRequest,
    ScheduleRequest,
    SubmitRequest,
    WorkflowSubmitRequest,
)
from tiffany.api.timing import Timings
from tiffany.config import Settings
from tiffany.feed.relay import FeedRelay
from tiffany.observe.api_metrics import ApiMetrics
from tiffany.ports.feed import feed_source
from tiffany.ports.reads import reads_for
from tiffany.ports.watermark import watermark_for
from tiffany.store import queries

__all__ = ["create_app"]

log = structlog.get_logger("tiffany.api")


def create_app(settings: Settings) -> FastAPI:
    """Build the API application for ``settings`` (nothing is connected until start-up).

    Args:
        settings: The process settings: data dir (the engine's sockets),
            database URL, API token, body and websocket limits.
    """
    reads = reads_for(settings.database_url, timing.add)

    async def read_mark(engine: int) -> int:
        return await reads.read(lambda s: queries.watermark(s, engine))

    relay = FeedRelay(
        feed_source(settings),
        ring_events=settings.feed_ring_events,
        queue_frames=settings.ws_queue_frames,
        queue_bytes=settings.ws_queue_bytes,
        send_timeout_s=settings.ws_send_timeout_s,
        max_subscribers=settings.ws_max_subscribers,
    )
    state = ApiState(
        settings=settings,
        reads=reads,
        watermark=watermark_for(settings, read_mark),
        relay=relay,
        metrics=ApiMetrics(relay),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.relay.start()
        state.watermark.start()
        state.engines.start()
        # The start-up heap (FastAPI, pydantic, SQLAlchemy, the routes) lives as
        # long as the process: out of the collector's reach, a full collection
        # walks the requests' objects only (each one paused the loop long enough
        # to set the p99 of reads; as the engine does, engine/__init__.py).
        gc.collect()
        gc.freeze()
        log.info(
            "api.started",
            data_dir=str(settings.data_dir),
            auth=settings.api_token is not None,
            database=settings.public_dict()["database_url"],
        )
        try:
            yield
        finally:
            await state.relay.stop()
            await state.watermark.close()
            await state.engines.close()
            await state.close()
            log.info("api.stopped")

    app = FastAPI(
        title="Tiffany",
        version=tiffany.__version__,
        summary="Durable agent-task orchestration: runs, their journals and live activity.",
        lifespan=lifespan,
    )
    app.state.tiffany = state
    problems.install(app)
    routers = (
        runs.router,
        run_commands.router,  # the same prefix: a run's commands to the engine
        schedules.router,
        memory.router,
        tools.router,
        activity.router,
        meta.router,
        system.router,
    )
    for router in routers:
        app.include_router(router)
    app.state.allowed_methods = problems.AllowedMethods(
        [*app.routes, *(route for router in routers for route in router.routes)]
    )
    openapi.install(
        app,
        [SubmitRequest, WorkflowSubmitRequest, RerunRequest, ScheduleRequest],
        token=settings.api_token is not None,
    )
    app.mount("/static", StaticFiles(directory=system.STATIC_DIR, check_dir=False), name="static")
    token = settings.api_token.get_secret_value() if settings.api_token is not None else None
    # Outermost last: the request log sees 401s too.
    app.add_middleware(Timings)
    app.add_middleware(TokenAuth, token=token)
    app.add_middleware(RequestLog)
    return app
