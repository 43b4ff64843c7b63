"""Workloads for the durable-execution tests (importable by name: replay re-imports them).

Every root function here is a generator function taking JSON-able arguments,
because a run is re-created from its first journal record.
"""

from __future__ import annotations

import os
from pathlib import Path

from tiffany.durable import Step
from tiffany.errors import TaskCancelled, WaitTimeout
from tiffany.kernel import (
    KillTask,
    NewTask,
    Now,
    Queue,
    Random,
    Receive,
    RunInThread,
    Sleep,
    WaitTask,
)

CALLS: list[object] = []


def record_call(i: int) -> int:
    CALLS.append(i)
    return i * 10


def append_line(path: str, text: str) -> str:
    """The side effect of the crash tests: one line per completed step."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    return text


def _worker(i: int, q: Queue) -> object:
    yield Sleep(0.001 * (i % 3))
    r = yield Step(record_call, i)
    yield Now()
    yield Random()
    q.put((i, r))
    return r


def fan_in(n: int) -> object:
    """N workers, a queue, joins, sleeps, steps, Now and Random."""
    q: Queue = Queue()
    tids = []
    for i in range(n):
        tids.append((yield NewTask(_worker(i, q), name=f"worker-{i}")))
    got = []
    for _ in range(n):
        got.append((yield q.get()))
    total = 0
    for t in tids:
        total += yield WaitTask(t)
    return [total, got]


def _appender(path: str, worker: int, steps: int, q: Queue) -> object:
    for s in range(steps):
        text = yield Step(append_line, path, f"w{worker}-s{s}")
        q.put(text)
        if s % 2:
            yield
        else:
            yield Sleep(0.0005)
    return worker


def appenders(path: str, workers: int, steps: int) -> object:
    """Workers appending lines through steps; the crash tests' run."""
    q: Queue = Queue()
    tids = []
    for w in range(workers):
        tids.append((yield NewTask(_appender(path, w, steps, q), name=f"appender-{w}")))
    order = []
    for _ in range(workers * steps):
        order.append((yield q.get()))
    for t in tids:
        yield WaitTask(t)
    return sorted(order)  # thread completion order is external: compare as a set


#: The WAL the ``wide`` workload's steps check (set by the test).
WATCH: dict[str, object] = {}


def checked_step(i: int) -> int:
    """A step that records whether every STEP_START appended so far was durable."""
    wal = WATCH.get("wal")
    if wal is not None:
        CALLS.append((i, WATCH["last_start"] <= wal.durable_seq))  # type: ignore[attr-defined, operator]
    return i


def _wide_child(i: int, inline: bool) -> object:
    return (yield Step(checked_step, i, inline=inline))


def wide(n: int, inline: bool) -> object:
    """N tasks, one step each, all started before any can finish (a plan's fan-out)."""
    tids = []
    for i in range(n):
        tids.append((yield NewTask(_wide_child(i, inline), name=f"child-{i}")))
    total = 0
    for t in tids:
        total += yield WaitTask(t)
    return total


def checked_generator_step(i: int) -> object:
    """A generator step: records, when its body starts, whether its STEP_START was durable."""
    checked_step(i)
    yield
    return i


def _busy(n: int) -> object:
    for _ in range(n):
        yield
    return 0


def generator_step_among_busy_tasks(n: int) -> object:
    """Generator steps started while other tasks stay ready (the commit cannot wait)."""
    tids = [(yield NewTask(_busy(50), name="busy"))]
    for i in range(n):
        tids.append((yield NewTask(_gen_child(i), name=f"gen-{i}")))
    total = 0
    for t in tids:
        total += yield WaitTask(t)
    return total


def _gen_child(i: int) -> object:
    yield
    return (yield Step(checked_generator_step, i))


def _count(path: str) -> object:
    """A generator step: waits on a subprocess's pipe through ReadWait."""
    from tiffany.io import spawn_process

    proc = spawn_process(["wc", "-c", path], stdin=False)
    out = yield proc.communicate()
    return int(out.stdout.split()[0])


