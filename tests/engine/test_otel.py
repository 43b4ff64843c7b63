"""Run and step spans (tiffany/observe/otel.py): real plans, the SDK's in-memory exporter.

The last test runs ``tiffany run`` as a user would, with
``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a small OTLP/HTTP receiver on
127.0.0.1, and decodes what the exporter POSTs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import structlog
from engine_process import EngineProc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from process_support import wait_for

from tiffany.agents.tools.python import python_tool
from tiffany.config import Settings
from tiffany.engine import Engine, build
from tiffany.kernel import Instrument, Sleep, Task
from tiffany.observe import otel
from tiffany.observe.otel import attach, attach_from_env, build_tracer_provider, trace_id_of

COUNTER = "otel-flaky-calls"


@python_tool("otel.flaky")
def flaky(path: str) -> int:
    """Fail on the first call (counted in the file at ``path``), succeed after."""
    p = Path(path)
    calls = int(p.read_text()) + 1 if p.exists() else 1
    p.write_text(str(calls))
    if calls == 1:
        raise ValueError("first call fails")
    return calls


@python_tool("otel.broken")
def broken() -> None:
    """Always fail."""
    raise RuntimeError("broken for good")


def _engine(data_dir: Path, tools: list[str]) -> Engine:
    return build(Settings(data_dir=data_dir, _env_file=None), enabled_tools=tools)


def _spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return sorted(exporter.get_finished_spans(), key=lambda s: (s.start_time or 0, s.name))


def test_a_run_is_a_span_with_a_child_per_step_attempt(tmp_path: Path) -> None:
    plan = {
        "name": "traced",
        "steps": [
            {
                "id": "flaky",
                "tool": "python",
                "args": {"function": "otel.flaky", "kwargs": {"path": str(tmp_path / COUNTER)}},
                "retries": 1,
                "backoff": 0.01,
            },
            {
                "id": "write",
                "tool": "file.write",
                "args": {"path": "a.txt", "content": "x"},
                "after": ["flaky"],
            },
            {
                "id": "broken",
                "tool": "python",
                "args": {"function": "otel.broken"},
                "after": ["write"],
            },
        ],
    }
    exporter = InMemorySpanExporter()
    engine = _engine(tmp_path / "data", ["python", "file.write"])
    recorder = attach(engine.runtime, build_tracer_provider(exporter=exporter))
    try:
        run_id = engine.submit_plan(plan)
        engine.runtime.run()
        assert engine.runtime.status(run_id).status == "failed"
    finally:
        engine.runtime.close()
        recorder.close()
    spans = _spans(exporter)
    runs = [s for s in spans if s.name.startswith("run ")]
    steps = [s for s in spans if s.name.startswith("step ")]
    assert [s.name for s in runs] == ["run traced"]
    run = runs[0]
    assert run.parent is None
    assert run.context.trace_id == trace_id_of(run_id)
    assert run.attributes is not None
    assert run.attributes["tiffany.run_id"] == run_id
    assert run.attributes["tiffany.plan"] == "traced"
    assert run.attributes["tiffany.status"] == "failed"
    assert run.status.status_code is StatusCode.ERROR
    assert run.resource.attributes["service.name"] == "tiffany-engine"

    # One child per attempt: the retried step shows two, in order, with its tool.
    got = [
        (
            s.name,
            s.attributes["tiffany.attempt"],
            s.attributes["tiffany.tool"],
            s.attributes["tiffany.status"],
            s.status.status_code,
        )
        for s in steps
        if s.attributes is not None
    ]
    assert got == [
        ("step flaky", 1, "python", "failed", StatusCode.ERROR),
        ("step flaky", 2, "python", "succeeded", StatusCode.OK),
        ("step write", 1, "file.write", "succeeded", StatusCode.OK),
        ("step broken", 1, "python", "failed", StatusCode.ERROR),
    ]
    for s in steps:
        assert s.parent is not None
        assert s.parent.span_id == run.context.span_id
        assert s.context.trace_id == run.context.trace_id
        assert s.attributes is not None
        assert s.attributes["tiffany.run_id"] == run_id
        assert s.attributes["tiffany.step_id"] == s.name.removeprefix("step ")
        assert run.start_time is not None
        assert run.end_time is not None
        assert s.start_time is not None
        assert s.end_time is not None
        assert run.start_time <= s.start_time <= s.end_time <= run.end_time
    first, second = steps[0], steps[1]
    assert first.attributes is not None
    assert first.attributes["tiffany.error"] == (
        "python tool 'otel.flaky' raised ValueError: first call fails"
    )
    assert first.attributes["error.type"] == "ValueError"
    assert first.end_time is not None
    assert second.start_time is not None
    assert first.end_time <= second.start_time  # the backoff lies between the attempts
    last = steps[-1]
    assert last.attributes is not None
    assert last.attributes["tiffany.error"].endswith("RuntimeError: broken for good")
    assert last.status.description == last.attributes["tiffany.error"]


class _StopWhenSleeping(Instrument):
    """Stops the loop (as an engine stop does) once the ``nap`` step sleeps (in its worker)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def task_blocked(self, task: Task, call: Any) -> None:
        label = getattr(task.meta, "label", None)
        if label is not None and label.step_id == "nap" and isinstance(call, Sleep):
            self.engine.runtime.sched.stop()


