"""The SDK's typed answers: pydantic models of what the HTTP API returns.

They mirror the API's response schemas (``/openapi.json``, built from
``tiffany/api/schemas.py``) field for field and under the same names, so a
client reads the same documents the API documents. They are defined here,
not imported from the API package, because importing ``tiffany.api`` starts
FastAPI and the server's modules: a client needs only pydantic. A test
(tests/sdk/test_models.py) holds them to the served OpenAPI document.

Like the API's models they allow extra fields: a field the server adds
reaches the client (as an attribute) without a new SDK.

The feed's :class:`Event` has no OpenAPI schema (it travels over the
websocket): it follows the activity event schema v2 (docs/sdk.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tiffany.wire.status import TERMINAL, RunStatusName

__all__ = [
    "FINISHED",
    "CancelAnswer",
    "Event",
    "FeedGap",
    "JournalRecordOut",
    "RunDetail",
    "RunEvents",
    "RunList",
    "RunStatus",
    "RunSummary",
    "ScheduleList",
    "ScheduleOut",
    "SignalAnswer",
    "StepOut",
    "SubmitAnswer",
    "TaskOut",
    "WaitingFor",
]

#: A run's status, one vocabulary for the API, the store and the SDK
#: (:mod:`tiffany.wire.status`).
RunStatus = RunStatusName

#: The statuses of a run that has ended.
FINISHED: frozenset[str] = TERMINAL


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class SubmitAnswer(_Open):
    """A submission's (or a re-run's) answer: the run, and the WAL seq of its first record."""

    run_id: str
    seq: int
    created: bool = True


class WaitingFor(_Open):
    """One task that waits for a person: a client's signal, or an operator's tool or function."""

    kind: Literal["signal", "tool", "function"]
    name: str
    step: str | None = None
    task: int
    reason: str | None = None


class RunSummary(_Open):
    """A run as the runs list shows it (``waiting``: it needs someone, ``waiting_for`` says why)."""

    run_id: str
    run_no: int
    engine: int = 0
    name: str
    status: RunStatus
    kind: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    updated_at: float | None = None
    dispatches: int = 0
    last_seq: int | None = None
    waiting_for: list[WaitingFor] = Field(default_factory=list)

    @property
    def finished(self) -> bool:
        """True once the run has ended (succeeded, failed or cancelled)."""
        return self.status in FINISHED


class RunList(_Open):
    """A page of runs, newest first; ``next_before`` pages on (None on the last page).

    Iterating it (and ``len``) goes over its runs: ``for run in client.list(): ...``.
    """

    runs: list[RunSummary]
    counts: dict[str, int]
    next_before: int | None

    def __iter__(self) -> Iterator[RunSummary]:  # type: ignore[override]
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)


class ScheduleOut(_Open):
    """A cron schedule of a plan: each tick starts one run."""

    schedule_id: str
    name: str
    plan: dict[str, Any]
    inputs: dict[str, Any]
    cron: str
    timezone: str
    catchup: str
    paused: bool
    created_at: float
    last_tick: float | None
    last_run_id: str | None
    last_error: str | None
    next_tick: float | None
    #: The next few ticks (epoch seconds), ``next_tick`` first; none while paused.
    next_ticks: list[float] = Field(default_factory=list)


class ScheduleList(_Open):
    """A page of schedules, oldest first; ``next_after`` pages on (None on the last page)."""

    schedules: list[ScheduleOut]
    next_after: str | None


class StepOut(_Open):
    """A plan step of a run: its status, attempts, output and error."""

    step_id: str
    position: int
    tool: str | None = None
    status: str
    attempts: list[Any] = Field(default_factory=list)
    output: Any = None
    error: Any = None
    started_at: float | None = None
    ended_at: float | None = None
    waiting: str | None = None
    last_seq: int | None = None
    #: Read with ``outputs=False``: the size of the output left out (characters of JSON).
    output_size: int | None = None
    #: The steps it runs after; the dynamic step that added it (None: the plan's).
    after: list[str] = Field(default_factory=list)
    added_by: str | None = None
    #: Whether its output's ``steps`` extend the plan.
    dynamic: bool = False


class TaskOut(_Open):
    """A journaled task of a run (``ltid`` is its id within the run)."""

    ltid: int
    parent_ltid: int | None = None
    name: str
    kind: str
    step_id: str | None = None
    state: str
    blocked_on: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    result: Any = None
    error: Any = None
    last_seq: int | None = None
    #: Read with ``outputs=False``: the size of the result left out (characters of JSON).
    result_size: int | None = None


class RunDetail(RunSummary):
    """A run with its entry, inputs, outputs, error, steps and tasks."""

    entry: Any = None
    inputs: Any = None
    outputs: Any = None
    error: Any = None
    usage: dict[str, float] | None = None
    steps: list[StepOut] = Field(default_factory=list)
    tasks: list[TaskOut] = Field(default_factory=list)
    #: Read with ``outputs=False``: the size of the outputs left out (characters of JSON).
    outputs_size: int | None = None

    def step(self, step_id: str) -> StepOut:
        """Return the step ``step_id`` (a KeyError naming the steps there are if none)."""
        for step in self.steps:
            if step.step_id == step_id:
                return step
        known = ", ".join(s.step_id for s in self.steps) or "none"
        raise KeyError(f"run {self.run_id} has no step {step_id!r} (steps: {known})")


class JournalRecordOut(_Open):
    """One journal record of a run, decoded (its fields in ``data``)."""

    seq: int
    type: str
    ltid: int | None = None
    data: Any = None


class RunEvents(_Open):
    """A page of a run's journal records; ``next_after`` pages on (None on the last)."""

    run_id: str
    records: list[JournalRecordOut]
    next_after: int | None


class CancelAnswer(_Open):
    """A cancellation was requested; the run ends ``cancelled`` shortly."""

    run_id: str
    status: str = "cancelling"


class SignalAnswer(_Open):
    """A signal was journaled: its record's WAL ``seq`` and its ``signal_id``."""

    run_id: str
    name: str
    seq: int
    signal_id: str
    #: Set when no step of the run waits for this name: what the run waits for.
    warning: str | None = None


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
