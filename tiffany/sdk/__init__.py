"""The Python SDK: a client of a Tiffany server's HTTP API.

Public API (also importable from ``tiffany`` itself)::

    from tiffany import Client, AsyncClient

    with Client("http://127.0.0.1:8000", token=None) as client:
        run = client.submit({"name": "hello", "steps": [...]}, inputs={"x": 1})
        done = run.wait(timeout=60)          # or client.wait(run.run_id)
        print(done.status, done.outputs)

Methods: ``submit``, ``get``, ``list``, ``wait``, ``cancel``, ``signal``,
``rerun``, ``events`` (the activity feed, resumable), ``records`` (a run's
journal); the agents' memory: ``memory_namespaces``, ``memory_items``,
``memory_search``, ``memory_get``, ``memory_delete``. Answers are pydantic
models (:mod:`tiffany.sdk.models`); error answers raise
:class:`~tiffany.sdk.errors.ApiError` subclasses carrying the API's ``code``,
``message``, ``detail`` and field errors. See docs/sdk.md.

The SDK imports only httpx, websockets and pydantic: never the server's
modules.
"""

from tiffany.sdk.aclient import AsyncClient, AsyncRunHandle
from tiffany.sdk.client import Client, RunHandle
from tiffany.sdk.errors import (
    ApiError,
    ClientError,
    Conflict,
    ConnectionFailed,
    FieldError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from tiffany.sdk.models import (
    CancelAnswer,
    Event,
    FeedGap,
    MemoryDeleted,
    MemoryItem,
    MemoryItemDetail,
    MemoryItems,
    MemoryNamespaces,
    MemorySearch,
    RunDetail,
    RunEvents,
    RunList,
    RunSummary,
    RunWaits,
    ScheduleList,
    ScheduleOut,
    SignalAnswer,
    SignalWait,
    StepOut,
    SubmitAnswer,
    TaskOut,
    WaitingFor,
)

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncRunHandle",
    "CancelAnswer",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "Event",
    "FeedGap",
    "FieldError",
    "InvalidRequest",
    "MemoryDeleted",
    "MemoryItem",
    "MemoryItemDetail",
    "MemoryItems",
    "MemoryNamespaces",
    "MemorySearch",
    "NotFound",
    "PayloadTooLarge",
    "RunDetail",
    "RunEvents",
    "RunHandle",
    "RunList",
    "RunSummary",
    "RunWaits",
    "ScheduleList",
    "ScheduleOut",
    "SignalAnswer",
    "SignalWait",
    "StepOut",
    "SubmitAnswer",
    "TaskOut",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "WaitingFor",
]