NAP_PLAN = {
    "name": "napper",
    "steps": [
        {"id": "nap", "tool": "sleep", "args": {"seconds": 0.3}, "timeout_s": 30},
    ],
}


def test_spans_left_open_by_a_stop_end_unset_and_the_resumed_run_keeps_its_trace(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    exporter = InMemorySpanExporter()
    engine = _engine(data, ["sleep"])
    engine.runtime.sched.add_instrument(_StopWhenSleeping(engine))
    recorder = attach(engine.runtime, build_tracer_provider(exporter=exporter))
    try:
        run_id = engine.submit_plan(NAP_PLAN)
        engine.runtime.run()  # returns at the stop, the step asleep
        assert engine.runtime.status(run_id).status == "running"
    finally:
        engine.runtime.close()
        recorder.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"run napper", "step nap"}
    for s in spans.values():
        assert s.status.status_code is StatusCode.UNSET
        assert s.attributes is not None
        assert s.attributes["tiffany.status"] == "interrupted"
        assert s.context.trace_id == trace_id_of(run_id)
    assert spans["step nap"].parent is not None
    assert spans["step nap"].parent.span_id == spans["run napper"].context.span_id

    # The next life resumes the run: its spans continue the same trace.
    exporter2 = InMemorySpanExporter()
    engine = _engine(data, ["sleep"])
    recorder = attach(engine.runtime, build_tracer_provider(exporter=exporter2))
    try:
        assert engine.recover_runs() == [run_id]
        engine.runtime.run()
        assert engine.runtime.status(run_id).status == "succeeded"
    finally:
        engine.runtime.close()
        recorder.close()
    spans = {s.name: s for s in exporter2.get_finished_spans()}
    assert set(spans) == {"run napper", "step nap"}
    run, step = spans["run napper"], spans["step nap"]
    assert run.attributes is not None
    assert run.attributes["tiffany.resumed"] is True
    assert run.status.status_code is StatusCode.OK
    assert step.status.status_code is StatusCode.OK
    assert step.context.trace_id == run.context.trace_id == trace_id_of(run_id)
    assert step.parent is not None
    assert step.parent.span_id == run.context.span_id
    # The attempt began in the first life: its start is the journaled one.
    assert step.start_time is not None
    assert run.start_time is not None
    assert step.start_time < run.start_time


def test_no_variable_means_no_tracing(tmp_path: Path) -> None:
    engine = _engine(tmp_path / "data", ["sleep"])
    try:
        assert attach_from_env(engine.runtime, {}) is None
        assert attach_from_env(engine.runtime, {"OTEL_TRACES_EXPORTER": "none"}) is None
    finally:
        engine.runtime.close()


