"""A plan's model budget: the step whose usage crosses it fails, the run's usage is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiffany.agents import PlanError, parse_plan


def _llm(step_id: str, after: list[str]) -> dict[str, object]:
    prompt = "one two three four five six seven eight nine ten"  # 10 tokens (scripted)
    return {"id": step_id, "tool": "llm", "args": {"prompt": prompt}, "after": after}


def _run(tmp_path: Path, plan: dict[str, object]) -> dict[str, object]:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiffany",
            "--data-dir",
            str(tmp_path / "d"),
            "run",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _detail(tmp_path: Path, run_id: str) -> dict[str, object]:
    from tiffany.store import make_engine, queries, session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'd' / 'tiffany.db'}")
    with session_factory(engine)() as session:
        detail = queries.run_detail_of(session, run_id)
    engine.dispose()
    assert detail is not None
    return detail


def test_the_step_that_crosses_the_token_budget_fails_and_its_dependents_skip(tmp_path):
    # Each scripted call: 10 prompt tokens + the summary's ~20 completion tokens.
    plan = {
        "name": "budgeted",
        "budget": {"tokens": 70},
        "steps": [_llm("a", []), _llm("b", ["a"]), _llm("c", ["b"]), _llm("d", ["c"])],
    }
    result = _run(tmp_path, plan)
    assert result["status"] == "failed"
    steps = result["steps"]
    assert isinstance(steps, dict)
    assert steps["a"]["status"] == "succeeded"
    assert steps["b"]["status"] == "succeeded"
    assert steps["c"]["status"] == "failed"
    assert steps["c"]["error"]["code"] == "budget.exceeded"
    assert steps["d"]["status"] == "skipped"
    store = _detail(tmp_path, str(result["run_id"]))
    assert store["usage"]["tokens"] > 70  # the run's totals, in the store


def test_within_its_budget_a_run_reports_its_usage_and_a_bad_budget_is_refused(tmp_path):
    plan = {"name": "cheap", "budget": {"tokens": 10_000, "usd": 1.0}, "steps": [_llm("a", [])]}
    assert _run(tmp_path, plan)["status"] == "succeeded"
    with pytest.raises(PlanError) as info:
        parse_plan({**plan, "budget": {"tokens": -1}}, ["llm"])
    assert info.value.errors[0]["loc"] == "budget.tokens"


def test_a_run_without_a_budget_has_its_model_usage_totalled_in_the_store(tmp_path):
    """Totals for every run: the projector sums its steps' ``usage`` and ``cost_usd``."""
    plan = {"name": "free", "steps": [_llm("a", []), _llm("b", ["a"]), _llm("c", [])]}
    result = _run(tmp_path, plan)
    assert result["status"] == "succeeded"
    assert "usage" not in result  # the run's result is as before (no budget: no usage in it)
    store = _detail(tmp_path, str(result["run_id"]))
    outputs = [s["output"] for s in store["steps"]]
    tokens = sum(o["usage"]["total_tokens"] for o in outputs)
    assert tokens > 30  # three calls of 10 prompt tokens and their replies
    assert store["usage"]["tokens"] == tokens
    assert store["usage"]["usd"] == pytest.approx(sum(o["cost_usd"] for o in outputs))
