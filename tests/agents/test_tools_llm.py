"""The llm tool: the scripted provider, and the OpenAI-compatible client on a local server."""

from __future__ import annotations

import json
import socket

import pytest

from tiffany.agents.plan import StepSpec
from tiffany.agents.tools.llm import (
    PLAN_INSTRUCTIONS,
    LlmConnectError,
    LlmPlanError,
    LlmScriptError,
    LlmStatusError,
    LlmTool,
    chat_url,
    cost_usd,
)

LLM = LlmTool()
PROMPT = "Triage the failing build.\nThe linker cannot find libfoo when building the release target"


def test_scripted_builtin_summary_is_deterministic_with_usage(run_tool, make_ctx, events):
    ctx = make_ctx()
    first = run_tool(LLM, {"prompt": PROMPT}, ctx)
    second = run_tool(LLM, {"prompt": PROMPT}, ctx)
    assert first == second
    assert first["content"].startswith("Summary: Triage the failing build.")
    assert "(14 words, 2 lines, 88 characters)" in first["content"]
    assert first["model"] == "scripted"
    assert first["usage"] == {
        "prompt_tokens": 14,
        "completion_tokens": len(first["content"].split()),
        "total_tokens": 14 + len(first["content"].split()),
    }
    assert first["cost_usd"] == 0.0
    assert first["steps"] is None
    usage = [d for k, d in events if k == "llm.usage"]
    assert len(usage) == 2
    assert usage[0]["provider"] == "scripted"
    assert usage[0]["total_tokens"] == first["usage"]["total_tokens"]


def test_scripted_plan_steps_are_valid_plan_steps(run_tool, make_ctx):
    out = run_tool(LLM, {"prompt": PROMPT, "plan": True}, make_ctx(step_id="think"))
    specs = [StepSpec.model_validate(s) for s in out["steps"]]
    assert [s.id for s in specs] == ["think_write", "think_check"]
    assert [s.tool for s in specs] == ["file.write", "file.read"]
    assert specs[1].after == ["think_write"]


def test_max_tokens_cuts_the_scripted_reply(run_tool, make_ctx):
    out = run_tool(LLM, {"prompt": PROMPT, "max_tokens": 3}, make_ctx())
    assert out["content"] == "Summary: Triage the"
    assert out["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_script_rules_match_in_order_then_fall_back(run_tool, make_ctx, tmp_path, suffix):
    rules = [
        {
            "match": "linker",
            "reply": "Install libfoo-dev.",
            "steps": [{"id": "fix", "tool": "shell", "args": {"argv": ["true"]}}],
        },
        {"regex": r"^echo: (.*)$", "reply": "you said {prompt}"},
        {"match": "linker", "reply": "never reached"},
    ]
    script = tmp_path / f"script{suffix}"
    if suffix == ".json":
        script.write_text(json.dumps(rules))
    else:
        import yaml

        script.write_text(yaml.safe_dump({"rules": rules}))
    ctx = make_ctx(llm_script=str(script))
    out = run_tool(LLM, {"prompt": PROMPT}, ctx)
    assert out["content"] == "Install libfoo-dev."
    assert out["steps"] is None  # steps only when plan=True
    planned = run_tool(LLM, {"prompt": PROMPT, "plan": True}, ctx)
    assert planned["steps"] == [{"id": "fix", "tool": "shell", "args": {"argv": ["true"]}}]
    messages = [
        {"role": "system", "content": "linker"},  # rules look at the last user message only
        {"role": "user", "content": "echo: hi"},
    ]
    assert run_tool(LLM, {"messages": messages}, ctx)["content"] == "you said echo: hi"
    assert run_tool(LLM, {"prompt": "hello there"}, ctx)["content"].startswith(
        "Summary: hello there"
    )


def test_bad_script_is_a_tool_error(run_tool, make_ctx, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rules": [{"match": "x", "unknown_key": 1}]}')
    with pytest.raises(LlmScriptError) as info:
        run_tool(LLM, {"prompt": "x"}, make_ctx(llm_script=str(bad)))
    assert info.value.code == "tool.llm.script"
    with pytest.raises(LlmScriptError):
        run_tool(LLM, {"prompt": "x"}, make_ctx(llm_script=str(tmp_path / "missing.json")))


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "b"}]},
        {"prompt": "a", "temperature": 3},
    ],
)
def test_invalid_args(args):
    with pytest.raises(ValueError):  # noqa: PT011 - pydantic's ValidationError
        LlmTool.Args.model_validate(args)


