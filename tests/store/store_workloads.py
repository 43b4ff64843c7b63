"""Workloads for the store tests (importable by name: a run's entry names its root)."""

from __future__ import annotations

from tiffany.errors import TaskCrashed
from tiffany.kernel import NewTask, Sleep, WaitTask


def child(i: int) -> object:
    """Sleep a little, return twice ``i``."""
    yield Sleep(0.001 * (i + 1))
    return i * 2


def crasher() -> object:
    """Crash after a short sleep."""
    yield Sleep(0.001)
    raise ValueError("boom")


def family(n: int) -> object:
    """Spawn ``n`` children and a crashing one, sleep, join them all."""
    tids = []
    for i in range(n):
        tids.append((yield NewTask(child(i), name=f"child-{i}")))
    bad = yield NewTask(crasher(), name="crasher")
    yield Sleep(0.002)
    total = 0
    for tid in tids:
        total += yield WaitTask(tid)
    try:
        yield WaitTask(bad)
    except TaskCrashed:
        total += 1000
    return {"total": total}


def failing() -> object:
    """A root that fails after one sleep."""
    yield Sleep(0.001)
    raise RuntimeError("root failed", 42)


def sleeper(seconds: float) -> object:
    """Sleep long (the tests cancel it)."""
    yield Sleep(seconds)
    return "woke"
