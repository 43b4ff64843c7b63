"""The HTTP API's bodies and answers: one set of pydantic models, the API's and the SDK's.

The API validates and documents with them (``/openapi.json`` is built from
them: ``tiffany/api/schemas.py`` re-exports them for its routes); the SDK
(:mod:`tiffany.sdk`) reads its answers into them. They live here, in the
wire, because both sides import them: a client needs pydantic, never
FastAPI or the server's modules.

The answers mirror :mod:`tiffany.store.queries` (``run_summary``,
``run_detail``, ``run_records``); those the store lets grow allow extra
fields, so a field the store adds reaches clients (as an attribute of the
SDK's answer) without a change here. The others (``extra`` left at
pydantic's default) ignore an unknown field: a newer server's answer still
validates in an older client.

A client's conveniences (``RunSummary.finished``, iterating a
``RunList``, ``RunDetail.step``) are methods here: they add nothing to the
schema.

Rejected: a second copy of these models in the SDK, held to the served
document by a test: two definitions drift between a change and its test,
and the copy existed only because ``tiffany.api`` imported FastAPI.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from tiffany.wire.plan import BudgetSpec, ConcurrencySpec, Plan, StepSpec
from tiffany.wire.status import TERMINAL, RunStatusName

__all__ = [
    "FINISHED",
    "AgentConversation",
    "AgentToolCall",
    "AgentTurn",
    "BudgetSpec",
    "CancelAnswer",
    "ConcurrencySpec",
    "ErrorBody",
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
    "Plan",
    "Readiness",
    "RerunRequest",
    "RunDetail",
    "RunEvents",
    "RunList",
    "RunSummary",
    "RunWaits",
    "ScheduleList",
    "ScheduleOut",
    "ScheduleRequest",
    "SignalAnswer",
    "SignalWait",
    "StepOut",
    "StepSpec",
    "SubmitAnswer",
    "SubmitRequest",
    "TaskOut",
    "Vocabulary",
    "WaitingFor",
    "WorkflowSubmitRequest",
]


#: The statuses of a run that has ended (:data:`tiffany.wire.status.TERMINAL`).
FINISHED: Final[frozenset[str]] = TERMINAL


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- a plan ---------------------------------------------------------------------------
#
# The plan's models are the engine's own (``tiffany/wire/plan.py``, which the
# engine validates with): re-exported here for the schema, and validating
# nothing in this process. What a schema cannot say is checked by the engine,
# and refused as 422 ``plan.invalid`` naming the field: unknown or disabled
# tools, a tool's arguments, duplicate step ids, ``after`` naming an unknown
# step, cycles, references to steps not upstream.


#: A plan sent as text, parsed by the server (then checked as a plan).
_PlanText = Annotated[
    str,
    WithJsonSchema(
        {
            "type": "string",
            "contentMediaType": "application/yaml",
            "description": "The plan's JSON or YAML text (JSON is YAML).",
        }
    ),
]


class SubmitRequest(BaseModel):
    """A submission: a plan and the caller's inputs.

    The body may also be the bare plan (an object with ``steps``), and it may
    be sent as YAML (``Content-Type: application/yaml``).
    """

    model_config = ConfigDict(extra="forbid")

    plan: Plan | _PlanText = Field(
        description="The plan: an object, or its JSON or YAML text.",
        examples=[
            {
                "name": "hello",
                "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.1}}],
            }
        ],
    )
    inputs: dict[str, Any] | None = Field(
        default=None, description="Inputs, merged over the plan's own (null: none)."
    )


class WorkflowSubmitRequest(BaseModel):
    """A submission of a workflow: a ``@workflow`` function the server registered, by name.

    The server registers a workflow by importing its module (``--import
    MOD`` or ``TIFFANY_TOOL_MODULES``); an unknown name is a 422 naming
    ``workflow`` and the registered names. The inputs are the function's
    keyword arguments, checked against its signature (422 naming ``inputs.NAME``).
    """

    model_config = ConfigDict(extra="forbid")

    workflow: str = Field(
        min_length=1, max_length=100, description="The workflow's registered name."
    )
    inputs: dict[str, Any] | None = Field(
        default=None, description="The function's keyword arguments (null: none)."
    )


class SubmitAnswer(BaseModel):
    """The run a submission started (or named, for a repeated Idempotency-Key)."""

    run_id: str
    seq: int = Field(
        description=(
            "The WAL seq of the run's first record (RUN_START); pass it as ``min_seq`` "
            "to read the run back without a 404. The same for a repeated Idempotency-Key."
        )
    )
    created: bool = Field(
        default=True, description="False when the Idempotency-Key named an earlier submission."
    )


class WaitingFor(_Open):
    """One task of a run that waits for a person: a client's signal, or an operator."""

    kind: Literal["signal", "tool", "function"] = Field(
        description=(
            "``signal``: a ``signal.wait`` (or a workflow's ``signal()``) waits for a client "
            "to send it; ``tool`` / ``function``: the engine holds the step until an operator "
            "enables the tool (``--enable-tool``) or registers the python function."
        )
    )
    name: str = Field(description="The signal's, tool's or function's name.")
    step: str | None = Field(default=None, description="The plan step that waits (a plan run).")
    task: int = Field(description="The waiting task's ``ltid``.")
    reason: str | None = Field(default=None, description="Why the engine holds the step.")


