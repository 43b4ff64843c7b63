"""The CLI's exit code for each of the engine's refusals (``tiffany/cli/exits.py``): one table.

The codes are those the CLI gave when the engine still refused with HTTP
statuses (``exits.for_status`` of that status), so scripts see no change.
"""

from __future__ import annotations

import pytest

from tiffany.cli import exits
from tiffany.errors import (
    REFUSALS,
    CommandTooLarge,
    EngineFault,
    EngineNotReady,
    InvalidCommand,
    KeyReused,
    MalformedCommand,
    Refusal,
    RunExists,
    RunFinished,
    RunNotFinished,
    RunNotFound,
    SignalBytesHeldFull,
    SignalsHeldFull,
    VerifyTimedOut,
)

#: Each refusal, and the HTTP status it used to carry out of the engine.
WAS: dict[type[Refusal], int] = {
    MalformedCommand: 400,
    RunNotFound: 404,
    RunFinished: 409,
    RunNotFinished: 409,
    RunExists: 409,
    KeyReused: 409,
    CommandTooLarge: 413,
    SignalBytesHeldFull: 413,
    InvalidCommand: 422,
    SignalsHeldFull: 429,
    EngineFault: 500,
    EngineNotReady: 503,
    VerifyTimedOut: 504,
}


@pytest.mark.parametrize("cls", list(WAS), ids=lambda c: c.__name__)
def test_each_refusal_exits_as_its_old_status_did(cls: type[Refusal]) -> None:
    assert exits.for_refusal(cls("no")) == exits.for_status(WAS[cls])


def test_every_concrete_refusal_is_in_the_table() -> None:
    concrete = {c for c in REFUSALS.values() if not c.__subclasses__()}
    assert concrete <= set(WAS)
