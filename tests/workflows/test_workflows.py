"""Workflows in an engine in-process: submission, tools, signals, children, outputs."""

from __future__ import annotations

from typing import Any

import flows  # registers the test workflows
import pytest

from tiffany.engine import build
from tiffany.kernel import Now
from tiffany.workflows import WorkflowInputError


def _engine(settings, tools=("sleep", "signal.wait", "plan.run")):
    return build(settings, enabled_tools=list(tools))


def _run(engine, name: str, inputs: dict[str, Any] | None = None) -> Any:
    entry, run_name = engine.prepare_workflow(name, inputs or {})
    run_id = engine.start_entry(entry, name=run_name)
    engine.runtime.run()
    return engine.runtime.status(run_id)


def test_a_workflow_runs_and_its_returned_dict_is_the_runs_outputs(settings) -> None:
    engine = _engine(settings)
    try:
        state = _run(engine, "tests.hello", {"name": "ann", "times": 3})
        assert state.status == "succeeded"
        assert state.result == {
            "outputs": {"greeting": "hello ann", "doubled": [0, 2, 4], "late": True}
        }
    finally:
        engine.runtime.close()


def test_a_tool_call_is_a_journaled_step_and_bad_arguments_fail_naming_the_field(
    settings,
) -> None:
    engine = _engine(settings)
    try:
        state = _run(engine, "tests.tool", {"seconds": 0.01})
        assert state.status == "succeeded", state.error
        assert state.result["outputs"]["slept"] == {"slept": 0.01}
        state = _run(engine, "tests.bad_tool")
        assert state.status == "failed"
        assert state.error.code == "workflow.tool_failed"
        assert "args.seconds" in str(state.error)
    finally:
        engine.runtime.close()


def test_a_non_dict_return_fails_the_run_naming_the_function(settings) -> None:
    engine = _engine(settings)
    try:
        state = _run(engine, "tests.not_a_dict")
        assert state.status == "failed"
        assert "(flows:not_a_dict) returned list" in str(state.error)
    finally:
        engine.runtime.close()


def test_submission_checks_the_name_and_the_inputs_against_the_signature(settings) -> None:
    engine = _engine(settings)
    try:
        with pytest.raises(WorkflowInputError) as bad:
            engine.prepare_workflow("tests.helo", {})
        assert bad.value.errors[0]["loc"] == "workflow"
        assert "did you mean 'tests.hello'" in bad.value.errors[0]["msg"]
        assert "--import" in bad.value.errors[0]["msg"]
        assert "tests.hello" in bad.value.errors[0]["msg"]
        with pytest.raises(WorkflowInputError) as bad:
            engine.prepare_workflow("tests.hello", {"nam": "x"})
        locs = sorted(e["loc"] for e in bad.value.errors)
        assert locs == ["inputs.nam", "inputs.name"]
        assert "did you mean 'name'" in bad.value.message
    finally:
        engine.runtime.close()


def test_a_signal_wait_takes_the_payload_and_a_schema_refuses_a_bad_one(settings) -> None:
    engine = _engine(settings)
    try:
        schema = {"type": "object", "required": ["by"], "properties": {"by": {"type": "string"}}}
        entry, name = engine.prepare_workflow("tests.signal", {"schema": schema})
        run_id = engine.start_entry(entry, name=name)
        engine.runtime.run()  # until it waits
        journal = engine.runtime.journal
        assert journal.awaited_signals(run_id) == ["approve"]
        refused = engine.signals[run_id].refusal("approve", {"by": 3})
        assert refused is not None
        assert refused[1][0]["pointer"] == "/by"
        journal.request_signal(run_id, "approve", {"by": "bob"}, "s1", lambda seq, ended: None)
        engine.runtime.run()
        state = engine.runtime.status(run_id)
        assert state.status == "succeeded", state.error
        assert state.result["outputs"] == {"approved_by": "bob"}
    finally:
        engine.runtime.close()


