"""The llm tool: the scripted provider, and the OpenAI-compatible client on a local server."""

from __future__ import annotations

import json
import re
import socket

import pytest

from tiffany.agents.plan import StepSpec
from tiffany.agents.tools.llm import (
    PLAN_INSTRUCTIONS,
    LlmConnectError,
    LlmNotConfigured,
    LlmPlanError,
    LlmScriptError,
    LlmStatusError,
    LlmTool,
    chat_url,
    cost_usd,
    refused_param,
)

LLM = LlmTool()
PROMPT = "Triage the failing build.\nThe linker cannot find libfoo when building the release target"


def test_scripted_builtin_summary_is_deterministic_with_usage(run_tool, make_ctx, events):
    ctx = make_ctx(llm_model="scripted")
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
    out = run_tool(
        LLM, {"prompt": PROMPT, "plan": True}, make_ctx(step_id="think", llm_model="scripted")
    )
    specs = [StepSpec.model_validate(s) for s in out["steps"]]
    assert [s.id for s in specs] == ["think_write", "think_check"]
    assert [s.tool for s in specs] == ["file.write", "file.read"]
    assert specs[1].after == ["think_write"]


def test_max_tokens_cuts_the_scripted_reply(run_tool, make_ctx):
    out = run_tool(LLM, {"prompt": PROMPT, "max_tokens": 3}, make_ctx(llm_model="scripted"))
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


#: The request fields of OpenAI's ``POST /v1/chat/completions`` (its API reference).
CHAT_FIELDS = frozenset(
    {
        "model", "messages", "audio", "frequency_penalty", "function_call", "functions",
        "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata",
        "modalities", "n", "parallel_tool_calls", "prediction", "presence_penalty",
        "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
        "service_tier", "stop", "store", "stream", "stream_options", "temperature",
        "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
        "web_search_options",
    }
)  # fmt: skip


def _refusal(param: str, code: str, message: str) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return json.dumps({"error": error}).encode()


def openai_check(payload: dict) -> bytes | None:
    """What OpenAI answers 400 to this request body, as it words it (None: accepted).

    An unknown field is refused; a reasoning model (``o1``, ``o3``, ``o4-mini``...)
    refuses ``max_tokens`` and any ``temperature`` but its default, 1.
    """
    unknown = sorted(set(payload) - CHAT_FIELDS)
    if unknown:
        return _refusal(
            unknown[0], "unknown_parameter", f"Unrecognized request argument supplied: {unknown[0]}"
        )
    reasoning = re.match(r"o\d", str(payload.get("model"))) is not None
    if reasoning and "max_tokens" in payload:
        return _refusal(
            "max_tokens",
            "unsupported_parameter",
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
        )
    if reasoning and payload.get("temperature", 1) != 1:
        return _refusal(
            "temperature",
            "unsupported_value",
            f"Unsupported value: 'temperature' does not support {payload['temperature']} with "
            "this model. Only the default (1) value is supported.",
        )
    return None


@pytest.fixture
def fake_openai(http_server, reply, read_body):
    """A fake /v1/chat/completions holding requests to OpenAI's rules (:func:`openai_check`).

    ``state["reply"]`` sets the content, ``state["status"]`` an error status,
    ``state["refuse"]`` an extra check (a payload -> a 400 body or None);
    requests are kept, with the answer's status.
    """
    state = {"requests": [], "reply": "hi there", "status": 200, "refuse": None}

    def chat(h):
        payload = json.loads(read_body(h))
        seen = {"auth": h.headers.get("Authorization"), "payload": payload, "status": 200}
        state["requests"].append(seen)
        refused = openai_check(payload) or (state["refuse"] and state["refuse"](payload))
        if refused:
            seen["status"] = 400
            reply(h, 400, refused, "application/json")
            return
        if state["status"] != 200:
            seen["status"] = state["status"]
            reply(h, state["status"], b'{"error": {"message": "overloaded"}}', "application/json")
            return
        doc = {
            "id": "cmpl-1",
            "model": payload["model"] + "-2024-07-18",
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
        "max_completion_tokens": 50,
    }
    (usage,) = [d for k, d in events if k == "llm.usage"]
    assert usage["provider"] == "openai"
    assert usage["cost_usd"] == out["cost_usd"]


def test_openai_plan_parses_fenced_json(run_tool, make_ctx, fake_openai):
    steps = [{"id": "next", "tool": "sleep", "args": {"seconds": 1}}]
    fake_openai["reply"] = "```json\n" + json.dumps({"steps": steps}) + "\n```"
    ctx = make_ctx(llm_base_url=fake_openai["base"] + "/v1", llm_model="m")
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
        run_tool(LLM, {"prompt": "x"}, make_ctx(llm_base_url=fake_openai["base"], llm_model="m"))
    assert info.value.code == "tool.llm.status"
    assert info.value.fields["status"] == 503
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LlmConnectError) as info:
        run_tool(
            LLM, {"prompt": "x"}, make_ctx(llm_base_url=f"http://127.0.0.1:{port}", llm_model="m")
        )
    assert info.value.code == "tool.llm.connect"


# -- which provider: no silent success without a model --------------------------------


