"""What ``tiffany tail`` prints: a run's steps by default, every dispatch with ``--kernel``.

The activity feed (``tiffany/feed/events.py``, schema v2) has an event per
kernel dispatch: a three-step plan makes some fifty (``queue_get``,
``blocked``, ``woke``, ``now``, ``return``...), which is the kernel's
story, not the run's. By default ``tail`` keeps the events a person follows
a run by, and prints each as one line:

    run started     NAME (KIND)         (plan, workflow...)
    step started    STEP
    step retrying   STEP  attempt N failed; next in D s
    step finished   STEP  DURATION
    step failed     STEP  DURATION, N attempts: ERROR
    step cancelled  STEP
    step waiting    STEP  REASON        (the journal holds it: a disabled tool, a rate limit)
    signal          NAME
    run finished    succeeded | failed | cancelled  DURATION
    store           N record(s) quarantined...

A step is a plan step's worker task (``task_kind`` ``worker``); its
duration runs from its ``spawned`` event to its end (retries and their
back-off included), as the feed's ``ts`` tell it (display only: a step
whose start left the feed's ring before ``tail`` read it has none).
``--kernel`` prints every event, as ``tail`` always did. ``--json``
prints the same selection as feed frames, unchanged (schema v2), one a
line. Control frames (``gone``, ``cutoff``) are always printed.

Invariants:
    - One rule decides what is step-level (:func:`step_level`), for the
      text lines and ``--json`` alike, for the engine's feed socket and
      ``--url``'s websocket alike.
    - What the view remembers of a run (its start, its live steps' starts)
      is dropped at its ``run.finished``: a ``tail`` left running for days
      holds only the runs in flight.

Rejected: filtering in the engine (a ``steps`` option of the feed
subscription): the API relay, the dashboard and the SDK read the same
feed, and the selection is a display choice of this one client.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any, Final

from tiffany.cli.remote import printable, show_event

__all__ = ["TailView", "duration", "step_level"]

#: Events of the run as a whole, always step-level.
_RUN_KINDS: Final = frozenset(
    {"run.started", "run.finished", "retry", "signal", "store.quarantined"}
)
#: A worker's (a plan step's) events that are step-level.
_STEP_KINDS: Final = frozenset({"spawned", "exit", "crash", "cancelled", "blocked"})


def step_level(frame: Mapping[str, Any]) -> bool:
    """Whether ``tail`` shows ``frame`` without ``--kernel``.

    Control frames, the run's own events (start, end, retries, signals),
    and a plan step's start, end, and the journal holding it back.
    """
    if "seq" not in frame:
        return True  # a control frame: gone, cutoff
    kind = frame.get("kind")
    if kind in _RUN_KINDS:
        return True
    if frame.get("task_kind") != "worker" or kind not in _STEP_KINDS:
        return False
    # A worker blocks on every step it waits for; only the journal's hold says why.
    return kind != "blocked" or (frame.get("data") or {}).get("state") == "waiting"


def duration(seconds: float) -> str:
    """``12 ms``, ``3.4 s``, ``2m05s``, ``1h02m``: a step's or run's time, for people."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


