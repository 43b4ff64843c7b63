"""Workflows in an engine in-process: submission, tools, signals, children, outputs."""

from __future__ import annotations

from typing import Any

import pytest

import flows  # noqa: F401 - registers the test workflows
from tiffany.engine import build
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
