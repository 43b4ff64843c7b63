"""Python tool functions for the python-step tests (imported by the test and its crash child)."""

from __future__ import annotations

from pathlib import Path

from tiffany.agents.tools.python import python_tool


@python_tool("test.append_line")
def append_line(path: str, line: str, carry: int = 0) -> int:
    """Append ``line`` to the file at ``path`` (the step's visible effect); return carry + 1."""
    with Path(path).open("a") as f:
        f.write(line + "\n")
    return carry + 1


@python_tool("test.flaky")
def flaky(path: str, fail_times: int) -> int:
    """Fail (ValueError) until called ``fail_times`` times; count the calls in the file."""
    p = Path(path)
    calls = int(p.read_text()) + 1 if p.exists() else 1
    p.write_text(str(calls))
    if calls <= fail_times:
        raise ValueError(f"call {calls} fails")
    return calls


def _parse_count(text: str) -> int:
    return int(text)  # the line a failed step's traceback ends on


@python_tool("test.parse")
def parse(text: str) -> int:
    """Parse ``text`` as an integer (a ValueError, two frames deep, when it is not one)."""
    return _parse_count(text)


@python_tool("test.parse_later")
def parse_later(text: str):
    """The same from a generator function (run as a kernel task, its frames among the kernel's)."""
    yield
    return _parse_count(text)
