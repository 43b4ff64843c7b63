"""Spans of workflow runs (tiffany/observe/otel.py): the run, and a step span per tool call.

A workflow's ``tool(...)`` call runs in the workflow's task, not a plan's
worker; it tells the recorder its outcome when it ends, and its attempts
become ``step <call id>`` spans under the run's span, as a plan step's do.
"""

from __future__ import annotations

from typing import Any

import flows  # registers the test workflows
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tiffany.engine import build
from tiffany.kernel import Instrument, Sleep, Task
from tiffany.observe.otel import attach, build_tracer_provider, trace_id_of


def _traced(settings: Any, runs: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], Any]:
    exporter = InMemorySpanExporter()
    engine = build(settings, enabled_tools=["sleep"])
    recorder = attach(engine.runtime, build_tracer_provider(exporter=exporter), env=engine.env)
    try:
        ids = []
        for name, inputs in runs:
            entry, run_name = engine.prepare_workflow(name, inputs)
            ids.append(engine.start_entry(entry, name=run_name))
        engine.runtime.run()
        statuses = [engine.runtime.status(i).status for i in ids]
    finally:
        engine.runtime.close()
        recorder.close()
    return ids, (statuses, exporter.get_finished_spans())


def _of(spans: Any, run_id: str) -> list[ReadableSpan]:
    got = [s for s in spans if s.attributes and s.attributes.get("tiffany.run_id") == run_id]
    return sorted(got, key=lambda s: (s.start_time or 0, s.name))


def test_a_workflow_run_is_a_span_with_a_step_span_per_tool_call(settings) -> None:
    ids, (statuses, spans) = _traced(
        settings, [("tests.tool", {"seconds": 0.05}), ("tests.bad_tool", {})]
    )
    assert statuses == ["succeeded", "failed"]
    good, bad = _of(spans, ids[0]), _of(spans, ids[1])

    run, step = good
    assert (run.name, step.name) == ("run tests.tool", "step tool_1")
    assert run.parent is None
    assert run.context.trace_id == trace_id_of(ids[0])
    assert run.attributes is not None
    assert run.attributes["tiffany.status"] == "succeeded"
    assert step.parent is not None
    assert step.parent.span_id == run.context.span_id
    assert step.attributes is not None
    assert step.attributes["tiffany.tool"] == "sleep"
    assert step.attributes["tiffany.attempt"] == 1
    assert step.attributes["tiffany.status"] == "succeeded"
    assert step.status.status_code is StatusCode.OK
    assert run.start_time is not None
    assert run.end_time is not None
    assert step.start_time is not None
    assert step.end_time is not None
    assert run.start_time <= step.start_time < step.end_time <= run.end_time
    assert step.end_time - step.start_time >= 50_000_000  # the tool's own 0.05 s

    # Arguments the tool's model refuses: no attempt ran, the call itself is the span.
    run, step = bad
    assert (run.name, step.name) == ("run tests.bad_tool", "step tool_1")
    assert step.parent is not None
    assert step.parent.span_id == run.context.span_id
    assert step.attributes is not None
    assert step.attributes["tiffany.status"] == "failed"
    assert step.status.status_code is StatusCode.ERROR
    assert "seconds" in step.attributes["tiffany.error"]
    assert run.status.status_code is StatusCode.ERROR


class _StopAtTheNap(Instrument):
    """Stops the loop (as an engine stop does) once the workflow naps between its calls."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def task_blocked(self, task: Task, call: Any) -> None:
        if isinstance(call, Sleep) and call.seconds == flows.NAP_S:
            self.engine.runtime.sched.stop()


def test_a_resumed_workflow_run_exports_only_the_calls_of_its_new_life(settings) -> None:
    # The first life makes tool_1 and stops at the nap; the next resumes the run:
    # tool_1 replays (its span is the first life's, not made again), tool_2 is new.
    exporter = InMemorySpanExporter()
    engine = build(settings, enabled_tools=["sleep"])
    engine.runtime.sched.add_instrument(_StopAtTheNap(engine))
    recorder = attach(engine.runtime, build_tracer_provider(exporter=exporter), env=engine.env)
    try:
        entry, name = engine.prepare_workflow("tests.two_tools", {})
        run_id = engine.start_entry(entry, name=name)
        engine.runtime.run()  # returns at the stop, the run napping
        assert engine.runtime.status(run_id).status == "running"
    finally:
        engine.runtime.close()
        recorder.close()
    first = {s.name: s for s in exporter.get_finished_spans()}
    assert set(first) == {"run tests.two_tools", "step tool_1"}

    exporter2 = InMemorySpanExporter()
    engine = build(settings, enabled_tools=["sleep"])
    recorder = attach(engine.runtime, build_tracer_provider(exporter=exporter2), env=engine.env)
    try:
        assert engine.recover_runs() == [run_id]
        engine.runtime.run()
        assert engine.runtime.status(run_id).status == "succeeded"
    finally:
        engine.runtime.close()
        recorder.close()
    second = {s.name: s for s in exporter2.get_finished_spans()}
    assert set(second) == {"run tests.two_tools", "step tool_2"}
    run, step = second["run tests.two_tools"], second["step tool_2"]
    assert step.parent is not None
    assert step.parent.span_id == run.context.span_id
    assert step.context.trace_id == trace_id_of(run_id)
    assert step.attributes is not None
    assert step.attributes["tiffany.tool"] == "sleep"