def test_variables_without_the_extra_warn_once_and_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK made unimportable, as in an install without the extra.
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.resources", None)
    monkeypatch.setattr(otel, "_warned", set())
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    engine = _engine(tmp_path / "data", ["sleep"])
    try:
        with structlog.testing.capture_logs() as logs:
            assert attach_from_env(engine.runtime, env) is None
            assert attach_from_env(engine.runtime, env) is None
        run_id = engine.submit_plan(NAP_PLAN)
        engine.runtime.run()
        assert engine.runtime.status(run_id).status == "succeeded"
    finally:
        engine.runtime.close()
    warnings = [e for e in logs if e["event"] == "otel.unavailable"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert "pip install -e '.[otel]'" in warnings[0]["message"]


class _Receiver(BaseHTTPRequestHandler):
    """A tiny OTLP/HTTP collector: keeps each POST to /v1/traces."""

    posts: list[tuple[str, str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.posts.append((self.path, self.headers.get("Content-Type") or "", body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    posts: list[tuple[str, str, bytes]] = []
    handler = type("Receiver", (_Receiver,), {"posts": posts})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", posts
    finally:
        server.shutdown()
        server.server_close()


def test_tiffany_run_exports_its_spans_over_otlp_http(
    tmp_path: Path, receiver: tuple[str, list[tuple[str, str, bytes]]]
) -> None:
    url, posts = receiver
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "name": "exported",
                "steps": [
                    {"id": "write", "tool": "file.write", "args": {"path": "a", "content": "x"}},
                    {"id": "nap", "tool": "sleep", "args": {"seconds": 0}, "after": ["write"]},
                ],
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TIFFANY_"))}
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SERVICE_NAME": "tiffany-test"}
    argv = [sys.executable, "-m", "tiffany", "--data-dir", str(tmp_path / "d"), "run"]
    proc = subprocess.run(
        [*argv, str(plan), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout)["run_id"]
    assert posts, "the exporter posted nothing"
    spans = _received(posts)
    assert sorted(s["name"] for s in spans) == ["run exported", "step nap", "step write"]
    assert {s["service"] for s in spans} == {"tiffany-test"}
    assert {s["trace_id"] for s in spans} == {trace_id_of(run_id)}


def _received(posts: list[tuple[str, str, bytes]]) -> list[dict[str, Any]]:
    """Decode the exporter's POSTs (OTLP protobuf) into one dict per span."""
    out = []
    for path, content_type, body in list(posts):
        assert path == "/v1/traces"
        assert content_type == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attrs = {a.key: a.value for a in span.attributes}
                    out.append(
                        {
                            "name": span.name,
                            "service": resource.get("service.name"),
                            "trace_id": int.from_bytes(span.trace_id, "big"),
                            "status": span.status.code,  # 0 unset, 1 ok, 2 error
                            "tiffany.status": attrs["tiffany.status"].string_value,
                            "run_id": attrs["tiffany.run_id"].string_value,
                        }
                    )
    return out


def test_the_engine_process_exports_spans_and_ends_open_ones_at_its_stop(
    tmp_path: Path, receiver: tuple[str, list[tuple[str, str, bytes]]]
) -> None:
    url, posts = receiver
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TIFFANY_"))}
    env |= {
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: the batch goes out soon after the run
        "TIFFANY_LOG_FORMAT": "json",
    }
    engine = EngineProc(tmp_path / "data", env=env)
    try:
        engine.wait_ready()
        quick = engine.call("submit", plan=NAP_PLAN, inputs={})["run_id"]
        wait_for(
            lambda: any(s["name"] == "run napper" for s in _received(posts)),
            30,
            "the finished run's span",
        )
        long_plan = {
            "name": "long",
            "steps": [{"id": "wait", "tool": "sleep", "args": {"seconds": 600}}],
        }
        long = engine.call("submit", plan=long_plan, inputs={})["run_id"]
        assert engine.call("status")["runs_active"] == 1
    finally:
        assert engine.stop() == 0, engine.log()
    spans = {(s["run_id"], s["name"]): s for s in _received(posts)}
    assert set(spans) == {
        (quick, "run napper"),
        (quick, "step nap"),
        (long, "run long"),
        (long, "step wait"),
    }
    assert spans[quick, "run napper"]["status"] == 1
    assert spans[quick, "run napper"]["service"] == "tiffany-engine"
    for name in ("run long", "step wait"):  # open at the stop: ended then, status unset
        assert spans[long, name]["status"] == 0
        assert spans[long, name]["tiffany.status"] == "interrupted"
        assert spans[long, name]["trace_id"] == trace_id_of(long)


class _Hostile(Exception):
    """An error whose ``str`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str")


def hostile_workflow() -> Any:
    """A run that fails with an error that cannot be made text."""
    yield Sleep(0)
    raise _Hostile()


@python_tool("otel.surrogate")
def surrogate() -> None:
    """Fail with an error whose message holds a lone surrogate."""
    raise ValueError("remote said x\ud800y")


def test_error_texts_from_data_neither_disable_the_recorder_nor_reach_a_span_raw(
    tmp_path: Path,
) -> None:
    """A ``str()`` that raised disabled the recorder (every later span lost); a lone
    surrogate went into an attribute the OTLP exporter cannot serialize."""
    plan = {
        "name": "poisoned",
        "steps": [
            {"id": "s", "tool": "python", "args": {"function": "otel.surrogate"}, "timeout_s": 30},
        ],
    }
    later = {
        "name": "later",
        "steps": [{"id": "w", "tool": "file.write", "args": {"path": "a.txt", "content": "x"}}],
    }
    exporter = InMemorySpanExporter()
    engine = _engine(tmp_path / "data", ["python", "file.write"])
    recorder = attach(engine.runtime, build_tracer_provider(exporter=exporter))
    try:
        engine.runtime.submit(f"{__name__}:hostile_workflow")
        engine.submit_plan(plan)
        engine.runtime.run()
        engine.submit_plan(later)
        engine.runtime.run()
    finally:
        engine.runtime.close()
        recorder.close()
    assert not recorder.disabled
    errors = {s.name: (s.attributes or {}).get("tiffany.error") for s in _spans(exporter)}
    assert "run later" in errors  # spans still made after the poisoned runs
    assert errors[f"run {__name__}:hostile_workflow"] == (
        "<_Hostile object: str() raised RuntimeError>"
    )
    assert "remote said x\\ud800y" in str(errors["step s"])
    for text in errors.values():
        str(text).encode("utf-8")  # serializable: no lone surrogate left


class _EndWhenAsleep(Instrument):
    """Ends the run once both its sleeping steps sleep: ``engine.cancel``, or a kill of its root.

    From a hook, on the loop's thread, as the engine's own requests run.
    """

    def __init__(self, engine: Engine, how: str) -> None:
        self.engine = engine
        self.how = how
        self.run_id: str | None = None
        self.asleep: set[str] = set()

    def task_blocked(self, task: Task, call: Any) -> None:
        label = getattr(task.meta, "label", None)
        if label is None or label.role != "worker" or not isinstance(call, Sleep):
            return
        self.asleep.add(label.step_id)
        if self.asleep != {"nap", "doze"} or self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        if self.how == "cancel":
            assert self.engine.cancel(run_id)
        else:
            root = self.engine.runtime.journal.runs[run_id].root
            assert root is not None
            assert self.engine.runtime.sched.kill(root.id)


ENDED_PLAN = {
    "name": "ended",
    "steps": [
        {"id": "write", "tool": "file.write", "args": {"path": "a.txt", "content": "x"}},
        {"id": "nap", "tool": "sleep", "args": {"seconds": 600}, "after": ["write"]},
        {"id": "doze", "tool": "sleep", "args": {"seconds": 600}, "after": ["write"]},
    ],
}


@pytest.mark.parametrize("how", ["cancel", "kill"])
def test_the_steps_of_a_run_ended_mid_step_are_children_of_its_span(
    tmp_path: Path, how: str
) -> None:
    """A run ends before the steps it cancels do: their spans had no parent (a
    second root in the run's trace), since the run's span was forgotten first."""
    exporter = InMemorySpanExporter()
    engine = _engine(tmp_path / "data", ["sleep", "file.write"])
    ender = _EndWhenAsleep(engine, how)
    engine.runtime.sched.add_instrument(ender)
    recorder = attach(engine.runtime, build_tracer_provider(exporter=exporter))
    try:
        ender.run_id = run_id = engine.submit_plan(ENDED_PLAN)
        engine.runtime.run()
        assert ender.asleep == {"nap", "doze"}
        assert engine.runtime.status(run_id).status == "cancelled"
    finally:
        engine.runtime.close()
        recorder.close()
    spans = _spans(exporter)
    assert sorted(s.name for s in spans) == ["run ended", "step doze", "step nap", "step write"]
    assert {s.context.trace_id for s in spans} == {trace_id_of(run_id)}
    roots = [s for s in spans if s.parent is None]
    assert [s.name for s in roots] == ["run ended"]
    run = roots[0]
    by_id = {s.context.span_id: s for s in spans}
    for s in spans:
        ancestor = s
        while ancestor.parent is not None:  # every span's chain ends at the run's span
            ancestor = by_id[ancestor.parent.span_id]
        assert ancestor is run, s.name
        assert s.attributes is not None
        assert s.end_time is not None
        assert run.end_time is not None
        assert s.end_time <= run.end_time  # the trace nests in time too
    status = {s.name: (s.attributes or {}).get("tiffany.status") for s in spans}
    assert status == {
        "run ended": "cancelled",
        "step write": "succeeded",
        "step nap": "cancelled",
        "step doze": "cancelled",
    }
    assert not recorder.disabled
    assert recorder.open_runs == 0  # the ended run is forgotten once its last step ended