def test_without_a_model_an_llm_step_fails_naming_the_settings(run_tool, make_ctx, fake_openai):
    """It answered with the scripted provider's canned summary, as if a model had."""
    with pytest.raises(LlmNotConfigured) as info:
        run_tool(LLM, {"prompt": PROMPT}, make_ctx())
    assert info.value.code == "tool.llm.not_configured"
    assert "TIFFANY_LLM_BASE_URL" in info.value.message
    assert "TIFFANY_LLM_MODEL=scripted" in info.value.message
    with pytest.raises(LlmNotConfigured, match="set TIFFANY_LLM_MODEL"):
        run_tool(LLM, {"prompt": PROMPT}, make_ctx(llm_base_url=fake_openai["base"]))
    assert fake_openai["requests"] == []


def test_the_scripted_provider_answers_only_when_asked_for(
    run_tool, make_ctx, fake_openai, tmp_path
):
    script = tmp_path / "rules.json"
    script.write_text(json.dumps([{"match": "linker", "reply": "scripted rule"}]))
    asked = [
        make_ctx(llm_model="scripted"),
        make_ctx(llm_script=str(script)),
        # a step naming the scripted model, on a server with a real one
        make_ctx(llm_base_url=fake_openai["base"], llm_model="gpt-4o-mini"),
    ]
    for ctx in asked:
        out = run_tool(LLM, {"prompt": PROMPT, "model": "scripted"}, ctx)
        assert out["model"] == "scripted"
        assert out["cost_usd"] == 0.0
    assert fake_openai["requests"] == []
    assert run_tool(LLM, {"prompt": PROMPT}, asked[1])["content"] == "scripted rule"


# -- what the OpenAI provider sends -------------------------------------------------------


def test_a_reasoning_model_gets_what_it_accepts_at_the_first_call(run_tool, make_ctx, fake_openai):
    """``max_tokens`` and a default ``temperature`` of 0 made every o-series call a 400."""
    ctx = make_ctx(llm_base_url=fake_openai["base"], llm_model="o4-mini")
    out = run_tool(LLM, {"prompt": "hello", "max_tokens": 50}, ctx)
    assert out["content"] == "hi there"
    (req,) = fake_openai["requests"]
    assert req["status"] == 200
    assert req["payload"] == {
        "model": "o4-mini",
        "messages": [{"role": "user", "content": "hello"}],
        "max_completion_tokens": 50,
    }


def test_a_temperature_the_model_refuses_is_dropped_once_and_remembered(
    run_tool, make_ctx, fake_openai, events
):
    ctx = make_ctx(llm_base_url=fake_openai["base"], llm_model="o3-mini")
    args = {"prompt": "hello", "temperature": 0.2}
    assert run_tool(LLM, args, ctx)["content"] == "hi there"
    first, second = fake_openai["requests"]
    assert (first["status"], first["payload"]["temperature"]) == (400, 0.2)
    assert second["status"] == 200
    assert "temperature" not in second["payload"]
    assert [d for k, d in events if k == "llm.param_refused"] == [
        {"model": "o3-mini", "param": "temperature"}
    ]
    run_tool(LLM, args, ctx)  # the model's refusal is remembered: one request, accepted
    third = fake_openai["requests"][2]
    assert len(fake_openai["requests"]) == 3
    assert third["status"] == 200
    assert "temperature" not in third["payload"]


def test_an_older_server_gets_max_tokens_when_it_refuses_max_completion_tokens(
    run_tool, make_ctx, fake_openai
):
    def older(payload: dict) -> bytes | None:
        if "max_completion_tokens" not in payload:
            return None
        text = "'max_completion_tokens' is not supported by this server"  # no "param" field
        return json.dumps({"object": "error", "message": text, "code": 400}).encode()

    fake_openai["refuse"] = older
    ctx = make_ctx(llm_base_url=fake_openai["base"], llm_model="local-model")
    run_tool(LLM, {"prompt": "hello", "max_tokens": 7}, ctx)
    statuses = [(r["status"], r["payload"].get("max_tokens")) for r in fake_openai["requests"]]
    assert statuses == [(400, None), (200, 7)]


def test_a_400_about_anything_else_is_not_sent_again(run_tool, make_ctx, fake_openai):
    fake_openai["refuse"] = lambda payload: _refusal("messages", "invalid_value", "bad messages")
    ctx = make_ctx(llm_base_url=fake_openai["base"], llm_model="gpt-4o-mini")
    with pytest.raises(LlmStatusError) as info:
        run_tool(LLM, {"prompt": "hello", "temperature": 0.5}, ctx)
    assert info.value.fields["status"] == 400
    assert len(fake_openai["requests"]) == 1  # temperature was not what it refused


@pytest.mark.parametrize(
    ("body", "sent", "refused"),
    [
        (
            _refusal("temperature", "unsupported_value", "x").decode(),
            ["temperature"],
            "temperature",
        ),
        # the parameter named first is the refused one, not the one it suggests
        (
            "Unsupported parameter: 'max_tokens' is not supported. Use 'max_completion_tokens'.",
            ["max_completion_tokens"],
            None,
        ),
        ("temperature is not supported with this model", ["temperature"], "temperature"),
        ("temperature must be at most 2", ["temperature"], None),  # a bad value: not dropped
        (_refusal("temperature", "unsupported_value", "x").decode(), ["max_tokens"], None),
    ],
)
def test_which_parameter_a_400_refuses(body, sent, refused):
    assert refused_param(400, body, sent) == refused
    assert refused_param(422, body, sent) is None
