"""The built-in tools a plan step can call (see ``base.py`` for the contract).

* ``shell`` (:class:`ShellTool`): a kernel task; a subprocess, under bubblewrap when available.
* ``http`` (:class:`HttpTool`): in a thread (urllib).
* ``python`` (:class:`PythonTool`): a kernel task; plain callables go to a thread.
* ``llm`` (:class:`LlmTool`): in a thread; OpenAI-compatible endpoint or scripted.
* ``file.read`` / ``file.write`` (:class:`FileReadTool`, :class:`FileWriteTool`):
  in a thread, confined to the run's workspace.
* ``sleep`` (:class:`SleepTool`): in the worker task itself (a durable timer).
* ``signal.wait`` (:class:`SignalWaitTool`): in the worker task itself (a journaled
  wait for a signal sent to the run).
* ``agent`` (:class:`AgentTool`): in the worker task itself (a model calling tools in
  a loop; each call a child task with a durable step).
* ``plan.run`` (:class:`PlanRunTool`): in the worker task itself (a child run of
  another plan; its end comes back as a signal).
* ``memory.put`` / ``memory.get`` / ``memory.search`` / ``memory.link`` /
  ``memory.neighbors`` / ``memory.delete`` (``memory.py``): in a thread, on the
  engine's MemoryStore; reads journaled with their answer, writes exactly once.

:class:`~tiffany.agents.registry.ToolRegistry` holds them by name; each declares
its ``Args`` and ``Output`` models (``schema.py`` turns them into JSON Schemas).
"""

from __future__ import annotations

from tiffany.agents.tools.agent import AgentTool
from tiffany.agents.tools.base import (
    FreeFormOutput,
    Tool,
    ToolArgs,
    ToolContext,
    ToolError,
    ToolOutput,
    ToolSettings,
)
from tiffany.agents.tools.file import FileReadTool, FileWriteTool
from tiffany.agents.tools.http import HttpTool
from tiffany.agents.tools.llm import LlmTool
from tiffany.agents.tools.memory import (
    MemoryDeleteTool,
    MemoryGetTool,
    MemoryLinkTool,
    MemoryNeighborsTool,
    MemoryPutTool,
    MemorySearchTool,
)
from tiffany.agents.tools.python import PythonTool, python_tool
from tiffany.agents.tools.shell import ShellTool
from tiffany.agents.tools.signal import SignalWaitTool
from tiffany.agents.tools.sleep import SleepTool
from tiffany.agents.tools.subplan import PlanRunTool

__all__ = [
    "BUILTIN_TOOLS",
    "AgentTool",
    "FileReadTool",
    "FileWriteTool",
    "FreeFormOutput",
    "HttpTool",
    "LlmTool",
    "MemoryDeleteTool",
    "MemoryGetTool",
    "MemoryLinkTool",
    "MemoryNeighborsTool",
    "MemoryPutTool",
    "MemorySearchTool",
    "PlanRunTool",
    "PythonTool",
    "ShellTool",
    "SignalWaitTool",
    "SleepTool",
    "Tool",
    "ToolArgs",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolSettings",
    "python_tool",
]

#: Every built-in tool class, in the order listings show them.
BUILTIN_TOOLS: tuple[type, ...] = (
    ShellTool,
    HttpTool,
    PythonTool,
    LlmTool,
    FileReadTool,
    FileWriteTool,
    SleepTool,
    SignalWaitTool,
    PlanRunTool,
    AgentTool,
    MemoryPutTool,
    MemoryGetTool,
    MemorySearchTool,
    MemoryLinkTool,
    MemoryNeighborsTool,
    MemoryDeleteTool,
)
