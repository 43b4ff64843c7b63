"""Users' durable code: ``@workflow`` generator functions, and the calls they yield.

Public API::

    from tiffany.workflows import workflow, tool, signal, child, patched, memory

``@workflow("name")`` registers a generator function (``registry.py``); its
keyword arguments are a run's inputs and its returned dict the run's
outputs. Inside it, the kernel's system calls (``Step``, ``Sleep``,
``NewTask``, ``WaitTask``, ``KillTask``, ``Now``, ``Random``, ``GetTid``,
nested generators), the run-level calls of ``calls.py``, and memory's
(``memory.put(...)``, ``memory.search(...)``: ``memory.py``). The engine
runs, resumes and replays workflow runs through :func:`workflow_resolver`
(``runner.py``), the resolver of ``workflow`` entries and of ``plan``
entries: a plan run is the built-in workflow ``plan``, whose root is the planner.
"""

from __future__ import annotations

from tiffany.workflows import memory
from tiffany.workflows.calls import (
    ChildFailed,
    SignalPayloadInvalid,
    ToolFailed,
    WorkflowCallError,
    WorkflowContext,
    child,
    patched,
    signal,
    tool,
)
from tiffany.workflows.registry import (
    UnknownWorkflow,
    Workflow,
    WorkflowDefinitionError,
    input_problems,
    lookup,
    names,
    register,
    unregister,
    workflow,
)
from tiffany.workflows.runner import (
    WorkflowInputError,
    WorkflowResultError,
    prepare_workflow,
    run_workflow,
    workflow_entry,
    workflow_resolver,
)

__all__ = [
    "ChildFailed",
    "SignalPayloadInvalid",
    "ToolFailed",
    "UnknownWorkflow",
    "Workflow",
    "WorkflowCallError",
    "WorkflowContext",
    "WorkflowDefinitionError",
    "WorkflowInputError",
    "WorkflowResultError",
    "child",
    "input_problems",
    "lookup",
    "memory",
    "names",
    "patched",
    "prepare_workflow",
    "register",
    "run_workflow",
    "signal",
    "tool",
    "unregister",
    "workflow",
    "workflow_entry",
    "workflow_resolver",
]
