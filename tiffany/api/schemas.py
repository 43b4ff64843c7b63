"""The HTTP API's bodies and answers, as its routes import them.

They are defined once, in :mod:`tiffany.wire.http`, where the SDK reads them
too (the SDK must not import FastAPI); this module names them for the API's
routes and OpenAPI document.
"""

from __future__ import annotations

from tiffany.wire.http import (
    AgentConversation,
    AgentToolCall,
    AgentTurn,
    BudgetSpec,
    CancelAnswer,
    ConcurrencySpec,
    ErrorBody,
    JournalRecordOut,
    Plan,
    Readiness,
    RerunRequest,
    RunDetail,
    RunEvents,
    RunList,
    RunSummary,
    RunWaits,
    ScheduleList,
    ScheduleOut,
    ScheduleRequest,
    SignalAnswer,
    SignalWait,
    StepOut,
    StepSpec,
    SubmitAnswer,
    SubmitRequest,
    TaskOut,
    Vocabulary,
    WaitingFor,
    WorkflowSubmitRequest,
)

__all__ = [
    "AgentConversation",
    "AgentToolCall",
    "AgentTurn",
    "BudgetSpec",
    "CancelAnswer",
    "ConcurrencySpec",
    "ErrorBody",
    "JournalRecordOut",
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
