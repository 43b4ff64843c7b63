"""The tool registry: which tools exist, and which this server may run.

``ToolRegistry.default()`` holds every built-in tool (``shell``, ``http``,
``python``, ``llm``, ``file.read``, ``file.write``, ``sleep``, ``signal.wait``,
``plan.run``, ``agent``, the ``memory.*`` tools) and loads the
``tiffany.tools`` entry points (callables for the ``python`` tool). A
server runs only the tools its operator enabled: :data:`DEFAULT_ENABLED` is
every built-in but ``shell``; ``tiffany run`` enables them all
(``enabled=registry.all_names()``).

``names()`` is what plans are validated against (the *enabled* tools), so a
plan that uses a disabled tool is refused before it runs, with the fix
(``--enable-tool NAME``: :func:`~tiffany.agents.plan.disabled_message`), never
as an unknown tool; ``get`` of a disabled tool raises :class:`ToolDisabled`.
``describe()`` is what ``GET /api/tools`` and ``tiffany tools`` list.

A run accepted earlier (or by an engine set differently) may still reach a
tool that is disabled here. Its code must not notice (enablement is not
part of the run's history: a replay would diverge), so the worker and the
planner use ``lookup`` and ``all_names`` (every registered tool), and the
engine holds the step where its effect would start: :meth:`step_gate` is
the durable journal's ``step_gate`` (``tiffany/durable/gate.py``). It knows
a step's tool by the step's name: a tool's step is named after the tool
(``shell``) or ``TOOL:DETAIL`` (``python:pkg.mod.fn``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tiffany.agents.plan import did_you_mean, disabled_message, unknown_tool_message
from tiffany.agents.tools import BUILTIN_TOOLS
from tiffany.agents.tools.base import Tool, ToolError
from tiffany.agents.tools.python import functions, is_registered, load_entry_points
from tiffany.agents.tools.schema import describe
from tiffany.wire.records import function_missing_reason, tool_disabled_reason

__all__ = ["DEFAULT_ENABLED", "ToolDisabled", "ToolRegistry", "UnknownTool"]

#: Tools a server runs unless its operator says otherwise (``shell`` is opt-in).
DEFAULT_ENABLED: frozenset[str] = frozenset(
    {
        "agent",
        "file.read",
        "file.write",
        "http",
        "llm",
        "memory.delete",
        "memory.get",
        "memory.link",
        "memory.neighbors",
        "memory.put",
        "memory.search",
        "plan.run",
        "python",
        "signal.wait",
        "sleep",
    }
)


class UnknownTool(ToolError):
    """No tool of that name is registered."""

    code = "tool.unknown"


class ToolDisabled(ToolError):
    """The tool exists but this server's operator has not enabled it."""

    code = "tool.disabled"


class ToolRegistry:
    """Tools by name, and the set of enabled names.

    Args:
        tools: The tools to register.
        enabled: Names allowed to run (default: every registered tool). Each
            must be registered: a typo in an operator's list is an error.

    Raises:
        UnknownTool: ``enabled`` names a tool that is not registered.
    """

    def __init__(self, tools: Iterable[Tool] | None = None, enabled: Iterable[str] | None = None):
        self._tools: dict[str, Tool] = {}
        for tool in tools or ():
            self.register(tool)
        self.enabled: set[str] = set(self._tools)
        if enabled is not None:
            self.enable(enabled, only=True)

    @classmethod
    def default(cls, enabled: Iterable[str] | None = None) -> ToolRegistry:
        """Return a registry of the built-in tools (entry points loaded).

        Args:
            enabled: The enabled names (default: :data:`DEFAULT_ENABLED`).
        """
        load_entry_points()
        return cls(
            [tool_cls() for tool_cls in BUILTIN_TOOLS],
            DEFAULT_ENABLED if enabled is None else enabled,
        )

    def register(self, tool: Tool, *, enable: bool = False) -> None:
        """Add ``tool`` (replacing one of the same name); ``enable`` it at once if asked."""
        self._tools[tool.name] = tool
        if enable:
            self.enabled.add(tool.name)

    def enable(self, names: Iterable[str], *, only: bool = False) -> None:
        """Enable ``names`` (and, with ``only``, disable every other tool).

        Raises:
            UnknownTool: A name is not registered.
        """
        names = set(names)
        unknown = sorted(names - self._tools.keys())
        if unknown:
            hints = "".join(did_you_mean(name, self._tools) for name in unknown)
            raise UnknownTool(
                f"cannot enable unknown tools {unknown}{hints}; known tools: {self.all_names()}",
                tools=", ".join(unknown),
            )
        self.enabled = names if only else self.enabled | names

    def get(self, name: str) -> Tool:
        """Return the enabled tool ``name``.

        Raises:
            UnknownTool: No such tool (the message lists the known ones).
            ToolDisabled: It exists but is not enabled here.
        """
        tool = self._tools.get(name)
        if tool is None:
            raise UnknownTool(unknown_tool_message(name, self.all_names()), tool=name)
        if name not in self.enabled:
            raise ToolDisabled(disabled_message(name), tool=name)
        return tool

    def lookup(self, name: str) -> Tool:
        """Return the tool ``name``, enabled or not (the engine gates its steps).

        Raises:
            UnknownTool: No such tool (the message lists the known ones).
        """
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self.all_names()) or "none"
            raise UnknownTool(f"unknown tool {name!r}; known tools: {known}", tool=name)
        return tool

    def tool_of_step(self, step_name: str | None) -> str | None:
        """Return the registered tool a step named ``step_name`` belongs to, or None.

        A tool's step is named ``TOOL`` or ``TOOL:DETAIL`` (see the module docstring).
        """
        if not step_name:
            return None
        head = step_name.partition(":")[0]
        return head if head in self._tools else None

    def step_gate(self, task: object, call: object) -> str | None:
        """The journal's step gate: why a step must wait here (its tool is disabled), or None."""
        step_name = getattr(call, "name", None)
        tool = self.tool_of_step(step_name)
        if tool is None:
            return None
        if tool not in self.enabled:
            return tool_disabled_reason(tool)
        if tool == "python" and isinstance(step_name, str):
            function = step_name.partition(":")[2]
            if function and not is_registered(function):
                return function_missing_reason(function)
        return None

    def is_enabled(self, name: str) -> bool:
        """Return True if ``name`` is registered and enabled."""
        return name in self.enabled and name in self._tools

    def names(self) -> list[str]:
        """Return the enabled tool names, sorted (what plans are validated against)."""
        return sorted(n for n in self._tools if n in self.enabled)

    def all_names(self) -> list[str]:
        """Return every registered tool name, sorted, enabled or not."""
        return sorted(self._tools)

    def disabled_names(self) -> list[str]:
        """Return the registered tools this server does not run, sorted."""
        return sorted(n for n in self._tools if n not in self.enabled)

    def describe(self) -> dict[str, Any]:
        """Return what ``GET /api/tools`` shows: the enabled tools and the disabled names.

        ``{"tools": [{"name", "description", "durable", "args", "output"}...],
        "disabled": [names], "python_functions": [names]}``, in listing order
        (built-ins first, as ``BUILTIN_TOOLS`` has them, then others by name).
        """
        order = {str(getattr(cls, "name", "")): i for i, cls in enumerate(BUILTIN_TOOLS)}
        names = sorted(self.names(), key=lambda n: (order.get(n, len(order)), n))
        return {
            "tools": [describe(self._tools[n]) for n in names],
            "disabled": self.disabled_names(),
            "python_functions": functions() if "python" in self.enabled else [],
        }

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)
