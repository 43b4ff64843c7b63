"""``tiffany/agents/tracebacks.py``: the user's frames of an exception, bounded, journal-safe."""

from __future__ import annotations

import json

import pytest

from tiffany.agents.tools.python import (
    PythonArgs,
    PythonTool,
    UnknownFunction,
    register_function,
    unregister_function,
)
from tiffany.agents.tracebacks import (
    DEFAULT_TRACEBACK_CHARS,
    DEFAULT_TRACEBACK_FRAMES,
    TracebackLimits,
    traceback_fields,
    user_frames,
)
from tiffany.config import Settings
from tiffany.engine import tool_settings
from tiffany.wire.values import canonical


def _caught(fn, *args):
    try:
        fn(*args)
    except Exception as exc:
        return exc
    raise AssertionError("no exception")


def _down(n: int) -> None:
    if n == 0:
        raise ValueError("bottom")
    _down(n - 1)


@pytest.fixture
def registered():
    names: list[str] = []

    def register(name, fn):
        register_function(name, fn)
        names.append(name)

    yield register
    for name in names:
        unregister_function(name)


def test_only_frames_outside_tiffany_are_kept_innermost_last(registered):
    """A frame of tiffany's own (the python tool's wrapper) is no frame of the user's."""

    def user() -> None:
        json.loads("{")

    registered("test.tb.user", user)
    step = PythonTool().step_for(PythonArgs(function="test.tb.user"))
    assert step is not None
    exc = _caught(step.fn, *step.args)
    fields = exc.fields
    frames = fields["traceback"]
    assert frames[0]["function"].endswith(".user")
    assert frames[0]["file"] == __file__
    assert frames[0]["code"] == 'json.loads("{")'
    assert all("/tiffany/" not in f["file"] for f in frames)
    assert frames[-1]["file"].endswith("json/decoder.py")  # where it was raised
    assert "traceback_omitted" not in fields


def test_a_deep_traceback_keeps_its_innermost_frames_and_counts_the_rest():
    exc = _caught(_down, 50)
    frames, omitted = user_frames(exc, TracebackLimits(frames=5))
    assert len(frames) == 5
    assert omitted == 52 - 5  # _caught, 51 calls of _down
    assert frames[-1]["code"] == 'raise ValueError("bottom")'
    assert traceback_fields(exc, TracebackLimits(frames=5))["traceback_omitted"] == omitted


def test_long_texts_are_cut_a_path_keeping_its_end():
    exc = _caught(_down, 0)
    frames, _ = user_frames(exc, TracebackLimits(chars=20))
    assert all(len(f["file"]) <= 20 and len(f["code"]) <= 20 for f in frames)
    assert frames[-1]["file"].startswith("...")
    assert frames[-1]["file"].endswith("tracebacks.py")  # the end of the path: the file's name
    assert frames[-1]["code"] == "raise ValueError(..."  # 17 characters and the mark


def test_a_file_name_with_a_lone_surrogate_is_kept_escaped_and_journals():
    """A path of undecodable bytes (surrogate-escaped) must not make the error unjournalable."""
    code = compile("def f():\n    raise KeyError('k')\n", "/tmp/bad-\udcff-name.py", "exec")
    space: dict = {}
    exec(code, space)  # a function from a file name holding a lone surrogate
    exc = _caught(space["f"])
    frames, _ = user_frames(exc)
    assert frames[-1]["file"] == "/tmp/bad-\\udcff-name.py"
    assert frames[-1]["code"] == ""  # no such file: no source line
    canonical(frames)  # encodes as the journal packs it


def test_an_error_of_tiffany_code_only_has_no_traceback():
    """An unknown function fails in tiffany's frames alone: there is no user code to show."""
    step = PythonTool().step_for(PythonArgs(function="test.tb.nowhere"))
    assert step is not None
    with pytest.raises(UnknownFunction) as info:
        step.fn(*step.args)
    assert "traceback" not in info.value.fields


def test_the_settings_defaults_are_the_modules_and_reach_the_tools():
    settings = Settings(traceback_frames=7, traceback_chars=99)
    assert tool_settings(settings).traceback == TracebackLimits(7, 99)
    default = Settings()
    assert (default.traceback_frames, default.traceback_chars) == (
        DEFAULT_TRACEBACK_FRAMES,
        DEFAULT_TRACEBACK_CHARS,
    )


@pytest.mark.parametrize("bad", [{"traceback_frames": 0}, {"traceback_chars": 3}])
def test_settings_refuse_bounds_that_keep_nothing(bad):
    with pytest.raises(ValueError):  # noqa: PT011 - pydantic's ValidationError
        Settings(**bad)
