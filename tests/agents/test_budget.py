"""A plan's model budget: the step whose usage crosses it fails, the run's usage is reported.

It holds: every attempt's usage counts, failed or not, and a model call
(an ``llm`` attempt, an ``agent`` turn) that would start with the budget
spent is refused without calling the model. The OpenAI-compatible model
here is a server on loopback that counts its calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiffany.agents import PlanError, parse_plan


def _llm(step_id: str, after: list[str]) -> dict[str, object]:
    prompt = "one two three four five six seven eight nine ten"  # 10 tokens (scripted)
    return {"id": step_id, "tool": "llm", "args": {"prompt": prompt}, "after": after}


def _tiffany(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(tmp_path / "d"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=base | env,
        check=False,
    )


def _run(tmp_path: Path, plan: dict[str, object], **env: str) -> dict[str, Any]:
    # A model, as an operator names one: the scripted provider offline, a
    # model missing from the price table on a loopback endpoint.
    model = "test-model" if "TIFFANY_LLM_BASE_URL" in env else "scripted"
    env = {"TIFFANY_LLM_MODEL": model, **env}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    done = _tiffany(tmp_path, "run", "--json", str(path), **env)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _verify(tmp_path: Path, run_id: str) -> None:
    """``tiffany replay RUN --verify``: the budget's decisions replay as they were made."""
    done = _tiffany(tmp_path, "replay", "--verify", run_id)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def _model(
    http_server: Callable[[dict[str, Any]], str],
    reply: Callable[..., None],
    read_body: Callable[[Any], bytes],
    answer: Callable[[dict[str, Any]], dict[str, Any]],
) -> tuple[str, list[dict[str, Any]]]:
    """An OpenAI-compatible endpoint on loopback: ``(base URL, the requests it got)``.

    ``answer(request)`` is the reply's document.
    """
    calls: list[dict[str, Any]] = []
    lock = threading.Lock()

    def chat(h: Any) -> None:
        payload = json.loads(read_body(h))
        with lock:
            calls.append(payload)
        reply(h, 200, json.dumps(answer(payload)).encode(), "application/json")

    return http_server({"/v1/chat/completions": chat}), calls


def _usage(total: int) -> dict[str, int]:
    return {"prompt_tokens": total - 10, "completion_tokens": 10, "total_tokens": total}


def _detail(tmp_path: Path, run_id: str) -> dict[str, Any]:
    from tiffany.store import make_engine, queries, session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'd' / 'tiffany.db'}")
    with session_factory(engine)() as session:
        detail = queries.run_detail_of(session, run_id)
    engine.dispose()
    assert detail is not None
    return detail


def _step(detail: dict[str, Any], step_id: str) -> dict[str, Any]:
    return next(s for s in detail["steps"] if s["step_id"] == step_id)


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


def test_a_failed_steps_usage_counts_and_its_retry_is_refused_without_a_call(
    tmp_path, http_server, reply, read_body
):
    # The model answers, bills 200,000 tokens, and the reply is unusable (no choices).
    base, calls = _model(
        http_server,
        reply,
        read_body,
        lambda _: {"model": "m", "choices": [], "usage": _usage(200_000)},
    )
    step = {"id": "a", "tool": "llm", "args": {"prompt": "hi"}, "retries": 2, "backoff": 0}
    plan = {"name": "costly", "budget": {"tokens": 5_000}, "steps": [step]}
    result = _run(tmp_path, plan, TIFFANY_LLM_BASE_URL=base)
    assert result["status"] == "failed"
    detail = _detail(tmp_path, str(result["run_id"]))
    failed, refused = _step(detail, "a")["attempts"]
    assert failed["error"]["code"] == "tool.llm.error"
    assert failed["error"]["usage"]["total_tokens"] == 200_000
    assert refused["error"]["code"] == "budget.exceeded"
    assert "started_at" not in refused  # refused before the model was called
    assert len(calls) == 1  # not three: the retries were refused
    assert detail["usage"]["tokens"] == 200_000
    _verify(tmp_path, str(result["run_id"]))
    assert len(calls) == 1  # the replay called no model


