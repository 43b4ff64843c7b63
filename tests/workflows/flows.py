"""Workflows the tests run (imported by the tests, and by engine processes with --import)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tiffany import workflow
from tiffany.kernel import NewTask, Now, Sleep, Step, WaitTask
from tiffany.workflows import child, patched, signal, tool


def double(x: int) -> int:
    return 2 * x


@workflow("tests.hello")
def hello(name: str, times: int = 2):
    got = []
    for i in range(times):
        got.append((yield Step(double, i)))
    now = yield Now()
    return {"greeting": f"hello {name}", "doubled": got, "late": now > 0}


@workflow("tests.tool")
def uses_tool(seconds: float = 0.0):
    out = yield tool("sleep", seconds=seconds)
    return {"slept": out}


@workflow("tests.bad_tool")
def bad_tool():
    yield tool("sleep", seconds="soon")
    return {}


#: What the ``finally`` of ``tests.signal`` cleaned up (its step ran), in this process.
CLEANED: list[str] = []


def clean_up(tag: str) -> str:
    CLEANED.append(tag)
    return tag


@workflow("tests.signal")
def waits(schema: dict | None = None, timeout_s: float | None = None, tag: str = ""):
    try:
        ok = yield signal("approve", schema=schema, timeout_s=timeout_s)
    finally:
        yield Step(clean_up, tag)  # a step in a finally: it runs on a cancel too
    return {"approved_by": ok["by"]}


@workflow("tests.not_a_dict")
def not_a_dict():
    yield Step(double, 1)
    return [1, 2]


@workflow("tests.child")
def parent_of(n: int = 2):
    outs = []
    for i in range(n):
        outs.append((yield child("tests.hello", {"name": f"c{i}", "times": 1})))
    plan = {"name": "p", "steps": [{"id": "s", "tool": "sleep", "args": {"seconds": 0}}]}
    outs.append((yield child(plan, {})))
    return {"children": outs}


@workflow("tests.patched")
def versioned():
    a = yield Step(double, 1)
    if (yield patched("extra-step")):
        a += yield Step(double, 10)
    return {"a": a}


@workflow("tests.fanout")
def fanout(effects: str, width: int = 2, steps: int = 4, pause_s: float = 0.2):
    """Children each doing ``steps`` effects with a sleep between (the crash test's)."""
    tids = []
    for c in range(width):
        tids.append((yield NewTask(branch(effects, f"b{c}", steps, pause_s), name=f"b{c}")))
    done = []
    for tid in tids:
        done.append((yield WaitTask(tid)))
    return {"done": done}


def branch(effects: str, tag: str, steps: int, pause_s: float):
    out = []
    for i in range(steps):
        out.append((yield Step(effect, effects, f"{tag}-{i}")))
        yield Sleep(pause_s)
    return out


def effect(effects: str, tag: str) -> str:
    """An effect counted by files: one line appended per call.

    With a file ``TAG.hold`` beside it, the call then waits (in its thread)
    for ``TAG.release``: the crash test kills the process while it is in flight.
    """
    where = Path(effects)
    with open(where / f"{tag}.count", "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    if (where / f"{tag}.hold").exists():
        deadline = time.monotonic() + 120
        while not (where / f"{tag}.release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return tag


@workflow("tests.forever")
def forever():
    yield signal("never")  # parked with no timer: the scheduler's run() returns
    return {}


@workflow("tests.parent_of_forever")
def parent_of_forever():
    out = yield child("tests.forever", {})
    return {"child": out}


@workflow("tests.not_json")
def not_json():
    yield Step(double, 1)
    return {"fine": 1, "bad": {1, 2}}


def _calls_a_tool():
    yield
    return (yield tool("sleep", seconds=0))


@workflow("tests.tool_in_step")
def tool_in_step():
    yield Step(_calls_a_tool)
    return {}


@workflow("tests.limited", concurrency={"key": "user-${inputs.user}", "limit": 1})
def limited(user: str, pause_s: float = 0.3):
    start = yield Now()
    yield Sleep(pause_s)
    end = yield Now()
    return {"user": user, "start": start, "end": end}


@workflow("tests.budgeted", budget={"tokens": 50})
def budgeted(calls: int = 4):
    """Model calls until the budget stops them: the plan's ledger, shared by tool(...) calls."""
    from tiffany.workflows import ToolFailed

    done = []
    for i in range(calls):
        try:
            out = yield tool("llm", prompt="one two three four five six seven eight nine ten")
        except ToolFailed as exc:
            return {"done": done, "stopped": i, "code": exc.fields.get("error_code")}
        done.append(out["usage"]["total_tokens"])
    return {"done": done, "stopped": None, "code": None}


#: How long ``tests.two_tools`` naps between its tool calls (a test stops the engine there).
NAP_S = 0.25


@workflow("tests.two_tools")
def two_tools():
    first = yield tool("sleep", seconds=0.01)
    yield Sleep(NAP_S)
    second = yield tool("sleep", seconds=0.01)
    return {"first": first, "second": second}
