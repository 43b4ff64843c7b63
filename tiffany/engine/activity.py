"""The activity instrument: every dispatch becomes a PAL event.

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
from tiffany.kernel import RETURNED, Instrument, SystemCall, Task
from tiffany.pal import Hub

__all__ = ["ActivityLog"]

#: A run's end in the one state vocabulary, from its root task's state.
_RUN_WORD: Final = {"done": "succeeded", "crashed": "failed", "cancelled": "cancelled"}


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
            return f"{call.kind} {f['fn']}"
        if call.kind == "receive":
            return f"waiting for signal {f['channel']}"
        return call.kind
    return f"call {getattr(call, '__qualname__', type(call).__name__)}"


class ActivityLog(Instrument):
    """Publish task activity to a :class:`~tiffany.pal.Hub`."""

    def __init__(self, hub: Hub, *, dispatches: bool = True, runs_only: bool = False) -> None:
        self.hub = hub
        self.dispatches = dispatches
        #: Publish only tasks that belong to a run (not the engine's own tasks).
        self.runs_only = runs_only
        #: Dispatches seen (every task step, published or not).
        self.dispatched = 0

    def _ids(self, task: Task) -> dict[str, Any] | None:
        meta = task.meta
        if isinstance(meta, TaskMeta):
            return {
                "task_id": task.id,
                "ltid": meta.ltid if meta.ltid >= 0 else None,
                "run_id": meta.run.run_id,
                "task": task.name,
                "task_kind": meta.label.role,
                "step_id": meta.label.step_id,
            }
        if self.runs_only:
            return None
        return {"task_id": task.id, "task": task.name}

    def task_spawned(self, task: Task) -> None:
        """Publish ``spawned`` (and ``tool.started`` for tool tasks)."""
        ids = self._ids(task)
        if ids is None:
            return
        data = {"parent": task.parent}
        self.hub.publish("spawned", label=f"spawned {task.name}", data=data, **ids)
        if ids["task_kind"] == "tool":
            self.hub.publish("tool.started", label=task.name, data=data, **ids)

    def after_dispatch(self, task: Task, yielded: Any) -> None:
        """Publish ``step`` with what the task yielded."""
        self.dispatched += 1
        if self.dispatches:
            ids = self._ids(task)
            if ids is not None:
                self.hub.publish("step", label=_label(yielded), **ids)

    def task_blocked(self, task: Task, call: SystemCall) -> None:
        """Publish ``blocked`` with the reason."""
        ids = self._ids(task)
        if ids is not None:
            self.hub.publish("blocked", label=_label(call), data={"state": task.state.value}, **ids)

    def step_held(self, task: Task, held: HeldStep) -> None:
        """Publish ``blocked``: the journal held a step back (``Journal.on_hold``)."""
        ids = self._ids(task)
        if ids is not None:
            data = {"state": "waiting", "step": held.step, "reason": held.reason}
            self.hub.publish("blocked", label=f"waiting: {held.reason}", data=data, **ids)

    def task_woken(self, task: Task, value: Any) -> None:
        """Publish ``woke``."""
        ids = self._ids(task)
        if ids is not None:
            self.hub.publish("woke", label="woke", **ids)

    def task_exited(self, task: Task) -> None:
        """Publish ``exit`` or ``cancelled`` (and ``tool.finished``, ``run.finished``)."""
        ids = self._ids(task)
        if ids is None:
            return
        kind = "cancelled" if task.state.value == "cancelled" else "exit"
        self.hub.publish(kind, label=task.state.value, **ids)
        self._finished(task, ids, ok=kind == "exit")

    def task_crashed(self, task: Task, error: BaseException) -> None:
        """Publish ``crash`` with the error."""
        ids = self._ids(task)
        if ids is None:
            return
        err = {"type": type(error).__name__, "message": str(error)[:500]}
        self.hub.publish("crash", label=f"{err['type']}: {err['message'][:80]}", data=err, **ids)
        self._finished(task, ids, ok=False, error=err)

    def _finished(
        self, task: Task, ids: Mapping[str, Any], ok: bool, error: Mapping[str, Any] | None = None
    ) -> None:
        data = {"ok": ok, "error": dict(error) if error else None}
        if ids.get("task_kind") == "tool":
            self.hub.publish("tool.finished", label=task.name, data=data, **ids)
        meta = task.meta
        if isinstance(meta, TaskMeta) and meta.run.root is task:
            # The run's own word (succeeded, failed, cancelled), as the store and
            # the dashboard say it; the task events keep the kernel's.
            label = _RUN_WORD.get(task.state.value, task.state.value)
            self.hub.publish("run.finished", label=label, data=data, **ids)
