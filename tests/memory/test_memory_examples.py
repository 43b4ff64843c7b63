"""examples/memory, as its README runs them (``tiffany run``, real processes), replay-verified.

* learn.yaml then recall.yaml: the second run recalls what the first
  learned; memory then changes and both runs still replay identically;
* agent.yaml with the scripted model: told a preference in one run, the
  agent remembers it (once: one version, the call's op); asked in a later
  run, it recalls it; both verify without the model (no script) and with
  the preference changed since;
* notes.py, the workflow variant, the same across two runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memory_runs import ROOT, open_store, tiffany

from tiffany.agents import load_plan, parse_plan
from tiffany.agents.registry import ToolRegistry

EXAMPLE = ROOT / "examples" / "memory"
SCRIPT = str(EXAMPLE / "script.yaml")


def _run(data_dir: Path, *args: str, **env: str) -> dict[str, Any]:
    done = tiffany(data_dir, "run", "--json", *args, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded", result
    return result


def _verifies(data_dir: Path, run_id: str, *args: str, **env: str) -> None:
    done = tiffany(data_dir, "replay", run_id, "--verify", *args, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replays identically" in done.stdout + done.stderr


def test_the_example_plans_validate_strictly() -> None:
    for name in ("learn", "recall", "agent"):
        parse_plan(
            load_plan(EXAMPLE / f"{name}.yaml"), ToolRegistry.default().all_names(), strict=True
        )


def test_a_plan_learns_facts_and_a_second_run_recalls_them(tmp_path: Path) -> None:
    learned = _run(tmp_path, str(EXAMPLE / "learn.yaml"))
    assert learned["outputs"] == {"learned": ["journal", "replay", "memory"], "versions": [1, 1, 1]}
    recalled = _run(tmp_path, str(EXAMPLE / "recall.yaml"))
    out = recalled["outputs"]
    assert out["best"].startswith("A replay answers each call from the journal")
    assert out["found"] is True
    assert out["journal"].startswith("Every step's result is journaled")
    assert [(n["key"], n["relation"]) for n in out["related"]] == [("replay", "explains")]
    store = open_store(tmp_path)
    try:  # memory changes: the recall still replays what it read
        store.put("facts.tiffany", "journal", {"fact": "changed"}, op="test:change")
        store.delete("facts.tiffany", "replay", op="test:delete")
    finally:
        store.close()
    _verifies(tmp_path, learned["run_id"])
    _verifies(tmp_path, recalled["run_id"])


def test_an_agent_remembers_a_preference_across_runs(tmp_path: Path) -> None:
    plan = str(EXAMPLE / "agent.yaml")
    told = _run(
        tmp_path, plan, "--input", "message=I prefer the dark theme.", TIFFANY_LLM_SCRIPT=SCRIPT
    )
    assert told["outputs"]["answer"] == "Noted: you prefer the dark theme."
    assert told["outputs"]["calls"] == [{"turn": 1, "tool": "remember", "ok": True}]
    asked = _run(
        tmp_path, plan, "--input", "message=Which theme do I like?", TIFFANY_LLM_SCRIPT=SCRIPT
    )
    assert asked["outputs"]["calls"] == [{"turn": 1, "tool": "recall", "ok": True}]
    answer = asked["outputs"]["answer"]
    assert answer.startswith("From memory:")
    assert "Prefers the dark theme." in answer
    store = open_store(tmp_path)
    try:
        history = store.history("users.alice", "theme")
        assert [(h["op"], h["step_id"]) for h in history] == [(f"{told['run_id']}/chat/1", "chat")]
        store.put("users.alice", "theme", "Prefers the light theme.", op="test:change")
    finally:
        store.close()
    for run in (told, asked):  # no model, memory changed: the journal answers both
        _verifies(tmp_path, run["run_id"], TIFFANY_LLM_SCRIPT="/nonexistent.yaml")


def test_the_workflow_variant_remembers_across_runs(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(EXAMPLE)}
    first = _run(tmp_path, "notes:notes", "--input", "user=ann", "--input", "likes=crepes", **env)
    assert first["outputs"]["likes"] == "crepes"
    second = _run(tmp_path, "notes:notes", "--input", "user=ann", **env)
    assert second["outputs"]["likes"] == "crepes"
    assert second["outputs"]["found"] == ["likes"]
    assert second["outputs"]["as_of"] >= first["outputs"]["as_of"]
    for run in (first, second):
        _verifies(tmp_path, run["run_id"], "--import", "notes", **env)
