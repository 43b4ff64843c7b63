"""The layers above the kernel reach it through its public ports only.

What a journal may hold or decide (hold effects, look a task up, throw into a
task, arm a timer, join a task) is a method of ``Scheduler``; a task's state
is read through public attributes. This test parses every module outside
``tiffany.kernel`` and fails on an access to one of the kernel's private
attributes (``sched._tasks``, ``task._throw``...) on anything but ``self``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tiffany.kernel import Scheduler, Task

PACKAGE = Path(__file__).resolve().parents[2] / "tiffany"


def _kernel_privates() -> set[str]:
    with Scheduler() as sched:
        names = {n for n in vars(sched) if n.startswith("_") and not n.startswith("__")}
    names |= {n for n in Task.__slots__ if n.startswith("_") and not n.startswith("__")}
    return names


def _reach_ins(path: Path, private: set[str]) -> list[str]:
    """Return ``file:line: .attr`` for each private kernel attribute read off a non-self name."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted(
        f"{path.name}:{node.lineno}: .{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in private
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    )


def test_the_private_set_is_the_kernels() -> None:
    private = _kernel_privates()
    assert {"_tasks", "_ready", "_throw", "_send", "_effects_held", "_reactor"} <= private


def test_no_layer_above_the_kernel_touches_its_privates() -> None:
    private = _kernel_privates()
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "kernel"
        for hit in _reach_ins(path, private)
    ]
    assert found == []


def test_the_check_finds_a_reach_in(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f(sched, task):\n    sched._tasks.get(1)\n    return task._throw\n")
    assert _reach_ins(probe, _kernel_privates()) == ["probe.py:2: ._tasks", "probe.py:3: ._throw"]
