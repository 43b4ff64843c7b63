"""Where a run's workspace directory is made: never on the loop for a pool step, never for sleep.

Real tools (``sleep``, ``file.write``, ``file.read``) on a real scheduler
and thread pool, with a real clock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from tiffany.agents import AgentEnv, PlanFailed, run_plan
from tiffany.agents.registry import ToolRegistry
from tiffany.kernel import Scheduler


@dataclass(slots=True)
class _Watched(AgentEnv):
    """An env that notes the thread each workspace directory is made on."""

    made_on: list[int] = field(default_factory=list)

    def workspace(self, run_id: str) -> Path:
        path = self.workspace_root / run_id
        if not path.exists():
            self.made_on.append(threading.get_ident())
        return AgentEnv.workspace(self, run_id)


def _run(tmp_path: Path, doc: dict) -> tuple[_Watched, object, int]:
    env = _Watched(ToolRegistry.default(), tmp_path / "ws")
    with Scheduler() as sched:
        loop_thread = threading.get_ident()
        tid = sched.spawn(run_plan(env, "run-1", doc, {}), name="planner")
        sched.run()
        task = sched.task(tid)
    return env, task, loop_thread


def test_a_pool_step_makes_the_workspace_in_the_pool(tmp_path: Path) -> None:
    doc = {
        "name": "write-read",
        "steps": [
            {"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}},
            {
                "id": "w",
                "tool": "file.write",
                "after": ["nap"],
                "args": {"path": "sub/out.txt", "content": "hi"},
            },
            {"id": "r", "tool": "file.read", "after": ["w"], "args": {"path": "sub/out.txt"}},
        ],
        "outputs": {"text": "${steps.r.output.content}"},
    }
    env, task, loop_thread = _run(tmp_path, doc)
    assert task.state.value == "done", task.error
    assert task.result["outputs"] == {"text": "hi"}
    assert (tmp_path / "ws" / "run-1" / "sub" / "out.txt").read_text() == "hi"
    assert len(env.made_on) == 1
    assert env.made_on[0] != loop_thread  # made by the file.write step, in the pool


def test_a_run_of_sleeps_makes_no_workspace(tmp_path: Path) -> None:
    doc = {"name": "naps", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}}]}
    env, task, _ = _run(tmp_path, doc)
    assert task.state.value == "done", task.error
    assert env.made_on == []
    assert not (tmp_path / "ws" / "run-1").exists()


def test_reading_before_any_write_names_the_missing_file(tmp_path: Path) -> None:
    doc = {"name": "read", "steps": [{"id": "r", "tool": "file.read", "args": {"path": "a.txt"}}]}
    env, task, loop_thread = _run(tmp_path, doc)
    assert isinstance(task.error, PlanFailed)
    error = task.error.fields["steps"]["r"]["error"]
    assert error["message"] == "no file 'a.txt' in the workspace", error
    assert len(env.made_on) == 1
    assert env.made_on[0] != loop_thread
