"""Tools declared with schemas: output models that hold for real results, strict plan validation.

* every built-in tool declares ``Args`` and ``Output``; the results of a real
  engine's runs (shell, http, python, llm, file.read/write, sleep, plan.run,
  agent) validate against their tool's ``Output``;
* strict validation (a submission, ``tiffany plan validate``) names
  ``steps[i].args.FIELD``, lists the allowed fields, suggests the closest
  tool or argument, reports missing required ones, and tells a disabled
  tool from an unknown one with the fix;
* arguments holding ``${...}`` references are not refused for their type
  (they resolve at run time), but their unknown and missing fields are;
* every example plan validates strictly; the lenient parse a replay uses is
  unchanged (a plan accepted before must parse the same for ever).
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tiffany.agents import PlanError, load_plan, parse_plan
from tiffany.agents.registry import ToolDisabled, ToolRegistry, UnknownTool
from tiffany.agents.tools import BUILTIN_TOOLS, FreeFormOutput
from tiffany.agents.tools.docs import render
from tiffany.agents.tools.python import register_function, unregister_function
from tiffany.agents.tools.schema import describe
from tiffany.config import Settings
from tiffany.engine import build

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ALL = ToolRegistry.default().all_names()
DISABLED_FIX = "is disabled on this server: start it with --enable-tool shell"


def _errors(steps: list[dict[str, Any]], **kw: Any) -> dict[str, str]:
    doc = {"name": "p", "inputs": {"n": 1, "u": "http://x", "q": "hi"}, "steps": steps}
    kw.setdefault("strict", True)
    try:
        parse_plan(doc, kw.pop("tools", ALL), **kw)
    except PlanError as exc:
        return {e["loc"]: e["msg"] for e in exc.errors}
    return {}


# -- what the tools declare -------------------------------------------------------------


def test_every_builtin_declares_args_and_output_with_json_schemas():
    for cls in BUILTIN_TOOLS:
        info = describe(cls())
        assert info["name"] == cls.name
        assert info["description"], cls.name
        assert isinstance(info["durable"], bool)
        assert info["args"]["type"] == "object", cls.name
        assert issubclass(cls.Output, BaseModel)
        if issubclass(cls.Output, FreeFormOutput):
            assert info["output"]["description"].startswith("Free-form"), cls.name
        else:
            assert info["output"]["type"] == "object", cls.name
            assert info["output"]["additionalProperties"] is False
    free = {c.name for c in BUILTIN_TOOLS if issubclass(c.Output, FreeFormOutput)}
    assert free == {"python", "signal.wait", "plan.run"}


def test_arg_descriptions_come_from_the_models_docstrings():
    http = describe(next(c for c in BUILTIN_TOOLS if c.name == "http")())
    props = http["args"]["properties"]
    assert "json" in props  # the alias, as plans write it
    assert "json_body" not in props
    assert props["url"]["description"] == "An ``http://`` or ``https://`` URL."
    assert props["max_body_bytes"]["description"].startswith("Keep at most")
    assert http["args"]["required"] == ["url"]
    assert set(http["output"]["properties"]) == {"status", "headers", "body", "json", "truncated"}


@pytest.fixture
def docs_server():
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(EXAMPLES / "research" / "docs"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def schema_fn():
    register_function("schema_fn", lambda text: {"words": len(text.split())}, replace=True)
    yield "schema_fn"
    unregister_function("schema_fn")


def test_real_results_validate_against_each_tools_output_model(tmp_path, docs_server, schema_fn):
    child = {
        "name": "child",
        "steps": [{"id": "z", "tool": "sleep", "args": {"seconds": 0}}],
        "outputs": {"slept": "${steps.z.output.slept}"},
    }
    steps = [
        {"id": "sh", "tool": "shell", "args": {"argv": ["sh", "-c", "echo hi; echo err >&2"]}},
        {"id": "web", "tool": "http", "args": {"url": f"{docs_server}/alpha.txt"}},
        {"id": "py", "tool": "python", "args": {"function": schema_fn, "kwargs": {"text": "a b"}}},
        {"id": "ask", "tool": "llm", "args": {"prompt": "${inputs.q}"}},
        {"id": "w", "tool": "file.write", "args": {"path": "a/b.txt", "content": "héllo"}},
        {"id": "r", "tool": "file.read", "args": {"path": "a/b.txt"}, "after": ["w"]},
        {"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}},
        {"id": "sub", "tool": "plan.run", "args": {"plan": child}},
    ]
    plan = {
        "name": "all-tools",
        "inputs": {"q": "say something"},
        "steps": steps,
        "outputs": {s["id"]: f"${{steps.{s['id']}.output}}" for s in steps},
    }
    settings = Settings(
        data_dir=tmp_path,
        http_allow=["127.0.0.1"],
        shell_sandbox="none",
        llm_script=EXAMPLES / "agent" / "script.yaml",
    )
    engine = build(settings, enabled_tools=ALL)
    with engine.runtime as rt:
        run_id = engine.submit_plan(plan)
        agent_plan = load_plan(EXAMPLES / "agent" / "plan.yaml")
        agent_plan["outputs"] = {"work": "${steps.work.output}"}
        agent_run = engine.submit_plan(agent_plan)
        rt.run()
        state, agent_state = rt.status(run_id), rt.status(agent_run)
    assert state.status == "succeeded", state.error
    assert agent_state.status == "succeeded", agent_state.error
    outputs = state.result["outputs"]
    models = {c.name: c.Output for c in BUILTIN_TOOLS}
    for s in steps:
        models[s["tool"]].model_validate(outputs[s["id"]])
    assert outputs["sh"]["stdout"] == "hi\n"
    assert outputs["r"]["content"] == "héllo"
    assert outputs["sub"] == {"slept": 0}
    agent = models["agent"].model_validate(agent_state.result["outputs"]["work"])
    assert agent.turns == 3


# -- strict validation ------------------------------------------------------------------


def test_an_unknown_argument_is_named_by_path_with_the_allowed_fields_and_a_suggestion():
    errors = _errors(
        [
            {"id": "a", "tool": "sleep", "args": {"seconds": 1}},
            {"id": "b", "tool": "sleep", "args": {"seconds": 1}},
            {"id": "c", "tool": "http", "args": {"urll": "http://example.com/"}},
        ]
    )
    assert errors["steps[2].args.urll"] == (
        "unknown argument 'urll' of tool 'http'; did you mean 'url'? (allowed: method, url, "
        "headers, body, json, timeout_s, max_body_bytes, raise_for_status, follow_redirects)"
    )
    assert errors["steps[2].args.url"] == "missing required argument 'url' of tool 'http'"
    assert len(errors) == 2


def test_a_misspelt_tool_gets_a_suggestion_and_a_disabled_one_the_fix():
    enabled = sorted(set(ALL) - {"shell"})
    errors = _errors(
        [
            {"id": "a", "tool": "shel", "args": {"argv": ["ls"]}},
            {"id": "b", "tool": "shell", "args": {"argv": ["ls"]}},
            {"id": "c", "tool": "teleport"},
        ],
        tools=enabled,
        disabled=["shell"],
    )
    assert errors["steps[0].tool"].startswith("unknown tool 'shel'; did you mean 'shell'?")
    assert errors["steps[1].tool"] == (
        "tool 'shell' is disabled on this server: start it with --enable-tool shell "
        "(or add shell to TIFFANY_ENABLED_TOOLS)"
    )
    assert errors["steps[2].tool"].startswith("unknown tool 'teleport' (known: agent, ")
    assert "did you mean" not in errors["steps[2].tool"]


def test_the_agents_tools_must_exist_here():
    errors = _errors(
        [{"id": "a", "tool": "agent", "args": {"goal": "g", "tools": ["file.raed", "shell"]}}],
        tools=sorted(set(ALL) - {"shell"}),
        disabled=["shell"],
    )
    assert "did you mean 'file.read'?" in errors["steps[0].args.tools[0]"]
    assert DISABLED_FIX in errors["steps[0].args.tools[1]"]


def test_literal_values_are_type_checked_with_nested_paths():
    errors = _errors(
        [
            {"id": "a", "tool": "sleep", "args": {"seconds": "soon"}},
            {"id": "b", "tool": "llm", "args": {"messages": [{"role": "robot", "content": "x"}]}},
            {
                "id": "c",
                "tool": "llm",
                "args": {"prompt": "x", "messages": [{"role": "user", "content": "y"}]},
            },
        ]
    )
    assert "valid number" in errors["steps[0].args.seconds"]
    assert "steps[1].args.messages[0].role" in errors
    assert "exactly one of messages and prompt" in errors["steps[2].args"]


def test_references_are_not_refused_for_their_type_but_their_names_are_checked():
    ok = [
        # a whole reference may become any type: a number, a bool, a list
        {"id": "a", "tool": "sleep", "args": {"seconds": "${inputs.n}"}},
        {
            "id": "b",
            "tool": "http",
            "args": {"url": "${inputs.u}", "raise_for_status": "${inputs.n}"},
        },
        {
            "id": "c",
            "tool": "shell",
            "args": {"argv": ["echo", "${steps.a.output.slept}"]},
            "after": ["a"],
        },
        # a cross-field check waits for the reference (prompt is deferred)
        {"id": "d", "tool": "llm", "args": {"prompt": "${inputs.q}"}},
        # interpolated text
        {
            "id": "e",
            "tool": "http",
            "args": {"url": "http://${inputs.q}.example/", "method": "get"},
        },
        # plan.run's child plan holds the child's references, not ours
        {
            "id": "f",
            "tool": "plan.run",
            "args": {
                "plan": {
                    "name": "c",
                    "steps": [{"id": "z", "tool": "sleep", "args": {"seconds": "${inputs.x}"}}],
                }
            },
        },
        # the python function's name may come from an input
        {"id": "g", "tool": "python", "args": {"function": "${inputs.q}"}},
    ]
    assert _errors(ok) == {}
    errors = _errors(
        [
            {"id": "a", "tool": "sleep", "args": {"secs": "${inputs.n}"}},
            {"id": "b", "tool": "http", "args": {"url": "${inputs.u}", "timeout_s": -1}},
        ]
    )
    assert "did you mean 'seconds'?" in errors["steps[0].args.secs"]
    assert errors["steps[0].args.seconds"] == "missing required argument 'seconds' of tool 'sleep'"
    assert "greater than 0" in errors["steps[1].args.timeout_s"]  # a literal beside a reference
    assert len(errors) == 3


def test_every_example_plan_and_the_demo_validate_strictly():
    plans = [*sorted(EXAMPLES.glob("*/plan.yaml")), ROOT / "tiffany" / "plans" / "demo.yaml"]
    assert len(plans) >= 6
    for path in plans:
        parse_plan(load_plan(path), ALL, strict=True)


def test_the_lenient_parse_of_a_journaled_plan_is_unchanged():
    """A replay parses a plan accepted long ago: a missing argument stays the run's to report."""
    doc = {"name": "old", "steps": [{"id": "a", "tool": "sleep", "args": {"sleep": "${inputs.x}"}}]}
    doc["inputs"] = {"x": 1}
    parse_plan(doc, ALL)  # lenient: a step with a reference is left to the run
    with pytest.raises(PlanError) as info:
        parse_plan(doc, ALL, strict=True)
    assert {e["loc"] for e in info.value.errors} == {"steps[0].args.sleep", "steps[0].args.seconds"}


