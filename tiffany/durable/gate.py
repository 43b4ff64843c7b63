"""The step gate: an engine setting that may hold a step back instead of starting it.

Some things an operator decides per engine, not per run: which tools this
engine may run is one. Such a setting must not change what a run's code
yields (it is not part of the run's history, so a replay on an engine set
differently would diverge from its journal). The durable layer therefore
offers one port where a setting may act: the moment a step's effect would
leave the process. ``JournalInstrument.step_gate(task, call)`` is asked when a live
step would start (a fresh ``Step`` past the end of the journal, or a step
restarted at go-live after a crash); ``None`` lets it start, a string is why
it must wait.

A held step is not started and no STEP_START is written: its dispatch is
journaled by an explicit DISPATCH record when it is a fresh one, a HOLD
record tells readers why the step waits (see ``records.py``), and the task
stays parked. The engine's next start replays the run: the step is parked
like any step that was dispatched and not finished, and go-live asks the
gate again; with the tool enabled it starts. Its attempt number counts
only the starts the journal recorded, so a step that was held and never
started is not a re-run.

Invariants:

* The gate never changes a run's history: the code yields the same calls
  whatever it answers; only whether a step's effect starts, and when,
  depends on it.
* A held step has no STEP_START: nothing of it left the process.

Discussion: rejected, failing the step when its tool is disabled (what the
worker did when ``ToolRegistry.get`` raised). Live, that turns an
operator's configuration into a run's permanent failure; on replay, the
worker that dispatched the step in the journal raised instead, and the run
failed with a nondeterminism error. Rejected too, a gate in the worker
(asking the registry and waiting on an event): the wait would be part of
the run's history, and a later engine with the tool enabled would replay a
different sequence of calls.

Discussion: the gate is generic (a callable on the task and its step);
which tool a step belongs to is the engine's business (it reads the step's
name: see ``ToolRegistry.tool_of_step``). Tools that are not durable
(``sleep``) run inside the worker, without a ``Step``: nothing of theirs
leaves the process, so they need no gate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiffany.kernel import RunInThread, Step, Task

__all__ = ["HeldStep", "StepGate"]

#: ``gate(task, call)``: None lets the step start; a string is why it must wait.
StepGate = Callable[[Task, Step | RunInThread], str | None]


@dataclass(frozen=True, slots=True)
class HeldStep:
    """A step the gate held back (as the engine's status shows it)."""

    run_id: str
    ltid: int
    task: str  # the task's name (``tool:TOOL:STEP`` or ``worker:STEP`` in a plan)
    ordinal: int
    step: str  # the step's name in the journal
    reason: str
    step_id: str | None = None  # the plan step its task serves (the task's SPAWN label)

    def to_dict(self) -> dict[str, Any]:
        """Return the held step as JSON-able data."""
        return {
            "run_id": self.run_id,
            "task": self.task,
            "ltid": self.ltid,
            "step": self.step,
            "reason": self.reason,
        }
