"""``signal.wait``'s payload schema: what a run's waits hold a sent signal to (``RunSignals``).

Names resolved from the inputs, a name known only at run time, the fields
at fault by JSON pointer (escaped, bounded), a dynamic step's waits added
while the run goes on (a bad schema there left out: the step fails when
it runs), and the engine holding a run's signals to them from its start.
"""

from __future__ import annotations

from typing import Any

import pytest

from tiffany.agents import PlanError
from tiffany.agents.plan import StepSpec
from tiffany.agents.tools.python import register_function, unregister_function
from tiffany.agents.tools.signal import MAX_PAYLOAD_ERRORS, RunSignals, SignalWaitArgs, pointer
from tiffany.engine import build

GROW = "tests_signal_schemas.grow"
NEEDS_BY = {"type": "object", "required": ["by"]}


def _wait(step: str, name: str, schema: Any = None) -> dict[str, Any]:
    args: dict[str, Any] = {"name": name}
    if schema is not None:
        args["schema"] = schema
    return {"id": step, "tool": "signal.wait", "args": args}


def test_names_resolve_from_the_inputs_and_a_runtime_name_silences_the_warning() -> None:
    waits = RunSignals.of_steps([_wait("a", "${inputs.gate}", NEEDS_BY)], {"gate": "go"})
    assert waits.names() == ["go"]
    assert waits.refusal("go", {}) is not None
    assert waits.warning("go", "run r") is None
    assert "its steps wait for: go (step a)" in (waits.warning("stop", "run r") or "")
    later = RunSignals.of_steps([_wait("b", "${steps.a.output.next}", NEEDS_BY)], {})
    assert later.names() == []
    assert later.warning("anything", "run r") is None  # any name may be awaited
    assert later.refusal("anything", {}) is None  # its schema applies to no name known now


def test_the_fields_at_fault_are_named_by_json_pointer_at_most_a_bound_of_them() -> None:
    schema = {
        "type": "object",
        "properties": {"a/b": {"type": "array", "items": {"type": "integer"}}},
        "additionalProperties": {"type": "integer"},
    }
    waits = RunSignals.of_steps([_wait("s", "go", schema)], {})
    refused = waits.refusal("go", {"a/b": [1, "two"], "~x": "y"})
    assert refused is not None
    assert [i["pointer"] for i in refused[1]] == ["/a~1b/1", "/~0x"]
    assert [i["loc"] for i in refused[1]] == [["body", "a/b", 1], ["body", "~x"]]
    many = waits.refusal("go", {f"k{i}": "v" for i in range(50)})
    assert many is not None
    assert len(many[1]) == MAX_PAYLOAD_ERRORS
    assert pointer([]) == ""


def test_a_dynamic_steps_waits_are_added_and_a_bad_schema_of_one_is_left_out() -> None:
    waits = RunSignals.of_steps([_wait("a", "go")], {})
    added = waits.plus(
        [
            StepSpec.model_validate(_wait("b", "late", NEEDS_BY)),
            StepSpec.model_validate(_wait("c", "odd", {"type": "objekt"})),
        ],
        {},
    )
    assert added.names() == ["go", "late", "odd"]
    assert added.refusal("late", {}) is not None
    assert added.refusal("odd", {}) is None
    assert waits.names() == ["go"]  # never changed: replaced


def test_the_schema_argument_is_checked_with_the_step() -> None:
    assert SignalWaitArgs.model_validate({"name": "a", "schema": NEEDS_BY}).payload_schema
    with pytest.raises(ValueError, match="points outside the schema"):
        SignalWaitArgs.model_validate({"name": "a", "schema": {"$ref": "file:///etc/passwd"}})


def _grow() -> dict[str, Any]:
    return {"steps": [_wait("late", "late", NEEDS_BY)]}


def test_the_engine_holds_a_runs_signals_to_its_steps_schemas_dynamic_ones_too(
    settings,
) -> None:
    register_function(GROW, _grow, replace=True)
    engine = build(settings, enabled_tools=["python", "signal.wait"])
    try:
        plan = {
            "name": "grows",
            "steps": [
                _wait("approve", "approve", NEEDS_BY),
                {"id": "grow", "tool": "python", "dynamic": True, "args": {"function": GROW}},
            ],
        }
        with pytest.raises(PlanError) as bad:
            engine.prepare_plan({"name": "x", "steps": [_wait("s", "a", {"type": 3})]})
        assert bad.value.errors[0]["loc"] == "steps[0].args.schema"
        run_id = engine.submit_plan(plan)
        assert engine.signals[run_id].names() == ["approve"]
        engine.runtime.run()  # until every task waits: the dynamic step has added its wait
        waits = engine.signals[run_id]
        assert waits.names() == ["approve", "late"]
        refused = waits.refusal("late", {"who": "x"})
        assert refused is not None
        assert [(i["step"], i["pointer"]) for i in refused[1]] == [("late", "/by")]
    finally:
        engine.runtime.close()
        unregister_function(GROW)
