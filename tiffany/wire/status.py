"""The run and step status vocabulary: one definition the store, API, SDK and CLI import.

A run's status is a :class:`RunStatus` where code compares and stores it
(the store's column and its check constraint, the projector's fold), and a
:data:`RunStatusName` where a schema or a signature takes the plain string
(the API's and the SDK's ``status: Literal[...]``, so the OpenAPI schema
lists the values inline and a caller passes ``"failed"``). The two list
the same values in the same order; tests/wire/test_status.py holds them to
it.

Discussion:
    Why both: a ``Literal`` cannot be built from an enum in a way mypy
    follows, and an enum in a pydantic model becomes a ``$ref`` in the
    schema, and in a signature refuses a plain string under mypy.
"""

from __future__ import annotations

import enum
from typing import Final, Literal

__all__ = ["TERMINAL", "RunStatus", "RunStatusName", "StepStatus"]


class RunStatus(enum.StrEnum):
    """Where a run is (the API's ``status``).

    ``waiting``: every live step waits for a client's signal or an operator
    (a step held for its tool or function): the run needs someone, and its
    ``waiting_for`` says what for (``tiffany/store/waits.py``).
    """

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: A run's status as a plain string (the values of :class:`RunStatus`, in order).
RunStatusName = Literal["pending", "running", "waiting", "succeeded", "failed", "cancelled"]

#: The statuses of a run that has ended: it changes no more.
TERMINAL: Final[frozenset[RunStatus]] = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
)


class StepStatus(enum.StrEnum):
    """A plan step's status (the planner's names)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