class RunSummary(_Open):
    """A run as the runs list shows it."""

    run_id: str
    run_no: int
    #: The engine that runs it (``serve --engines N``); run numbers are per engine.
    engine: int = 0
    name: str
    status: RunStatusName = Field(
        description=(
            "``waiting``: every live step waits for a client's signal or an operator "
            "(``waiting_for`` says what for): the run needs someone."
        )
    )
    kind: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    updated_at: float | None = None
    dispatches: int = 0
    #: The WAL seq of the run's last projected record.
    last_seq: int | None = None
    waiting_for: list[WaitingFor] = Field(
        default_factory=list,
        description=(
            "What its waiting tasks wait for, oldest first (also while other steps run: "
            "the run is ``waiting`` once all its live steps wait)."
        ),
    )

    @property
    def finished(self) -> bool:
        """True once the run has ended (succeeded, failed or cancelled)."""
        return self.status in FINISHED


class RunList(BaseModel):
    """A page of runs, newest first, and how many runs have each status."""

    # Iterating it (and ``len``) goes over its runs: ``for run in client.list(): ...``.
    # (A comment, not the docstring: the docstring is the schema's description.)

    runs: list[RunSummary]
    counts: dict[str, int]
    next_before: int | None = Field(
        description="Pass as ``before`` for the next page; null on the last page."
    )

    def __iter__(self) -> Iterator[RunSummary]:  # type: ignore[override]
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)


class StepOut(_Open):
    """A plan step of a run."""

    step_id: str
    position: int
    tool: str | None = None
    status: str
    attempts: list[Any] = Field(default_factory=list)
    output: Any = None
    error: Any = None
    started_at: float | None = None
    ended_at: float | None = None
    #: Why the step waits instead of running (its tool is disabled on the engine).
    waiting: str | None = None
    #: The WAL seq of the last record that changed the step.
    last_seq: int | None = None
    #: Read with ``outputs=false``: the size of the output left out (characters of JSON).
    output_size: int | None = None
    after: list[str] = Field(
        default_factory=list,
        description="The steps it runs after (a dynamic step's children: their parent too).",
    )
    added_by: str | None = Field(
        default=None, description="The dynamic step whose output added it (null: the plan's)."
    )
    dynamic: bool = Field(default=False, description="Its output's ``steps`` extend the plan.")


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
    #: The WAL seq of the last record that changed the task.
    last_seq: int | None = None
    #: Read with ``outputs=false``: the size of the result left out (characters of JSON).
    result_size: int | None = None