class TailView:
    """Print feed frames as ``tail`` does: step-level lines, or every event (``kernel``).

    Args:
        kernel: Every event, one line each, as the feed has them.
        as_json: Frames as JSON lines (the selection ``kernel`` says).
    """

    def __init__(self, *, kernel: bool = False, as_json: bool = False) -> None:
        self.kernel = kernel
        self.as_json = as_json
        #: When each run in flight started (its ``run.started``'s ``ts``).
        self._runs: dict[str, float] = {}
        #: When each live step's worker started: run id -> task id -> ``ts``.
        self._steps: dict[str, dict[int, float]] = {}

    def show(self, frame: Mapping[str, Any]) -> None:
        """Print ``frame`` if this view shows it."""
        if self.kernel:
            show_event(dict(frame), self.as_json)
            return
        if not step_level(frame):
            return
        line = self._line(frame)  # with --json too: the view's memory follows the runs
        if self.as_json:
            line = json.dumps(frame)
        elif line is None:
            line = f"-- {printable(frame)}"
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def _line(self, frame: Mapping[str, Any]) -> str | None:
        """The step-level line of an event (None for a control frame)."""
        if "seq" not in frame:
            return None
        kind, ts = frame.get("kind"), frame.get("ts")
        at = float(ts) if isinstance(ts, int | float) else 0.0
        run = str(frame.get("run_id") or "-")
        data = frame.get("data") or {}
        label = str(frame.get("label") or "")
        step = str(frame.get("step_id") or data.get("step") or "")
        task = int(frame.get("task_id") or 0)
        if kind in ("run.started", "run.finished"):
            event, detail = self._run_event(kind, run, at, data, label)
        elif kind in _LIVE_EVENTS:
            event, detail = self._live_event(str(kind), run, at, task, data, label, step)
        else:  # the worker ended: exit (its step's outcome in data.ok), crash, cancelled
            began = self._steps.get(run, {}).pop(task, None)
            event, detail = _ended_event(kind, data, step + self._took(began, at))
        return f"{_when(ts)}  {printable(run):<18} {event:<15} {printable(detail)}"

    def _run_event(
        self, kind: Any, run: str, at: float, data: Mapping[str, Any], label: str
    ) -> tuple[str, str]:
        """``run started`` (its name and kind) or ``run finished`` (its time, its error)."""
        if kind == "run.started":
            self._runs[run] = at
            detail = str(data.get("name") or label)
            if data.get("kind"):  # a plan or a workflow, said as the runs list says it
                detail += f" ({data['kind']})"
            return "run started", detail
        began = self._runs.pop(run, None)
        self._steps.pop(run, None)
        detail = label + self._took(began, at)
        error = data.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            detail += f": {_error_text(error)}"
        return "run finished", detail

    def _live_event(
        self,
        kind: str,
        run: str,
        at: float,
        task: int,
        data: Mapping[str, Any],
        label: str,
        step: str,
    ) -> tuple[str, str]:
        """A step started, waiting or retrying; a signal; the store's quarantine."""
        if kind == "spawned":
            self._steps.setdefault(run, {})[task] = at
            return "step started", step
        if kind == "blocked":
            return "step waiting", f"{step}  {data.get('reason') or label}"
        if kind == "retry":
            attempt, delay = data.get("attempt"), data.get("delay_s")
            return "step retrying", f"{step}  attempt {attempt} failed; next in {delay} s"
        if kind == "signal":
            return "signal", str(data.get("name") or label)
        return "store", label  # store.quarantined

    @staticmethod
    def _took(began: float | None, at: float) -> str:
        return f"  {duration(at - began)}" if began is not None and at >= began else ""


#: Events of a live run that are neither its start and end nor a worker's end.
_LIVE_EVENTS = frozenset({"spawned", "blocked", "retry", "signal", "store.quarantined"})


def _ended_event(kind: Any, data: Mapping[str, Any], detail: str) -> tuple[str, str]:
    """A worker's end: its step cancelled, failed (attempts, the error) or finished."""
    if kind == "cancelled":
        return "step cancelled", detail
    if kind == "crash" or data.get("ok") is False:
        attempts = data.get("attempts")
        if isinstance(attempts, int) and attempts > 1:
            detail += f", {attempts} attempts"
        error = data if kind == "crash" else data.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            detail += f": {_error_text(error)}"
        return "step failed", detail
    return "step finished", detail


def _error_text(error: Mapping[str, Any]) -> str:
    """``Type: message`` (the code first when the error has one)."""
    head = str(error.get("code") or error.get("type") or "error")
    return f"{head}: {error.get('message')}"


def _when(ts: Any) -> str:
    """The event's local time, ``HH:MM:SS.mmm`` (``-`` if it has none)."""
    if not isinstance(ts, int | float) or ts <= 0:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"