def test_cost_table_and_url():
    assert cost_usd("gpt-4o-mini-2024-07-18", 1_000_000, 1_000_000) == pytest.approx(0.75)
    assert cost_usd("gpt-4o", 1000, 0) == pytest.approx(0.0025)
    assert cost_usd("my-local-model", 10**6, 10**6) == 0.0
    assert chat_url("http://h:1/") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1") == "http://h:1/v1/chat/completions"


# -- OpenAI-compatible ------------------------------------------------------------


@pytest.fixture
def fake_openai(http_server, reply, read_body):
    """A fake /v1/chat/completions; ``state["reply"]`` sets the content, requests are kept."""
    state = {"requests": [], "reply": "hi there", "status": 200}

    def chat(h):
        state["requests"].append(
            {"auth": h.headers.get("Authorization"), "payload": json.loads(read_body(h))}
        )
        if state["status"] != 200:
            reply(h, state["status"], b'{"error": {"message": "overloaded"}}', "application/json")
            return
        doc = {
            "id": "cmpl-1",
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": state["reply"]}}],
            "usage": {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500},
        }
        reply(h, 200, json.dumps(doc).encode(), "application/json")

    state["base"] = http_server({"/v1/chat/completions": chat})
    return state


def test_openai_client(run_tool, make_ctx, events, fake_openai):
    ctx = make_ctx(llm_base_url=fake_openai["base"], llm_api_key="sk-test", llm_model="gpt-4o-mini")
    args = {
        "messages": [{"role": "user", "content": "hello"}],
        "temperature": 0.2,
        "max_tokens": 50,
    }
    out = run_tool(LLM, args, ctx)
    assert out == {
        "content": "hi there",
        "model": "gpt-4o-mini-2024-07-18",
        "usage": {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500},
        "cost_usd": pytest.approx((1200 * 0.15 + 300 * 0.60) / 1e6),
        "steps": None,
    }
    (req,) = fake_openai["requests"]
    assert req["auth"] == "Bearer sk-test"
    assert req["payload"] == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hello"}],
        "temperature": 0.2,
        "max_tokens": 50,
    }
    (usage,) = [d for k, d in events if k == "llm.usage"]
    assert usage["provider"] == "openai"
    assert usage["cost_usd"] == out["cost_usd"]


def test_openai_plan_parses_fenced_json(run_tool, make_ctx, fake_openai):
    steps = [{"id": "next", "tool": "sleep", "args": {"seconds": 1}}]
    fake_openai["reply"] = "```json\n" + json.dumps({"steps": steps}) + "\n```"
    ctx = make_ctx(llm_base_url=fake_openai["base"] + "/v1")
    out = run_tool(LLM, {"prompt": "what next?", "plan": True, "model": "m"}, ctx)
    assert out["steps"] == steps
    messages = fake_openai["requests"][0]["payload"]["messages"]
    assert messages[0] == {"role": "system", "content": PLAN_INSTRUCTIONS}
    assert messages[1] == {"role": "user", "content": "what next?"}
    fake_openai["reply"] = "I think you should sleep."
    with pytest.raises(LlmPlanError) as info:
        run_tool(LLM, {"prompt": "what next?", "plan": True}, ctx)
    assert info.value.code == "tool.llm.plan"


def test_openai_errors(run_tool, make_ctx, fake_openai):
    fake_openai["status"] = 503
    with pytest.raises(LlmStatusError) as info:
        run_tool(LLM, {"prompt": "x"}, make_ctx(llm_base_url=fake_openai["base"]))
    assert info.value.code == "tool.llm.status"
    assert info.value.fields["status"] == 503
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LlmConnectError) as info:
        run_tool(LLM, {"prompt": "x"}, make_ctx(llm_base_url=f"http://127.0.0.1:{port}"))
    assert info.value.code == "tool.llm.connect"