def generator_steps(path: str) -> object:
    """Steps that run as kernel tasks (subprocess I/O inside a step)."""
    Path(path).write_text("hello\n")
    first = yield Step(_count, path, name="count")
    second = yield RunInThread(len, "abc")
    return [first, second]


def _sleeper(seconds: float) -> object:
    try:
        yield Sleep(seconds)
        return "slept"
    except TaskCancelled:
        CALLS.append(("cancelled", "sleeper"))
        raise


def cancellable(seconds: float) -> object:
    """A run that sleeps long; cancelling it kills both tasks (their handlers run)."""
    tid = yield NewTask(_sleeper(seconds))
    try:
        return (yield WaitTask(tid))
    except TaskCancelled:
        CALLS.append(("cancelled", "root"))
        raise


def killer() -> object:
    """Internal kills and crashes are reproduced by replay, not journaled as external."""

    def victim() -> object:
        while True:
            yield Sleep(10)

    def crasher() -> object:
        yield
        raise ValueError("boom")

    v = yield NewTask(victim())
    c = yield NewTask(crasher())
    yield Sleep(0.001)
    yield KillTask(v)
    outcomes = []
    for t in (v, c):
        try:
            yield WaitTask(t)
            outcomes.append("ok")
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    return outcomes


MODE = {"value": os.environ.get("TIFFANY_GOLDEN_MODE", "a")}


def moody(n: int) -> object:
    """Deliberately nondeterministic: its path depends on a module global."""
    total = 0
    for i in range(n):
        if MODE["value"] == "a":
            yield Sleep(0.001)
        else:
            yield
        total += i
    return total


def _answer() -> object:
    yield
    return 1 if MODE["value"] == "a" else 2


def changed_result() -> object:
    """Its child's result (so its own) depends on a module global: replay diverges at an exit."""
    child = yield NewTask(_answer())
    return (yield WaitTask(child))


def approvals() -> object:
    """Signals: one waited for, one sent before its wait (kept), a timeout, two of a name."""
    got = [(yield Receive("a"))]
    got.append((yield Receive("b")))
    try:
        yield Receive("c", timeout=0.05)
    except WaitTimeout:
        got.append("timeout")
    got.append((yield Receive("d")))
    got.append((yield Receive("d")))
    return got


def wait_for_go() -> object:
    """One signal ``go``, waited for with no timeout: the run's only wait."""
    return (yield Receive("go"))


def wait_for_child() -> object:
    """One of the engine's own signals (a sub-plan's end), waited for as plan.run does."""
    return (yield Receive("child:kid"))


#: Set by ``release_blocked``: lets ``blocks_until_released`` return.
RELEASED = {"event": None}


def blocks_until_released() -> str:
    """A step that holds its thread until another step of the same run releases it."""
    event = RELEASED["event"]
    assert event is not None
    assert event.wait(60), "the loop did not run while the step blocked"  # type: ignore[attr-defined]
    return "released"


def release_blocked(ticks: int) -> int:
    RELEASED["event"].set()  # type: ignore[attr-defined]
    return ticks


def _releaser() -> object:
    ticks = 0
    for _ in range(5):
        yield Sleep(0.005)
        ticks += 1
    return (yield Step(release_blocked, ticks))


def blocked_step_beside_timers() -> object:
    """A lone step that blocks (helped, then taken over: kernel/sysmon.py) while a child runs.

    The child sleeps when the step starts, so the step is alone (helped),
    and the loop must run on another thread for the child to release it.
    """
    helper = yield NewTask(_late(_releaser()), name="releaser")
    yield Sleep(0.01)  # the child is asleep (in _late): the step is then the only thing to do
    got = yield Step(blocks_until_released)
    ticks = yield WaitTask(helper)
    return [got, ticks]


def _late(gen: object) -> object:
    yield Sleep(0.05)
    return (yield gen)