def test_a_signal_timeout_raises_at_the_yield_and_finally_runs(settings) -> None:
    engine = _engine(settings)
    try:
        state = _run(engine, "tests.signal", {"timeout_s": 0.05})
        assert state.status == "failed"
        assert state.error.code == "signal.timeout"
    finally:
        engine.runtime.close()


def test_cancel_raises_at_the_current_yield_and_finally_runs(settings) -> None:
    engine = _engine(settings)
    try:
        entry, name = engine.prepare_workflow("tests.signal", {"tag": "cancel-test"})
        run_id = engine.start_entry(entry, name=name)
        engine.runtime.run()
        assert "cancel-test" not in flows.CLEANED
        assert engine.cancel(run_id)
        engine.runtime.run()
        state = engine.runtime.status(run_id)
        assert state.status == "cancelled"
        assert type(state.error).__name__ == "TaskCancelled"
        assert "cancel-test" in flows.CLEANED  # the finally's step ran
    finally:
        engine.runtime.close()


def test_child_runs_of_a_workflow_and_of_a_plan_give_their_outputs(settings) -> None:
    engine = _engine(settings)
    try:
        state = _run(engine, "tests.child", {"n": 2})
        assert state.status == "succeeded", state.error
        outs = state.result["outputs"]["children"]
        assert [o.get("greeting") for o in outs[:2]] == ["hello c0", "hello c1"]
        assert len(outs) == 3
        kids = sorted(r for r in engine.runtime.journal.runs if r.startswith(state.run_id + "."))
        assert kids == [f"{state.run_id}.child_{i}.1" for i in (1, 2, 3)]
    finally:
        engine.runtime.close()


def test_a_call_outside_a_workflow_is_refused_naming_the_call() -> None:
    from tiffany.workflows import WorkflowCallError, tool

    with pytest.raises(WorkflowCallError, match=r"tool\(\) is a workflow's call"):
        tool("sleep", seconds=1)


def test_an_unfinished_run_resumes_at_engine_start_and_waits_for_its_module(settings) -> None:
    from tiffany.workflows import lookup, register, unregister

    engine = _engine(settings)
    try:
        entry, name = engine.prepare_workflow("tests.signal", {})
        run_id = engine.start_entry(entry, name=name)
        engine.runtime.run()  # it waits for "approve"
    finally:
        engine.runtime.close()
    wf = lookup("tests.signal")
    unregister("tests.signal")
    try:  # an engine that did not import the module: the run is left for one that did
        engine = _engine(settings)
        try:
            assert engine.recover_runs() == []
            assert engine.runtime.unresolved == [run_id]
        finally:
            engine.runtime.close()
    finally:
        register("tests.signal", wf.fn)
    engine = _engine(settings)
    try:
        assert engine.recover_runs() == [run_id]
        engine.runtime.run()
        journal = engine.runtime.journal
        assert journal.awaited_signals(run_id) == ["approve"]
        journal.request_signal(run_id, "approve", {"by": "eve"}, "s1", lambda seq, ended: None)
        engine.runtime.run()
        state = engine.runtime.status(run_id)
        assert state.status == "succeeded", state.error
        assert state.result == {"outputs": {"approved_by": "eve"}}
    finally:
        engine.runtime.close()


def test_a_child_run_is_cancelled_with_its_parent(settings) -> None:
    engine = _engine(settings)
    try:
        entry, name = engine.prepare_workflow("tests.parent_of_forever", {})
        parent = engine.start_entry(entry, name=name)
        engine.runtime.run()  # the parent waits for its child, which waits for a signal
        child_id = f"{parent}.child_1.1"
        journal = engine.runtime.journal
        assert journal.runs[child_id].status == "running"
        assert engine.cancel(parent)
        engine.runtime.run()
        assert journal.runs[parent].status == "cancelled"
        assert journal.runs[child_id].status == "cancelled"
    finally:
        engine.runtime.close()


