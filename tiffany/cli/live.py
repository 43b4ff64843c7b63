"""The live terminal view of ``tiffany run``: the task tree and a progress bar.

An instrument records what the kernel does to each task (spawned, blocked on
what, woken, ended); rich's ``Live`` renders it from its own refresh thread,
so the scheduler thread only updates a few dict entries per event. A task's
role and plan step are the journal's label on it (``Task.meta``), set
before this instrument sees the spawn.

Discussion: the refresh thread reads dicts the loop thread mutates. Rather
than a lock (the loop thread must never wait), the renderer copies them and
retries the rare copy that races with a resize.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from tiffany.durable.journal import TaskMeta
from tiffany.kernel import Instrument, SystemCall, Task
from tiffany.wire.status import RunStatus, status_of

__all__ = ["LiveView"]

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_STYLE: dict[str, str] = {
    RunStatus.PENDING: "cyan",
    RunStatus.RUNNING: "cyan",
    RunStatus.SUCCEEDED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "dim",
}


def _word(state: Any) -> str:
    """A task's state in the words the dashboard, the store and the feed use."""
    return status_of(str(getattr(state, "value", state)))


@dataclass(slots=True)
class _Row:
    name: str
    parent: int | None
    role: str = "task"
    step_id: str | None = None
    state: str = RunStatus.PENDING.value
    detail: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    note: str = ""


def _detail(call: SystemCall) -> str:
    fields = call.fields()
    if call.kind == "sleep":
        return f"sleep {fields['seconds']:g}s"
    if call.kind == "wait_task":
        return f"waiting on task {fields['tid']}"
    if call.kind in ("step", "run_in_thread"):
        return f"running {fields['fn']}"
    if call.kind in ("read_wait", "write_wait"):
        return f"{call.kind} fd {fields['fd']}"
    if call.kind == "receive":
        return f"waiting for signal {fields['channel']}"
    return call.kind


class LiveView(Instrument):
    """Collect task states for the terminal view."""

    def __init__(self, total_steps: int) -> None:
        self.rows: dict[int, _Row] = {}
        self.total_steps = total_steps
        self.workers_done = 0
        self.workers_started = 0

    def on_event(self, run_id: str, kind: str, data: Mapping[str, Any]) -> None:
        """Show a tool's activity event (llm usage, retries...) on its worker's row.

        Called from tool threads too: it only replaces one string.
        """
        step = data.get("step")
        if kind == "llm.usage":
            note = (
                f"llm {data.get('model')}: {data.get('total_tokens')} tokens, "
                f"${float(data.get('cost_usd') or 0):.4f}"
            )
        elif kind == "step.retry":
            note = f"retry after attempt {data.get('attempt')} in {data.get('delay_s')}s"
        else:
            return
        for row in list(self.rows.values()):
            if row.role == "worker" and row.step_id == step:
                row.note = note

    def task_spawned(self, task: Task) -> None:
        """Add a row."""
        meta = task.meta
        if not isinstance(meta, TaskMeta) or meta.opaque:
            # Inside a durable step (its body, a subprocess's pipe readers): not
            # the run's task tree, which is what the view shows.
            return
        row = _Row(task.name, task.parent)
        row.role, row.step_id = meta.label.role, meta.label.step_id
        self._add(task.id, row)

    def _add(self, tid: int, row: _Row) -> None:
        self.rows[tid] = row
        if row.role == "worker":
            self.workers_started += 1
            self.total_steps = max(self.total_steps, self.workers_started)

    def task_blocked(self, task: Task, call: SystemCall) -> None:
        """Show what the task waits on."""
        row = self.rows.get(task.id)
        if row is not None:
            row.state, row.detail = _word(task.state), _detail(call)

    def task_woken(self, task: Task, value: Any) -> None:
        """Back to ready."""
        row = self.rows.get(task.id)
        if row is not None:
            row.state, row.detail = RunStatus.RUNNING.value, ""

    def task_exited(self, task: Task) -> None:
        """Done or cancelled."""
        self._ended(task)

    def task_crashed(self, task: Task, error: BaseException) -> None:
        """Crashed, with the error."""
        self._ended(task, f"{type(error).__name__}: {error}"[:120])

    def _ended(self, task: Task, detail: str = "") -> None:
        row = self.rows.get(task.id)
        if row is not None:
            row.state, row.detail, row.ended = _word(task.state), detail, time.monotonic()
            if row.role == "worker":
                self.workers_done += 1

    def _snapshot(self) -> dict[int, _Row]:
        for _ in range(5):
            try:
                return dict(self.rows)
            except RuntimeError:  # resized while copying: try again
                continue
        return {}

    def render(self) -> RenderableType:
        """Return the tree of tasks and a progress bar of steps."""
        rows = self._snapshot()
        now = time.monotonic()
        children: dict[int | None, list[int]] = {}
        for tid, row in rows.items():
            parent = row.parent if row.parent in rows else None
            children.setdefault(parent, []).append(tid)

        def label(tid: int) -> Text:
            row = rows[tid]
            elapsed = (row.ended or now) - row.started
            style = _STYLE.get(row.state, "magenta")
            text = Text.assemble(
                (f"{row.name}", "bold"), "  ", (row.state, style), f"  {elapsed:5.1f}s"
            )
            if row.detail:
                text.append(f"  {row.detail}", style="dim")
            if row.note:
                text.append(f"  [{row.note}]", style="magenta")
            return text

        tree = Tree("tasks")

        def add(node: Tree, tid: int) -> None:
            row = rows[tid]
            text = label(tid)
            if row.ended is None:
                text = Text.assemble((_FRAMES[int(now * 10) % len(_FRAMES)] + " ", "cyan"), text)
            child = node.add(text)
            for c in sorted(children.get(tid, ())):
                add(child, c)

        for root in sorted(children.get(None, ())):
            add(tree, root)
        progress = Progress(
            TextColumn("steps"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            expand=False,
        )
        progress.add_task("steps", total=max(self.total_steps, 1), completed=self.workers_done)
        return Group(tree, progress)

    def summary(self) -> Table:
        """Return a final table of the tasks (for non-terminal output)."""
        table = Table(title="tasks")
        for col in ("id", "task", "state", "seconds", "detail"):
            table.add_column(col)
        for tid, row in sorted(self._snapshot().items()):
            seconds = (row.ended or time.monotonic()) - row.started
            detail = " ".join(x for x in (row.detail, row.note) if x)
            table.add_row(str(tid), Text(row.name), row.state, f"{seconds:.2f}", Text(detail))
        return table
