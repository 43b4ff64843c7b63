"""The activity instrument: every dispatch becomes a PAL event (a replayed one does not).

It runs on the scheduler thread, so it only builds a small tuple and appends
it to the hub's inbox (never blocks, never encodes); the hub's thread does
the rest. Run and run-local task ids, the task's role and plan step come
from the journal's note on each task (``Task.meta``: the label its SPAWN
record holds), never from its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tiffany.durable.gate import HeldStep
from tiffany.durable.journal import TaskMeta
from tiffany.durable.replayer import call_site
from tiffany.feed import Hub
from tiffany.feed.events import TaskFields
from tiffany.kernel import RETURNED, Instrument, SystemCall, Task
from tiffany.wire.runstate import step_report
from tiffany.wire.status import TaskState, status_of
from tiffany.wire.values import text_of

__all__ = ["ActivityLog"]


def _label(call: Any) -> str:
    if call is None:
        return "yield"
    if call is RETURNED:
        return "return"
    if isinstance(call, SystemCall):
        f = call.fields()
        if call.kind == "sleep":
            return f"sleep {f['seconds']:g}s"
        if call.kind in ("wait_task", "kill_task"):
            return f"{call.kind} {f['tid']}"
        if call.kind in ("step", "run_in_thread"):
            return f"{call.kind} {text_of(f['fn'])}"
        if call.kind == "receive":
            return f"waiting for signal {text_of(f['channel'])}"
        return call.kind
    return f"call {getattr(call, '__qualname__', type(call).__name__)}"


#: The most characters of a failed step's error message an ``exit`` event carries.
ERROR_MESSAGE_CHARS: Final = 500


def _step_outcome(result: Any) -> dict[str, Any] | None:
    """A worker's ``exit`` data: its step's ``ok``, attempts, and error (short), or None.

    ``result`` is the worker's outcome: a dict (journal version 3 on), or a
    ``StepOutcome``. A failed step's error, so that ``tail`` says why a
    ``python`` step (which has no tool task of its own) failed.
    """
    report = step_report(result)
    ok = None if report is None else report.ok
    if report is None or not isinstance(ok, bool):
        return None
    data: dict[str, Any] = {"ok": ok}
    attempts = report.attempts
    if isinstance(attempts, list):
        data["attempts"] = len(attempts)
    error = report.error
    if not ok and isinstance(error, Mapping):
        data["error"] = {
            k: text_of(error[k])[:ERROR_MESSAGE_CHARS]
            for k in ("code", "type", "message")
            if error.get(k)
        }
    return data


class ActivityLog(Instrument):
    """Publish task activity to a :class:`~tiffany.feed.Hub`."""

    def __init__(self, hub: Hub, *, dispatches: bool = True, runs_only: bool = False) -> None:
        self.hub = hub
        self.dispatches = dispatches
        #: Publish only tasks that belong to a run (not the engine's own tasks).
        self.runs_only = runs_only
        #: Dispatches seen (every task step, published or not).
        self.dispatched = 0
        #: Each live task's encoded ids, with the note they were made from.
        self._fields: dict[int, tuple[Any, TaskFields]] = {}

    def _ids(self, task: Task) -> TaskFields | None:
        """The task's encoded ids, or None when it publishes nothing (now).

        Discussion: a run being replayed (recovery at start, before it goes
        live) re-runs dispatches whose events went out in its first life;
        published again, with new seqs, a reader of the feed saw every
        finished step start and finish twice after each restart. They are
        not published, as they are not journaled again.
        """
        meta = task.meta
        if meta.__class__ is TaskMeta and meta.run.replay is not None:
            return None
        known = self._fields.get(task.id)
        if known is not None and known[0] is meta:
            return known[1]
        if isinstance(meta, TaskMeta):
            ltid = meta.ltid if meta.ltid >= 0 else None
            label = meta.label
            ids = TaskFields(task.id, ltid, meta.run.run_id, task.name, label.role, label.step_id)
        elif self.runs_only:
            return None
        else:
            ids = TaskFields(task.id, None, None, task.name, "task", None)
        self._fields[task.id] = (meta, ids)
        return ids

    def task_spawned(self, task: Task) -> None:
        """Publish ``spawned`` (and ``tool.started`` for tool tasks)."""
        ids = self._ids(task)
        if ids is None:
            return
        data = {"parent": task.parent}
        self.hub.publish_task("spawned", ids, f"spawned {task.name}", data)
        if ids.task_kind == "tool":
            self.hub.publish_task("tool.started", ids, task.name, data)

    def after_dispatch(self, task: Task, yielded: Any) -> None:
        """Publish ``step`` with what the task yielded.

        A workflow's call or step (a task of role ``task``: a workflow's
        function and the tasks it spawned) carries where the user's code
        yielded it, ``data.source`` (``path:line (function)``): the run
        page shows it beside the call. Not journaled (a line is not part
        of what a replay compares); a plan's tasks never pay for the walk.
        """
        self.dispatched += 1
        if self.dispatches:
            ids = self._ids(task)
            if ids is not None:
                source = call_site(task, yielded) if ids.task_kind == "task" else None
                data = None if source is None else {"source": source}
                self.hub.publish_task("step", ids, _label(yielded), data)

    def task_blocked(self, task: Task, call: SystemCall) -> None:
        """Publish ``blocked`` with the reason."""
        ids = self._ids(task)
        if ids is not None:
            self.hub.publish_task("blocked", ids, _label(call), {"state": task.state.value})

    def step_held(self, task: Task, held: HeldStep) -> None:
        """Publish ``blocked``: the journal held a step back (``JournalInstrument.on_hold``)."""
        ids = self._ids(task)
        if ids is not None:
            data = {"state": "waiting", "step": held.step, "reason": held.reason}
            self.hub.publish_task("blocked", ids, f"waiting: {held.reason}", data)

    def task_woken(self, task: Task, value: Any) -> None:
        """Publish ``woke``."""
        ids = self._ids(task)
        if ids is not None:
            self.hub.publish_task("woke", ids, "woke")

    def task_exited(self, task: Task) -> None:
        """Publish ``exit`` or ``cancelled`` (and ``tool.finished``, ``run.finished``)."""
        ids = self._ids(task)
        if ids is None:
            return
        del self._fields[task.id]  # its last events
        kind = "cancelled" if task.state.value == TaskState.CANCELLED else "exit"
        data = None
        if ids.task_kind == "worker":  # a worker ends well whether its step did or not
            data = _step_outcome(task.result)
        self.hub.publish_task(kind, ids, task.state.value, data)
        self._finished(task, ids, ok=kind == "exit")

    def task_crashed(self, task: Task, error: BaseException) -> None:
        """Publish ``crash`` with the error."""
        ids = self._ids(task)
        if ids is None:
            return
        del self._fields[task.id]
        err = {"type": type(error).__name__, "message": text_of(error)[:500]}
        self.hub.publish_task("crash", ids, f"{err['type']}: {err['message'][:80]}", err)
        self._finished(task, ids, ok=False, error=err)

    def _finished(
        self, task: Task, ids: TaskFields, ok: bool, error: Mapping[str, Any] | None = None
    ) -> None:
        data = {"ok": ok, "error": dict(error) if error else None}
        if ids.task_kind == "tool":
            self.hub.publish_task("tool.finished", ids, task.name, data)
        meta = task.meta
        if isinstance(meta, TaskMeta) and meta.run.root is task:
            # The run's own word (succeeded, failed, cancelled), as the store and
            # the dashboard say it; the task events keep the kernel's.
            label = status_of(task.state.value)
            self.hub.publish_task("run.finished", ids, label, data)