class RunDetail(RunSummary):
    """A run with its entry, inputs, outputs, error, steps and tasks."""

    entry: Any = None
    inputs: Any = None
    outputs: Any = None
    error: Any = None
    usage: dict[str, float] | None = Field(
        default=None, description="A plan with a budget: its model tokens and dollars."
    )
    steps: list[StepOut] = Field(default_factory=list)
    tasks: list[TaskOut] = Field(default_factory=list)
    #: Read with ``outputs=false``: the size of the outputs left out (characters of JSON).
    outputs_size: int | None = None

    def step(self, step_id: str) -> StepOut:
        """Return the step ``step_id`` (a KeyError naming the steps there are if none)."""
        for step in self.steps:
            if step.step_id == step_id:
                return step
        known = ", ".join(s.step_id for s in self.steps) or "none"
        raise KeyError(f"run {self.run_id} has no step {step_id!r} (steps: {known})")


class AgentToolCall(_Open):
    """A tool call the model asked for in a turn, and what it returned."""

    id: str | None = None
    tool: str | None = Field(default=None, description="The tool the model named.")
    arguments: Any = Field(default=None, description="The arguments the model gave.")
    ltid: int | None = Field(
        default=None, description="The task that ran it; null: none ran (refused, or inline)."
    )
    status: str | None = Field(default=None, description="Its task's status, in the run's words.")
    ok: bool | None = Field(default=None, description="False: refused or failed (null: unknown).")
    result: Any = Field(default=None, description="What the tool returned (its journaled output).")
    error: Any = None


class AgentTurn(_Open):
    """One model call of an agent step: its text, tool calls, tokens and cost."""

    attempt: int = Field(description="The step's attempt (a retry starts again at turn 1).")
    turn: int
    ltid: int = Field(description="The model call's task.")
    status: str
    model: str | None = None
    text: str | None = Field(default=None, description="The model's reply (null until it came).")
    usage: dict[str, Any] | None = Field(default=None, description="The call's tokens.")
    cost_usd: float | None = None
    error: Any = None
    tool_calls: list[AgentToolCall] = Field(default_factory=list)


class AgentConversation(_Open):
    """An ``agent`` step's conversation, from its journaled model and tool calls."""

    run_id: str
    step_id: str
    status: str = Field(description="The step's status.")
    args: Any = Field(default=None, description="The step's declared args (its goal, a template).")
    answer: str | None = Field(default=None, description="The final answer, once it came.")
    usage: dict[str, Any] | None = Field(default=None, description="Tokens of every call, summed.")
    cost_usd: float | None = None
    turns: list[AgentTurn]


class JournalRecordOut(_Open):
    """One journal record of a run, decoded (fields named in ``data``)."""

    seq: int
    type: str
    ltid: int | None = None
    data: Any = None


class RunEvents(BaseModel):
    """A page of a run's journal records."""

    run_id: str
    records: list[JournalRecordOut]
    next_after: int | None = Field(
        description="Pass as ``after`` for the next page; null on the last page."
    )


class CancelAnswer(BaseModel):
    """A cancellation was requested; the run ends ``cancelled`` shortly."""

    run_id: str
    status: Literal["cancelling"] = "cancelling"


class RerunRequest(BaseModel):
    """A re-run of a finished run: where to restart, and inputs to change."""

    model_config = ConfigDict(extra="forbid")

    from_step: str | None = Field(
        default=None,
        description=(
            "Restart at this step and every step downstream of it; the others reuse the "
            "earlier run's outputs. Default: the steps that failed."
        ),
    )
    inputs: dict[str, Any] | None = Field(
        default=None, description="Inputs that replace the earlier run's (the others are kept)."
    )


