"""The python tool: registered plain and generator callables, entry points, errors."""

from __future__ import annotations

import threading
from importlib.metadata import EntryPoint

import pytest

from tiffany.agents.tools import python as pytool
from tiffany.agents.tools.base import ToolError
from tiffany.agents.tools.python import (
    PythonError,
    PythonTool,
    UnknownFunction,
    python_tool,
    unregister_function,
)
from tiffany.kernel import ManualClock, Now, Sleep

PY = PythonTool()
MAIN_THREAD = threading.get_ident()
SEEN: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _registered():
    @python_tool("test.add")
    def add(a: int, b: int = 1) -> dict[str, int]:
        SEEN["thread"] = threading.get_ident()
        return {"sum": a + b}

    @python_tool("test.wait_then_echo")
    def wait_then_echo(value: str, seconds: float):
        started = yield Now()
        yield Sleep(seconds)
        ended = yield Now()
        return {"value": value, "waited": ended - started}

    @python_tool("test.boom")
    def boom() -> None:
        raise ValueError("bad input")

    yield
    for name in ("test.add", "test.wait_then_echo", "test.boom", "ep_basename"):
        unregister_function(name)
    SEEN.clear()


def test_plain_function_runs_in_the_thread_pool(run_tool, make_ctx):
    out = run_tool(PY, {"function": "test.add", "kwargs": {"a": 2, "b": 5}}, make_ctx())
    assert out == {"sum": 7}
    assert SEEN["thread"] != MAIN_THREAD


def test_generator_function_runs_as_a_kernel_coroutine(run_tool, make_ctx):
    clock = ManualClock()
    args = {"function": "test.wait_then_echo", "kwargs": {"value": "v", "seconds": 600}}
    out = run_tool(PY, args, make_ctx(), clock=clock)
    assert out == {"value": "v", "waited": 600}
    assert clock.monotonic() == 600  # slept on the scheduler's (manual) clock


def test_unknown_function(run_tool, make_ctx):
    with pytest.raises(UnknownFunction) as info:
        run_tool(PY, {"function": "test.nope"}, make_ctx())
    assert info.value.code == "tool.python.unknown"
    assert "test.add" in info.value.message  # lists what is registered


def test_errors_become_tool_errors_with_the_type(run_tool, make_ctx):
    with pytest.raises(PythonError) as info:
        run_tool(PY, {"function": "test.boom"}, make_ctx())
    assert info.value.code == "tool.python.error"
    assert info.value.fields["type"] == "ValueError"
    assert "bad input" in info.value.message
    with pytest.raises(PythonError, match="TypeError"):
        run_tool(PY, {"function": "test.add", "kwargs": {"nope": 1}}, make_ctx())


def test_a_tool_error_of_the_users_own_keeps_its_fields_and_gains_its_frames(run_tool, make_ctx):
    """A ToolError raised on purpose is the step's error as it is, and says where it came from."""

    @python_tool("test.refuse")
    def refuse() -> None:
        raise ToolError("refused on purpose", reason="policy")

    try:
        with pytest.raises(ToolError) as info:
            run_tool(PY, {"function": "test.refuse"}, make_ctx())
    finally:
        unregister_function("test.refuse")
    assert info.value.fields["reason"] == "policy"
    (frame,) = info.value.fields["traceback"]
    assert frame["function"].endswith("refuse")
    assert frame["code"] == 'raise ToolError("refused on purpose", reason="policy")'


def test_a_bare_decorator_registers_the_function_under_its_own_name(run_tool, make_ctx):
    """``@python_tool`` with no name: the function's own (what a user writes first)."""

    @python_tool
    def shout(text: str) -> str:
        return text.upper()

    @python_tool(inline=True)
    def whisper(text: str) -> str:
        return text.lower()

    try:
        assert shout("a") == "A"  # still the function itself
        assert run_tool(PY, {"function": "shout", "kwargs": {"text": "hi"}}, make_ctx()) == "HI"
        out = run_tool(PY, {"function": "whisper", "kwargs": {"text": "HI"}}, make_ctx())
        assert out == "hi"
        with pytest.raises(TypeError, match="must be a string"):
            python_tool(3)  # type: ignore[call-overload]
    finally:
        unregister_function("shout")
        unregister_function("whisper")


def test_double_registration_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        python_tool("test.add")(lambda: None)


def test_entry_points_register_by_name(run_tool, make_ctx, monkeypatch):
    ep = EntryPoint(name="ep_basename", value="posixpath:basename", group=pytool.ENTRY_POINT_GROUP)
    groups = []

    def fake_entry_points(*, group):
        groups.append(group)
        return [ep]

    monkeypatch.setattr(pytool, "entry_points", fake_entry_points)
    monkeypatch.setattr(pytool, "_entry_points_loaded", False)
    out = run_tool(PY, {"function": "ep_basename", "kwargs": {"p": "/a/b.txt"}}, make_ctx())
    assert out == "b.txt"
    assert groups == ["tiffany.tools"]
    assert "ep_basename" in pytool.functions()
