"""The ``agent`` tool through the whole engine (``tiffany run``, real processes, offline).

* the scripted model of examples/agent: three turns calling two tools; the
  run replays identically without the model (no script at replay time);
* an OpenAI-compatible endpoint on loopback: the model gets the tools'
  JSON Schemas under function names (``file__write``), asks for a call,
  gets its result as a ``tool`` message, answers; tokens and cost add up;
* a tool the step does not list is refused to the model, not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent"


def _tiffany(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=base | env,
        check=False,
    )


def test_the_scripted_agent_loop_calls_two_tools_and_replays_without_the_model(tmp_path):
    script = str(EXAMPLE / "script.yaml")
    done = _tiffany(
        tmp_path, "run", "--json", str(EXAMPLE / "plan.yaml"), TIFFANY_LLM_SCRIPT=script
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["outputs"]["turns"] == 3
    assert result["outputs"]["calls"] == [
        {"turn": 1, "tool": "file.write", "ok": True},
        {"turn": 2, "tool": "file.read", "ok": True},
    ]
    notes = tmp_path / "workspaces" / result["run_id"] / "notes.md"
    assert notes.read_text() == "Tiffany journals every model and tool call."
    notes.write_text("changed after the run")  # a replay that read it would diverge
    verify = _tiffany(
        tmp_path, "replay", "--verify", result["run_id"], TIFFANY_LLM_SCRIPT="/nonexistent.yaml"
    )
    assert verify.returncode == 0, verify.stderr[-3000:]
    assert "replays identically" in verify.stdout + verify.stderr


def test_an_openai_compatible_model_drives_the_tools(tmp_path, http_server, reply, read_body):
    seen: list[dict[str, Any]] = []

    def chat(h: Any) -> None:
        payload = json.loads(read_body(h))
        seen.append(payload)
        if len(seen) == 1:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {
                            "name": "file__write",
                            "arguments": json.dumps({"path": "a.txt", "content": "from gpt"}),
                        },
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "shell", "arguments": "{}"},
                    },
                ],
            }
        else:
            message = {"role": "assistant", "content": "wrote a.txt"}
        doc = {
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": message}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }
        reply(h, 200, json.dumps(doc).encode(), "application/json")

    base = http_server({"/v1/chat/completions": chat})
    plan = tmp_path / "plan.json"
    goal = {"goal": "write a.txt", "tools": ["file.write"], "max_turns": 3}
    plan.write_text(
        json.dumps({"name": "gpt", "steps": [{"id": "a", "tool": "agent", "args": goal}]})
    )
    done = _tiffany(
        tmp_path / "data",
        "run",
        "--json",
        str(plan),
        TIFFANY_LLM_BASE_URL=base,
        TIFFANY_LLM_MODEL="gpt-4o-mini",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = json.loads(done.stdout)["run_id"]
    assert (tmp_path / "data" / "workspaces" / run_id / "a.txt").read_text() == "from gpt"
    first, second = seen
    (function,) = first["tools"]
    assert function["function"]["name"] == "file__write"
    assert function["function"]["parameters"]["required"] == ["path", "content"]
    # The results went back as tool messages: the write's output, the refusal of shell.
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2"]
    assert json.loads(tool_messages[0]["content"]) == {"path": "a.txt", "bytes": 8}
    assert "not one of this step's tools" in tool_messages[1]["content"]
    store = _tiffany(tmp_path / "data", "runs")
    assert run_id in store.stdout


def test_an_agent_that_runs_two_sub_plans_gets_two_children(tmp_path):
    """Each ``plan.run`` call of an agent step starts a child of its own.

    Both calls used to name the child after the step and its attempt: the
    second found the first's run, and waited for an end already taken.
    """
    kid = {
        "name": "kid",
        "inputs": {"n": 0},
        "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0}}],
        "outputs": {"n": "${inputs.n}"},
    }
    script = tmp_path / "script.json"
    rules = [
        {"turn": t, "reply": f"child {t}", "tool_calls": [call]}
        for t, call in (
            (1, {"name": "plan.run", "arguments": {"plan": kid, "inputs": {"n": 1}}}),
            (2, {"name": "plan.run", "arguments": {"plan": kid, "inputs": {"n": 2}}}),
        )
    ]
    script.write_text(json.dumps({"rules": [*rules, {"turn": 3, "reply": "two children ran"}]}))
    plan = tmp_path / "plan.json"
    goal = {"goal": "run two children", "tools": ["plan.run"], "max_turns": 4}
    steps = [{"id": "work", "tool": "agent", "args": goal}]
    outputs = {"calls": "${steps.work.output.calls}"}
    plan.write_text(json.dumps({"name": "twice", "steps": steps, "outputs": outputs}))
    data = tmp_path / "data"
    done = _tiffany(data, "run", "--json", str(plan), TIFFANY_LLM_SCRIPT=str(script))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    run_id = result["run_id"]
    assert result["outputs"]["calls"] == [
        {"turn": 1, "tool": "plan.run", "ok": True},
        {"turn": 2, "tool": "plan.run", "ok": True},
    ]
    listed = _tiffany(data, "runs", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    runs = {r["run_id"]: r["status"] for r in map(json.loads, listed.stdout.splitlines())}
    children = [f"{run_id}.work.1.1", f"{run_id}.work.1.2"]  # the step's calls 1 and 2
    assert runs == dict.fromkeys([run_id, *children], "succeeded")
    for rid in runs:
        verify = _tiffany(data, "replay", "--verify", rid, TIFFANY_LLM_SCRIPT="/nonexistent.json")
        assert verify.returncode == 0, verify.stderr[-3000:]


def test_without_a_model_the_agent_example_fails_naming_the_setting(tmp_path):
    """It "succeeded" with a canned scripted reply and no tool call on a server with no model."""
    done = _tiffany(tmp_path, "run", "--json", str(EXAMPLE / "plan.yaml"))
    assert done.returncode == 1, done.stderr[-3000:]
    error = json.loads(done.stdout)["steps"]["work"]["error"]
    assert error["code"] == "tool.llm.not_configured"
    assert "TIFFANY_LLM_BASE_URL" in error["message"]
    assert "TIFFANY_LLM_MODEL=scripted" in error["message"]


def test_malformed_tool_call_arguments_go_back_to_the_model_to_correct(
    tmp_path, http_server, reply, read_body
):
    """Arguments that were not JSON failed the whole model reply, and so the step."""
    seen: list[dict[str, Any]] = []
    broken = '{"path": "a.txt", "content": '  # cut off mid-object, as a model may send

    def call(arguments: str) -> dict[str, Any]:
        function = {"name": "file__write", "arguments": arguments}
        return {"id": f"c{len(seen)}", "type": "function", "function": function}

    def chat(h: Any) -> None:
        payload = json.loads(read_body(h))
        seen.append(payload)
        if len(seen) == 1:
            message = {"role": "assistant", "content": None, "tool_calls": [call(broken)]}
        elif len(seen) == 2:
            fixed = json.dumps({"path": "a.txt", "content": "fixed"})
            message = {"role": "assistant", "content": None, "tool_calls": [call(fixed)]}
        else:
            message = {"role": "assistant", "content": "wrote a.txt"}
        doc = {
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": message}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        reply(h, 200, json.dumps(doc).encode(), "application/json")

    base = http_server({"/v1/chat/completions": chat})
    plan = tmp_path / "plan.json"
    goal = {"goal": "write a.txt", "tools": ["file.write"], "max_turns": 4}
    steps = [{"id": "a", "tool": "agent", "args": goal}]
    plan.write_text(
        json.dumps({"name": "gpt", "steps": steps, "outputs": {"calls": "${steps.a.output.calls}"}})
    )
    data = tmp_path / "data"
    env = {"TIFFANY_LLM_BASE_URL": base, "TIFFANY_LLM_MODEL": "gpt-4o-mini"}
    done = _tiffany(data, "run", "--json", str(plan), **env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["outputs"]["calls"] == [
        {"turn": 1, "tool": "file.write", "ok": False},
        {"turn": 2, "tool": "file.write", "ok": True},
    ]
    assert (data / "workspaces" / result["run_id"] / "a.txt").read_text() == "fixed"
    second = seen[1]
    assistant, told = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["arguments"] == broken  # what it said
    assert told == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": json.dumps(
            {"error": "arguments are not valid JSON: Expecting value at char 29"}
        ),
    }
    assert all("temperature" not in payload for payload in seen)  # the model's default
    verify = _tiffany(data, "replay", "--verify", result["run_id"])
    assert verify.returncode == 0, verify.stderr[-3000:]