class SignalWait(BaseModel):
    """A signal a running run's task waits for now, and the payload schema its wait declared."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    name: str
    payload_schema: dict[str, Any] | None = Field(
        default=None,
        alias="schema",
        description=(
            "The JSON Schema a payload must satisfy (a plan's signal.wait step's, or told "
            "by a workflow's signal(...) as its code reached it); null: any payload."
        ),
    )


class RunWaits(BaseModel):
    """What a running run waits for now, as its engine knows it (schemas included)."""

    run_id: str
    signals: list[SignalWait] = Field(description="By name, each once; empty: none waits.")


class SignalAnswer(BaseModel):
    """A signal was journaled for the run (durable: it will be delivered, across a crash)."""

    run_id: str
    name: str
    seq: int = Field(
        description=(
            "The WAL seq of the signal's record; pass it as ``min_seq`` to read the run "
            "as of at least the signal. The same for a repeated Idempotency-Key."
        )
    )
    signal_id: str = Field(
        description=(
            "The signal's id: the Idempotency-Key when one was sent (a signal sent again "
            "with the same key is journaled once), otherwise a new one."
        )
    )
    warning: str | None = Field(
        default=None,
        description=(
            "Set when no step of the run waits for this name (a typo, or a wait a later "
            "step adds): the signal is kept all the same; the warning names what the run "
            "waits for."
        ),
    )


class Readiness(BaseModel):
    """Whether the engine takes work (``/readyz``)."""

    ready: bool
    reason: str | None = None
    #: The projector's health: ``last_seq``, ``lag_records``, ``dead_letters``,
    #: ``consecutive_errors``, ``last_error``, ``stalled``, ``stalled_reason``;
    #: with several engines (``serve --engines N``), one such object an engine.
    store: dict[str, Any] | list[dict[str, Any]] | None = None


# -- schedules ------------------------------------------------------------------------


def _same(value: Any) -> Any:
    return value


class ScheduleRequest(BaseModel):
    """A schedule: a plan or a workflow, its inputs, when (cron, time zone), missed ticks.

    One of ``plan`` and ``workflow`` (the API refuses both or neither, 422
    naming ``workflow``): a tick submits it as ``POST /api/runs`` would. The
    schema says so too (``oneOf``), so a client generated from it knows.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["plan"],
                    "properties": {"plan": {"type": "object"}, "workflow": {"type": "null"}},
                },
                {
                    "required": ["workflow"],
                    "properties": {"workflow": {"type": "string"}, "plan": {"type": "null"}},
                },
            ]
        },
    )

    # Any object here (the engine checks the plan, 422 plan.invalid naming the
    # field); the schema describes it as a plan.
    plan: Annotated[
        dict[str, Any] | None, BeforeValidator(_same, json_schema_input_type=Plan | None)
    ] = Field(default=None, description="The plan each tick runs (or a workflow).")
    workflow: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="The registered @workflow each tick runs, by name (instead of a plan).",
    )
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
    plan: dict[str, Any] | None = Field(description="The plan each tick runs (null: a workflow).")
    workflow: str | None = Field(default=None, description="The workflow each tick runs, or null.")
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
    next_ticks: list[float] = Field(
        default_factory=list,
        description="The next few ticks (epoch s), the first being ``next_tick``; none if paused.",
    )


class ScheduleList(BaseModel):
    """A page of schedules, oldest first."""

    schedules: list[ScheduleOut]
    next_after: str | None = Field(
        description="Pass as ``after`` for the next page; null on the last page."
    )


# -- memory ----------------------------------------------------------------------------
#
# The MemoryStore's answers (``tiffany/memory``, docs/memory.md) as the API
# serves them: items in namespaces, their versions and links, search hits.
# Times are ISO-8601 UTC strings, as the store gives them. The models the
# store lets grow allow extra fields.


class MemoryNamespace(_Open):
    """A namespace of the memory: how many items and bytes it holds, when it last changed."""

    namespace: str
    items: int
    bytes: int = 0
    updated_at: str | None = None


class MemoryNamespaces(BaseModel):
    """Every namespace that holds items."""

    namespaces: list[MemoryNamespace]


class MemoryEmbedder(_Open):
    """The embedder that made a search's vectors (``kind`` says what it is: a model or offline)."""

    id: str
    dims: int
    kind: str


class MemoryRef(_Open):
    """An item's address: its namespace and key."""

    namespace: str
    key: str