def test_parallel_steps_spend_at_most_the_budget_and_the_calls_in_flight(
    tmp_path, http_server, reply, read_body
):
    """Three chains of three ``llm`` steps, 1,000 tokens a call, against 2,500 tokens.

    The chains go on past a failed step (``continue_on_error`` on the first
    two levels), so each step would call the model if nothing stopped it:
    nine calls. The first level starts together; the next steps start as
    replies come, while the budget is not spent. Once a reply takes the run
    past it, no call starts: what is spent is at most the budget plus the
    calls in flight then (three: one per chain), and every token is reported.
    """
    per_call, budget, parallel = 1_000, 2_500, 3
    base, calls = _model(
        http_server,
        reply,
        read_body,
        lambda _: {
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": _usage(per_call),
        },
    )
    steps = []
    for chain in "xyz":
        for i in range(1, 4):
            step = {"id": f"{chain}{i}", "tool": "llm", "args": {"prompt": chain}}
            if i > 1:
                step["after"] = [f"{chain}{i - 1}"]
            if i < 3:
                step["continue_on_error"] = True
            steps.append(step)
    plan = {"name": "wide", "budget": {"tokens": budget}, "steps": steps}
    result = _run(tmp_path, plan, TIFFANY_LLM_BASE_URL=base)
    assert result["status"] == "failed"
    spent = len(calls) * per_call
    assert spent <= budget + parallel * per_call  # at most 5 calls, not 9
    detail = _detail(tmp_path, str(result["run_id"]))
    assert detail["usage"]["tokens"] == spent  # the true total
    called = refused = 0
    for step in detail["steps"]:
        for attempt in step["attempts"]:
            if "started_at" in attempt:
                called += 1
            else:  # refused before the model was called
                refused += 1
                assert attempt["error"]["code"] == "budget.exceeded"
    assert called == len(calls)
    assert called + refused == 9
    assert all(result["steps"][f"{c}3"]["status"] == "failed" for c in "xyz")
    _verify(tmp_path, str(result["run_id"]))


def test_an_agent_stops_before_the_turn_that_would_start_over_its_budget(
    tmp_path, http_server, reply, read_body
):
    """Each turn asks for a file write and bills 1,000 tokens; the budget is 2,000.

    After two turns the budget is spent: the third turn is refused before
    its model call, and the step fails with ``budget.exceeded``.
    """
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "file__write", "arguments": json.dumps({"path": "a", "content": "x"})},
    }
    base, calls = _model(
        http_server,
        reply,
        read_body,
        lambda _: {
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": [call]}}],
            "usage": _usage(1_000),
        },
    )
    args = {"goal": "write forever", "tools": ["file.write"], "max_turns": 6}
    plan = {
        "name": "loop",
        "budget": {"tokens": 2_000},
        "steps": [{"id": "a", "tool": "agent", "args": args, "retries": 1, "backoff": 0}],
    }
    result = _run(tmp_path, plan, TIFFANY_LLM_BASE_URL=base)
    assert result["status"] == "failed"
    step = result["steps"]["a"]
    assert step["error"]["code"] == "budget.exceeded"
    assert "turn 3" in step["error"]["message"]
    detail = _detail(tmp_path, str(result["run_id"]))
    assert len(_step(detail, "a")["attempts"]) == 1  # the budget's refusal is not retried
    assert len(calls) == 2
    assert detail["usage"]["tokens"] == 2_000
    _verify(tmp_path, str(result["run_id"]))


def test_without_a_budget_the_store_totals_failed_attempts_too(
    tmp_path, http_server, reply, read_body
):
    base, calls = _model(
        http_server,
        reply,
        read_body,
        lambda _: {"model": "m", "choices": [], "usage": _usage(200_000)},
    )
    step = {"id": "a", "tool": "llm", "args": {"prompt": "hi"}, "retries": 1, "backoff": 0}
    result = _run(tmp_path, {"name": "free", "steps": [step]}, TIFFANY_LLM_BASE_URL=base)
    assert result["status"] == "failed"
    assert len(calls) == 2  # no budget: the retry runs
    assert _detail(tmp_path, str(result["run_id"]))["usage"]["tokens"] == 400_000


@pytest.mark.parametrize(("compat", "calls", "tokens"), [(3, 1, 100), (2, 3, 0)])
def test_a_run_keeps_the_budget_rules_of_the_journal_version_it_started_under(
    tmp_path, compat, calls, tokens
):
    """Version 3 refuses the retries and counts the failure; a version-2 run replays as it ran.

    (Version 2: the planner counted the steps that succeeded, when they reported.)
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from planner_tools import EVENTS, FakeRegistry

    from tiffany.agents import AgentEnv, PlanFailed, run_plan
    from tiffany.kernel import ManualClock, Scheduler

    step = {"id": "m", "tool": "model", "args": {"tokens": 100, "fail_times": 3}, "retries": 2}
    doc = {"name": "v", "budget": {"tokens": 50}, "steps": [{**step, "backoff": 0}]}
    env = AgentEnv(FakeRegistry(), tmp_path / "ws")  # type: ignore[arg-type]
    EVENTS.clear()
    with Scheduler(clock=ManualClock()) as sched:
        tid = sched.spawn(run_plan(env, "run-1", doc, {}, compat), name="planner")
        sched.run()
        error = sched.task(tid).error
    assert isinstance(error, PlanFailed)
    assert [e for e in EVENTS if e[0] == "model"] == [
        ("model", "m", i) for i in range(1, calls + 1)
    ]
    assert error.fields["usage"]["tokens"] == tokens
    EVENTS.clear()