def test_an_engine_refuses_a_disabled_tool_at_submission_with_the_fix(tmp_path):
    engine = build(Settings(data_dir=tmp_path))  # the server default: shell is off
    with engine.runtime, pytest.raises(PlanError) as info:
        engine.prepare_plan(
            {"name": "p", "steps": [{"id": "a", "tool": "shell", "args": {"argv": ["ls"]}}]}
        )
    assert info.value.errors == [
        {
            "loc": "steps[0].tool",
            "msg": "tool 'shell' is disabled on this server: start it with --enable-tool shell "
            "(or add shell to TIFFANY_ENABLED_TOOLS)",
        }
    ]
    with engine.runtime, pytest.raises(PlanError) as bad:
        engine.prepare_plan(
            {"name": "p", "steps": [{"id": "a", "tool": "sleep", "args": {"second": 1}}]}
        )
    assert {e["loc"] for e in bad.value.errors} == {"steps[0].args.second", "steps[0].args.seconds"}


def test_the_registry_tells_disabled_from_unknown():
    reg = ToolRegistry.default()
    with pytest.raises(ToolDisabled, match="--enable-tool shell"):
        reg.get("shell")
    with pytest.raises(UnknownTool, match="did you mean 'sleep'"):
        reg.get("slep")
    with pytest.raises(UnknownTool, match="did you mean 'shell'"):
        ToolRegistry.default(enabled=["shel"])
    listed = reg.describe()
    assert [t["name"] for t in listed["tools"]][:2] == ["http", "python"]
    assert listed["disabled"] == ["shell"]
    json.dumps(listed)  # what the control channel carries


def test_docs_tools_md_is_current():
    """docs/tools.md is generated from the models: regenerate it when a tool changes."""
    page = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    assert page == render(), "run: python -m tiffany.agents.tools.docs > docs/tools.md"
    for cls in BUILTIN_TOOLS:
        assert f"## `{cls.name}`" in page
