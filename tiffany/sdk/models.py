"""The SDK's typed answers: the HTTP API's own models, and the feed's events.

The answers are the models the API serves (``/openapi.json``), defined once
in :mod:`tiffany.wire.http` and re-exported here under the same names: a
client reads the very documents the API documents, and importing them
starts no FastAPI (the wire imports pydantic only). Those the store lets
grow (runs, steps, tasks) allow extra fields: a field the server adds
reaches the client as an attribute without a new SDK.

The feed's :class:`Event` has no OpenAPI schema (it travels over the
websocket): it follows the activity event schema v2 (docs/sdk.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tiffany.wire.http import (
    FINISHED,
    CancelAnswer,
    JournalRecordOut,
    MemoryDeleted,
    MemoryEmbedder,
    MemoryHit,
    MemoryItem,
    MemoryItemDetail,
    MemoryItems,
    MemoryLink,
    MemoryNamespace,
    MemoryNamespaces,
    MemoryNeighbor,
    MemoryRef,
    MemorySearch,
    MemoryVersion,
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
from tiffany.wire.status import RunStatusName

__all__ = [
    "FINISHED",
    "CancelAnswer",
    "Event",
    "FeedGap",
    "JournalRecordOut",
    "MemoryDeleted",
    "MemoryEmbedder",
    "MemoryHit",
    "MemoryItem",
    "MemoryItemDetail",
    "MemoryItems",
    "MemoryLink",
    "MemoryNamespace",
    "MemoryNamespaces",
    "MemoryNeighbor",
    "MemoryRef",
    "MemorySearch",
    "MemoryVersion",
    "RunDetail",
    "RunEvents",
    "RunList",
    "RunStatus",
    "RunSummary",
    "RunWaits",
    "ScheduleList",
    "ScheduleOut",
    "SignalAnswer",
    "SignalWait",
    "StepOut",
    "SubmitAnswer",
    "TaskOut",
    "WaitingFor",
]

#: A run's status, one vocabulary for the API, the store and the SDK
#: (:mod:`tiffany.wire.status`).
RunStatus = RunStatusName


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Event(_Open):
    """One activity event of the feed (schema v2).

    ``seq`` is the feed's resume key (pass it as ``since``); ``wal_seq`` is
    the journal's clock (pass it as ``min_seq`` to read the store as of the
    event). ``kind`` is one of ``spawned``, ``step``, ``blocked``, ``woke``,
    ``exit``, ``crash``, ``cancelled``, ``tool.started``, ``tool.output``,
    ``tool.finished``, ``retry``, ``llm.usage``, ``run.started``,
    ``run.finished``.
    """

    v: int = 2
    seq: int
    wal_seq: int = 0
    ts: float = 0.0
    engine: int = 0
    run_id: str | None = None
    task_id: int | None = None
    ltid: int | None = None
    task: str = ""
    task_kind: str | None = None
    step_id: str | None = None
    kind: str
    label: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class FeedGap(_Open):
    """The server no longer holds some events after the ``since`` asked for.

    What the feed calls ``gone``: events between the resume point and
    ``oldest`` were lost to the client (read the run's state with ``get``);
    the events after this marker follow as usual.
    """

    kind: Literal["gone"] = "gone"
    oldest: int | None = None
    reason: str | None = None
