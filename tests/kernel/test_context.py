"""``current_task()``, the inherited ``Task.context``, and ``Patched`` without a journal."""

from __future__ import annotations

from typing import Any

from tiffany.kernel import NewTask, Patched, Scheduler, Step, WaitTask, current_task


def test_current_task_is_the_dispatched_task_and_none_outside() -> None:
    seen: list[Any] = []

    def child():
        seen.append(("child", current_task().id, current_task().context))
        yield

    def root():
        me = current_task()
        me.context = "ctx"
        seen.append(("root", me.id, me.context))
        tid = yield NewTask(child())
        yield WaitTask(tid)
        seen.append(("after", current_task().id, None))

    assert current_task() is None
    with Scheduler() as sched:
        root_id = sched.spawn(root())
        sched.run()
        assert current_task() is None
    assert seen[0] == ("root", root_id, "ctx")
    assert seen[1][0] == "child"
    assert seen[1][1] != root_id
    assert seen[1][2] == "ctx"  # inherited at spawn
    assert seen[2] == ("after", root_id, None)


def test_a_thread_steps_function_sees_no_current_task() -> None:
    def look() -> Any:
        return current_task()

    def root():
        return (yield Step(look))

    with Scheduler() as sched:
        tid = sched.spawn(root())
        sched.run()
        assert sched.result(tid) is None


def test_patched_is_true_without_a_journal() -> None:
    def root():
        return (yield Patched("fix-1"))

    with Scheduler() as sched:
        tid = sched.spawn(root())
        sched.run()
        assert sched.result(tid) is True


def test_a_generator_steps_body_does_not_inherit_the_context() -> None:
    def body():
        yield
        return current_task().context

    def root():
        current_task().context = "ctx"
        return (yield Step(body))

    with Scheduler() as sched:
        tid = sched.spawn(root())
        sched.run()
        assert sched.result(tid) is None
