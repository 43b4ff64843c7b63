"""@workflow refuses, at registration and naming the function, what cannot be a workflow."""

from __future__ import annotations

import pytest

from tiffany.workflows import (
    WorkflowDefinitionError,
    input_problems,
    lookup,
    names,
    unregister,
    workflow,
)


def _refused(name: str, fn) -> str:
    with pytest.raises(WorkflowDefinitionError) as bad:
        workflow(name)(fn)
    return bad.value.message


def test_a_plain_function_is_refused_naming_it() -> None:
    def plain(x: int) -> dict:
        return {}

    msg = _refused("reg.plain", plain)
    assert "test_workflow_registry:test_a_plain_function_is_refused_naming_it.<locals>.plain" in msg
    assert "is not a generator function" in msg


def test_positional_only_and_var_positional_parameters_are_refused() -> None:
    def by_position(x, /):
        yield

    def var_args(*xs):
        yield

    assert "parameter 'x'" in _refused("reg.pos", by_position)
    assert "positional-only" in _refused("reg.pos", by_position)
    assert "takes *xs" in _refused("reg.var", var_args)


@pytest.mark.parametrize("name", ["plan", "workflow", "tiffany.x", "", "has space", "9x"])
def test_reserved_and_malformed_names_are_refused(name: str) -> None:
    def fn():
        yield

    assert "workflow" in _refused(name, fn)


def test_a_name_taken_by_another_function_is_refused_the_same_again_replaces() -> None:
    def first():
        yield

    def second():
        yield

    try:
        workflow("reg.taken")(first)
        workflow("reg.taken")(first)  # a module imported again
        msg = _refused("reg.taken", second)
        assert "is registered already, by" in msg
        assert "first" in msg
        assert "reg.taken" in names()
    finally:
        unregister("reg.taken")


def test_inputs_are_checked_against_the_signature_and_kwargs_take_any() -> None:
    def fn(a: int, b: int = 2):
        yield

    def open_fn(a: int, **rest):
        yield

    try:
        wf = lookup(workflow("reg.sig")(fn) and "reg.sig")
        assert input_problems(wf, {"a": 1}) == []
        problems = input_problems(wf, {"b": 1, "c": 3})
        assert [p["loc"] for p in problems] == ["inputs.c", "inputs.a"]
        workflow("reg.open")(open_fn)
        assert input_problems(lookup("reg.open"), {"a": 1, "zzz": 2}) == []
    finally:
        unregister("reg.sig")
        unregister("reg.open")


def test_an_annotated_input_of_another_type_is_refused_naming_it() -> None:
    def fn(name: str, times: int = 2, rate: float = 1.0, tags: list[str] | None = None, free=None):
        yield

    try:
        wf = lookup(workflow("reg.types")(fn) and "reg.types")
        fine = {"name": "x", "times": 3, "rate": 2, "tags": ["a"], "free": {"any": [1]}}
        assert input_problems(wf, fine) == []  # an int is a float; unannotated takes any
        problems = input_problems(wf, {"name": 5, "times": "lots", "tags": [1]})
        assert [p["loc"] for p in problems] == ["inputs.name", "inputs.times", "inputs.tags"]
        assert "valid integer, got 'lots'" in problems[1]["msg"]
        assert "workflow 'reg.types'" in problems[1]["msg"]
        # strict: no coercion of a bool or a numeric string into an int
        assert [p["loc"] for p in input_problems(wf, {"name": "x", "times": True})] == [
            "inputs.times"
        ]
        assert input_problems(wf, {"name": "x", "times": "3"})
    finally:
        unregister("reg.types")


def test_plan_is_the_built_in_workflow_that_runs_plans_and_no_user_s() -> None:
    def mine():
        yield

    msg = _refused("plan", mine)
    assert "built-in workflow" in msg
    assert "planner" in msg
    built_in = lookup("plan")
    assert built_in.root is not None
    assert built_in.params == ("plan", "inputs")
    assert "plan" not in names()  # the users' workflows


def test_one_resolver_rebuilds_plan_and_workflow_runs(tmp_path) -> None:
    from tiffany.agents import AgentEnv, plan_entry
    from tiffany.agents.registry import ToolRegistry
    from tiffany.durable import Runtime
    from tiffany.workflows import WorkflowInputError, prepare_workflow, workflow_resolver

    env = AgentEnv(ToolRegistry.default(enabled=["sleep"]), tmp_path / "workspaces")
    plan = {"name": "one", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}
    with Runtime(tmp_path, resolvers={"workflow": workflow_resolver(env)}) as rt:
        run_id = rt.submit_entry(plan_entry(plan), name="one")
        rt.run()
        assert rt.status(run_id).status == "succeeded"
        assert rt.journal.runs[run_id].result["outputs"] == {}
    with pytest.raises(ValueError, match="built-in workflow 'plan'"):
        Runtime(tmp_path / "other", resolvers={"plan": workflow_resolver(env)})
    with pytest.raises(WorkflowInputError) as refused:
        prepare_workflow("plan", {"plan": plan})
    assert refused.value.errors[0]["loc"] == "workflow"