class MemoryItem(_Open):
    """An item of the memory: its JSON value, the text indexed, and the run step that wrote it."""

    namespace: str
    key: str
    value: Any = None
    text: str | None = None
    version: int = 1
    created_at: str | None = None
    updated_at: str | None = None
    run_id: str | None = Field(default=None, description="The run that wrote it (null: not a run).")
    step_id: str | None = None
    expires_at: str | None = Field(default=None, description="When it expires (null: never).")


class MemoryItems(BaseModel):
    """A page of a namespace's items, by key."""

    items: list[MemoryItem]
    next: str | None = Field(
        default=None, description="Pass as ``after`` for the next page; null on the last page."
    )


class MemoryHit(MemoryItem):
    """A search hit: an item and its score (higher is better)."""

    score: float


class MemorySearch(_Open):
    """A search's hits, best first, with how they were found."""

    items: list[MemoryHit]
    mode: str = Field(
        description="``hybrid`` (full-text and vector, fused), ``text`` or ``vector``."
    )
    embedder: MemoryEmbedder | None = None
    as_of: int | None = Field(default=None, description="The store's write sequence searched.")
    vector_index: str | None = Field(
        default=None,
        description="What ranked the vectors: ``pgvector`` (exact, in PostgreSQL) or ``exact`` "
        "(in the process); null for a text search.",
    )


class MemoryVersion(_Open):
    """One version of an item (a write, or its deletion), oldest first."""

    version: int
    value: Any = None
    text: str | None = None
    op: str | None = Field(default=None, description="The write's exactly-once key.")
    run_id: str | None = None
    step_id: str | None = None
    at: str | None = None
    deleted: bool = False


class MemoryLink(_Open):
    """A link between two items: ``subject`` --``relation``--> ``object``."""

    subject: MemoryRef
    relation: str
    object: MemoryRef
    props: Any = None
    op: str | None = None
    at: str | None = None


class MemoryNeighbor(_Open):
    """An item reached from another along links (``direction``: along the link, or against it)."""

    namespace: str
    key: str
    relation: str
    direction: Literal["out", "in"]
    depth: int = 1
    value: Any = None


class MemoryItemDetail(MemoryItem):
    """An item with its links, its versions and its neighbours."""

    links: list[MemoryLink] = Field(
        default_factory=list, description="Its links either way, oldest first (the first 200)."
    )
    link_count: int | None = Field(default=None, description="How many links it has in all.")
    history: list[MemoryVersion] = Field(
        default_factory=list, description="Its versions, oldest first (the newest 100)."
    )
    versions: int | None = Field(default=None, description="How many versions it has in all.")
    neighbors: list[MemoryNeighbor] = Field(default_factory=list)


class MemoryDeleted(_Open):
    """A deletion, done (or repeated with its Idempotency-Key: the first one's answer)."""

    namespace: str
    key: str
    deleted: bool
    op: str = Field(description="The deletion's exactly-once key (``api:<Idempotency-Key>``).")
    store_seq: int | None = None


class Vocabulary(BaseModel):
    """The status vocabulary (``tiffany/wire/status.py``): what the dashboard reads."""

    run_statuses: list[RunStatusName] = Field(description="A run's statuses, in order.")
    terminal_run_statuses: list[RunStatusName] = Field(
        description="The statuses of a run that has ended."
    )
    step_statuses: list[str] = Field(description="A plan step's statuses.")
    task_states: list[str] = Field(description="A task's states (the kernel's names).")
    terminal_task_states: list[str] = Field(description="The states of a task that has ended.")
    status_of: dict[str, str] = Field(
        description="Each task state (and a cancel's ``cancelling``) in the run's words."
    )
    state_labels: dict[str, str] = Field(
        description="What a running task waits on, said to a person (``blocked_sleep``: sleeping)."
    )


class ErrorBody(_Open):
    """Every error answer: a stable code, a message, and details when there are any."""

    code: str
    message: str
    detail: Any = None
