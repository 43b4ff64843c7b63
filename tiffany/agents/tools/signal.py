"""``signal.wait``: wait for a signal sent to the run (human approval, a webhook).

``{"tool": "signal.wait", "args": {"name": "approve", "timeout_s": 3600}}``
waits until ``POST /api/runs/{run_id}/signals/approve`` (or ``tiffany
signal RUN approve --data JSON``) sends one, and outputs the signal's JSON
payload. A signal sent before the step waits is kept for it, and each
signal is taken by one wait (oldest first), as Temporal's signals are.

Not a durable *step*: it runs in the worker task itself, and the journal
records the wait (a ``Receive`` dispatch) and the signal (a WAKE record of
the run, written before the sender's 202). A replay hands the recorded
signal back at the same point, and an engine killed while the step waits
resumes the wait on restart, with what is left of the timeout. When the
timeout passes first the step fails with ``signal.timeout`` (its
``retries`` and ``continue_on_error`` apply: a retry waits again).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from pydantic import Field, field_validator

from tiffany.agents.tools.base import FreeFormOutput, ToolArgs, ToolContext, ToolError
from tiffany.documents import SIGNAL_NAME_PATTERN
from tiffany.errors import WaitTimeout
from tiffany.kernel import Coroutine, Receive
from tiffany.records import reserved_signal, reserved_signal_message

__all__ = [
    "MAX_SIGNAL_WAIT_S",
    "SignalTimeout",
    "SignalWaitArgs",
    "SignalWaitOutput",
    "SignalWaitTool",
]

#: Longest a step may wait for a signal, in seconds (a year).
MAX_SIGNAL_WAIT_S: Final = 366 * 86_400.0


class SignalTimeout(ToolError):
    """No signal of the name came within the step's ``timeout_s``."""

    code = "signal.timeout"


class SignalWaitArgs(ToolArgs):
    """Arguments of ``signal.wait``: the signal's ``name``; ``timeout_s`` (none: wait for ever)."""

    name: str = Field(
        pattern=SIGNAL_NAME_PATTERN,
        description=(
            "The signal to wait for (names starting with child:, concurrency. or tiffany. "
            "are the engine's)."
        ),
    )
    timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_SIGNAL_WAIT_S, description="Fail the step after this long."
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        # A wait on the engine's own signal would take a sub-plan's end, or a
        # run's slot, from the step or planner it is meant for.
        if reserved_signal(name) is not None:
            raise ValueError(reserved_signal_message(name))
        return name


class SignalWaitOutput(FreeFormOutput):
    """Free-form: the signal's payload, any JSON value its sender gave."""


class SignalWaitTool:
    """Wait for signal ``name``; output its payload."""

    name: ClassVar[str] = "signal.wait"
    Args: ClassVar[type[ToolArgs]] = SignalWaitArgs
    Output: ClassVar[type[FreeFormOutput]] = SignalWaitOutput
    durable: ClassVar[bool] = False

    def run(self, args: SignalWaitArgs, ctx: ToolContext) -> Coroutine:
        """Receive the signal in the worker task (journaled; see the module docstring)."""
        try:
            payload: Any = yield Receive(args.name, args.timeout_s)
        except WaitTimeout:
            raise SignalTimeout(
                f"no signal {args.name!r} came within {args.timeout_s} s",
                signal=args.name,
                timeout_s=args.timeout_s,
            ) from None
        return payload
