"""A python step whose function this engine lacks: refused at submit, held when recovered.

What the worker yields must not depend on what an engine has registered (a
recovered run would diverge from its journal, as the kill -9 suite found when
an engine restarted without the package that registers a function): the
step is the same thread step either way, and the journal's step gate holds
it until an engine that has the function runs it.
"""

from __future__ import annotations

import pytest

from tiffany.agents import PlanError
from tiffany.agents.registry import ToolRegistry
from tiffany.agents.tools.python import (
    PythonArgs,
    PythonTool,
    register_function,
    unregister_function,
)
from tiffany.engine import build

NAME = "tests_missing_function.echo"


@pytest.fixture(autouse=True)
def _unregistered():
    if _known():
        unregister_function(NAME)
    yield
    if _known():
        unregister_function(NAME)


def _known() -> bool:
    from tiffany.agents.tools.python import functions

    return NAME in functions()


def _echo(value: str) -> str:
    return value


def test_the_step_is_the_same_whether_or_not_the_function_is_registered() -> None:
    args = PythonArgs(function=NAME, kwargs={"value": "x"})
    missing = PythonTool().step_for(args)
    register_function(NAME, _echo)
    present = PythonTool().step_for(args)
    assert missing is not None
    assert present is not None
    assert (
        (missing.name, missing.inline)
        == (present.name, present.inline)
        == (
            f"python:{NAME}",
            False,
        )
    )
    # Made while missing, called once registered: it runs the function.
    assert missing.fn(*missing.args) == "x"


def test_the_gate_holds_a_missing_function_and_lets_it_go_once_registered() -> None:
    registry = ToolRegistry.default()
    step = PythonTool().step_for(PythonArgs(function=NAME))
    reason = registry.step_gate(None, step)
    assert reason is not None
    assert f"python function {NAME} is not registered" in reason
    register_function(NAME, _echo)
    assert registry.step_gate(None, step) is None
    disabled = ToolRegistry.default(enabled=["sleep"])
    assert "tool python is disabled" in (disabled.step_gate(None, step) or "")


def test_a_plan_naming_a_missing_function_is_refused_at_submit(settings) -> None:
    engine = build(settings, enabled_tools=["python"])
    try:
        plan = {
            "name": "p",
            "steps": [{"id": "a", "tool": "python", "args": {"function": NAME}}],
        }
        with pytest.raises(PlanError) as info:
            engine.prepare_plan(plan, {})
        (problem,) = info.value.errors
        assert problem["loc"] == "steps[0].args.function"
        assert NAME in problem["msg"]
        register_function(NAME, _echo)
        entry, name = engine.prepare_plan(plan, {})
        assert name == "p"
        assert entry["kind"] == "plan"
    finally:
        engine.runtime.close()
