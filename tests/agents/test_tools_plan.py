"""The real tools under the planner and worker (thread, task and in-worker flavours)."""

from __future__ import annotations

from tiffany.agents import AgentEnv, run_plan
from tiffany.agents.registry import ToolRegistry
from tiffany.agents.tools import ToolSettings
from tiffany.kernel import ManualClock, Scheduler


def test_a_plan_of_real_tools(tmp_path):
    registry = ToolRegistry.default(enabled=ToolRegistry.default().all_names())
    settings = ToolSettings(shell_sandbox="none", llm_model="scripted")  # the offline model
    env = AgentEnv(registry, tmp_path / "ws", settings)
    doc = {
        "name": "real",
        "inputs": {"text": "one two three"},
        "steps": [
            {
                "id": "write",
                "tool": "file.write",
                "args": {"path": "in.txt", "content": "${inputs.text}"},
            },
            {
                "id": "count",
                "tool": "shell",
                "args": {"argv": ["wc", "-w", "in.txt"]},
                "after": ["write"],
            },
            {"id": "nap", "tool": "sleep", "args": {"seconds": 60}},
            {
                "id": "think",
                "tool": "llm",
                "args": {"prompt": "${inputs.text}", "plan": True},
                "dynamic": True,
            },
        ],
        "outputs": {
            "words": "${steps.count.output.stdout}",
            "summary": "${steps.think.output.content}",
        },
    }
    clock = ManualClock()
    with Scheduler(clock=clock) as sched:
        tid = sched.spawn(run_plan(env, "run-1", doc, {}), name="planner")
        sched.run()
        result = sched.result(tid)
    assert result["outputs"]["words"].split()[0] == "3"
    assert result["outputs"]["summary"].startswith("Summary: one two three")
    # the llm's proposed steps ran: its summary file was written and read back
    assert (tmp_path / "ws" / "run-1" / "think-summary.txt").read_text().startswith("Summary:")
    assert clock.monotonic() >= 60  # the sleep ran on the manual clock
