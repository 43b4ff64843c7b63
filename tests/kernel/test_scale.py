"""Scale: 100,000 tasks, and what is left of them afterwards."""

from __future__ import annotations

import gc
import time
import weakref

from tiffany.kernel import GetTid, Instrument, ManualClock, NewTask, Scheduler, TaskState

N_TASKS = 100_000
BUDGET_S = 5.0


def tiny(i):
    yield
    return i


def test_100k_top_level_tasks() -> None:
    sched = Scheduler(clock=ManualClock())
    t0 = time.perf_counter()
    tids = [sched.spawn(tiny(i)) for i in range(N_TASKS)]
    sched.run()
    elapsed = time.perf_counter() - t0
    assert elapsed < BUDGET_S, f"{N_TASKS} tasks took {elapsed:.2f} s"
    assert sched.alive == 0
    assert sched.result(tids[0]) == 0
    assert sched.result(tids[-1]) == N_TASKS - 1
    assert sched.turns == 2 * N_TASKS
    # Finished non-daemon top-level tasks keep only their record, not their frames.
    assert all(sched.task(t).coro is None for t in tids[:100])
    sched.close()


def test_100k_child_tasks_from_a_parent() -> None:
    sched = Scheduler(clock=ManualClock())

    def parent():
        for i in range(N_TASKS):
            yield NewTask(tiny(i), daemon=True)
        return (yield GetTid())

    t0 = time.perf_counter()
    tid = sched.spawn(parent())
    sched.run()
    elapsed = time.perf_counter() - t0
    assert elapsed < BUDGET_S, f"{N_TASKS} children took {elapsed:.2f} s"
    assert sched.result(tid) == tid
    assert sched.alive == 0
    assert len(sched.tasks()) == 1  # the daemon children left no record
    sched.close()


def test_daemon_tasks_are_released() -> None:
    refs: list[weakref.ref] = []

    class Track(Instrument):
        def task_spawned(self, task):
            if task.daemon:
                refs.append(weakref.ref(task))

    n = 20_000
    sched = Scheduler(clock=ManualClock(), instruments=[Track()])

    def handler(i):
        data = bytearray(100)  # something held by the frame
        yield
        return len(data) + i

    def server():
        for i in range(n):
            yield NewTask(handler(i), daemon=True)
            if i % 100 == 0:
                yield

    for i in range(n):
        sched.spawn(handler(i), daemon=True)
    s = sched.spawn(server())
    sched.run()
    gc.collect()
    assert len(refs) == 2 * n
    alive = [r for r in refs if r() is not None]
    assert alive == []
    assert [t.id for t in sched.tasks()] == [s]
    sched.close()


def test_non_daemon_children_are_kept_until_the_parent_ends() -> None:
    sched = Scheduler(clock=ManualClock())
    seen = []

    def parent():
        kids = []
        for i in range(1000):
            kids.append((yield NewTask(tiny(i))))
        yield
        yield
        seen.append(sum(sched.task(k).state is TaskState.DONE for k in kids))

    tid = sched.spawn(parent())
    sched.run()
    assert seen == [1000]  # finished children stay joinable while the parent lives
    assert [t.id for t in sched.tasks()] == [tid]  # and are dropped once it ends
    sched.close()