def test_outputs_that_are_not_json_fail_the_run_naming_the_field(settings) -> None:
    engine = _engine(settings)
    try:
        state = _run(engine, "tests.not_json")
        assert state.status == "failed"
        assert state.error.code == "workflow.result"
        assert "(flows:not_json) returned outputs that are not JSON" in str(state.error)
        assert state.error.fields["field"] == "outputs.bad"
    finally:
        engine.runtime.close()


def test_a_workflow_call_inside_a_generator_step_is_refused(settings) -> None:
    engine = _engine(settings)
    try:
        state = _run(engine, "tests.tool_in_step")
        assert state.status == "failed"
        assert "tool() is a workflow's call" in str(state.error)
    finally:
        engine.runtime.close()


def test_a_concurrency_limit_queues_workflow_runs_by_their_key_as_plan_runs(settings) -> None:
    # @workflow(..., concurrency={"key": "user-${inputs.user}", "limit": 1}): the key is
    # resolved into the entry at submission, and the engine's slots admit the runs.
    engine = _engine(settings)
    try:
        prepared = [engine.prepare_workflow("tests.limited", {"user": u}) for u in "aab"]
        assert prepared[0][0]["concurrency"] == {"key": "user-a", "limit": 1}
        ids = [engine.start_entry(entry, name=name) for entry, name in prepared]
        assert engine.slots.status() == {
            "user-a": {"running": 1, "queued": 1},
            "user-b": {"running": 1, "queued": 0},
        }
        engine.runtime.run()
        states = [engine.runtime.status(run_id) for run_id in ids]
        assert [s.status for s in states] == ["succeeded"] * 3, [s.error for s in states]
        first, second, other = (s.result["outputs"] for s in states)
        assert second["start"] >= first["end"]  # queued behind the first run of its key
        assert other["start"] < first["end"]  # another key's run did not wait
        assert engine.slots.status() == {}
    finally:
        engine.runtime.close()


def test_a_bad_concurrency_or_budget_is_refused_at_registration_naming_the_field() -> None:
    from tiffany.workflows import WorkflowDefinitionError, unregister, workflow

    def body(user: str = "x"):
        yield Now()
        return {}

    for kwargs, field in (
        ({"concurrency": {"key": "${inputs.nope}", "limit": 1}}, "concurrency.key"),
        ({"concurrency": {"key": "k", "limit": 0}}, "concurrency.limit"),
        ({"concurrency": {"key": "k"}}, "concurrency.limit"),
        ({"budget": {"usd": -1}}, "budget.usd"),
        ({"budget": {"dollars": 1}}, "budget.dollars"),
    ):
        with pytest.raises(WorkflowDefinitionError) as bad:
            workflow("tests.bad_spec", **kwargs)(body)
        assert field in bad.value.message, bad.value.message
        assert "test_workflows" in bad.value.message  # the function, by module
    unregister("tests.bad_spec")


def test_a_budget_stops_a_workflows_model_calls_with_the_plans_ledger(settings) -> None:
    # @workflow("tests.budgeted", budget={"tokens": 50}); each scripted call ~30 tokens:
    # the second crosses the budget (its step fails), the third is refused before it starts.
    engine = _engine(settings.model_copy(update={"llm_model": "scripted"}), ("llm",))
    try:
        entry, name = engine.prepare_workflow("tests.budgeted", {})
        assert entry["budget"] == {"tokens": 50}
        run_id = engine.start_entry(entry, name=name)
        engine.runtime.run()
        state = engine.runtime.status(run_id)
        assert state.status == "succeeded", state.error
        outputs, usage = state.result["outputs"], state.result["usage"]
        assert outputs["code"] == "budget.exceeded"
        assert outputs["stopped"] == 1  # the call that crossed it failed, none after
        assert len(outputs["done"]) == 1
        assert usage["tokens"] > 50  # the result's usage: the ledger's totals, as a plan's
    finally:
        engine.runtime.close()
