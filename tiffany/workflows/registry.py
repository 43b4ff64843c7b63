"""``@workflow("name")``: a user's generator function, registered as a durable run's entry.

A workflow is registered when the user's module is imported (``--import
MOD``, ``TIFFANY_TOOL_MODULES``: the mechanism ``@python_tool`` uses), by
name, in a process-wide table. Its keyword arguments are the run's inputs
(JSON values); its returned dict is the run's outputs.

What is refused, and when:

* at registration (:class:`WorkflowDefinitionError`, naming the function):
  a function that is not a generator function, a positional-only or
  ``*args`` parameter (inputs are given by name), a name that is not a
  workflow name or is the engine's (``tiffany.`` and ``plan``), a name
  already taken by another function;
* at submission (:func:`input_problems`, 422 items naming ``inputs.X``): a
  required input missing, an input the function does not take (unless it
  has ``**kwargs``). That inputs are JSON is checked where every
  submission's inputs are (``tiffany.wire.documents``).

A workflow declares a concurrency limit and a budget as a plan does, with
the plan's own models (``tiffany.wire.plan``: :class:`ConcurrencySpec`,
:class:`BudgetSpec`): ``@workflow("name", concurrency={"key":
"${inputs.user}", "limit": 2}, budget={"usd": 1.0})``, checked at
registration (the key may reference the function's parameters only). At
submission they go into the run's entry as a plan run's do, so the engine
admits and queues the run by the same slots, and the run's ``tool(...)``
calls share the plan's budget ledger (``runner.py``).
"""

from __future__ import annotations

import inspect
import re
import threading
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from tiffany.errors import TiffanyError
from tiffany.wire.documents import did_you_mean
from tiffany.wire.plan import BudgetSpec, ConcurrencySpec

__all__ = [
    "WORKFLOW_NAME_PATTERN",
    "UnknownWorkflow",
    "Workflow",
    "WorkflowDefinitionError",
    "builtin",
    "input_problems",
    "lookup",
    "names",
    "register",
    "unregister",
    "workflow",
]

F = TypeVar("F", bound=Callable[..., Any])

#: What a workflow's name may be (it is a run's name, and an entry's field).
WORKFLOW_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_.\-]{0,99}$"
_NAME = re.compile(WORKFLOW_NAME_PATTERN)
#: Names the engine keeps for itself.
_RESERVED_NAMES: Final = frozenset({"plan", "callable", "workflow"})
_RESERVED_PREFIX: Final = "tiffany."

_WORKFLOWS: dict[str, Workflow] = {}
#: The engine's own workflows (``plan``: ``runner.py``), under reserved names.
_BUILTIN: dict[str, Workflow] = {}
_LOCK = threading.Lock()


class WorkflowDefinitionError(TiffanyError):
    """A function cannot be a workflow (refused at registration, naming it)."""

    code = "workflow.definition"


class UnknownWorkflow(TiffanyError):
    """No workflow is registered under the name (the message lists those that are)."""

    code = "workflow.unknown"


@dataclass(frozen=True, slots=True)
class Workflow:
    """A registered workflow: its name, its function and what inputs it takes."""

    name: str
    fn: Callable[..., Any]
    #: Its keyword parameters, in order.
    params: tuple[str, ...]
    #: The parameters with no default (a submission must give them).
    required: tuple[str, ...]
    #: It has ``**kwargs``: any input name is taken.
    open: bool
    #: At most ``limit`` runs of a key at once (a plan's ``concurrency``), or None.
    concurrency: ConcurrencySpec | None = None
    #: The most model tokens and dollars a run's tool calls may use (a plan's ``budget``).
    budget: BudgetSpec | None = None
    #: The parameters' defaults (a concurrency key's references read them).
    defaults: Mapping[str, Any] | None = None
    #: The annotated parameters' checks (pydantic, strict): a submission's
    #: value of another type is refused naming the input.
    checks: Mapping[str, Any] = field(default_factory=dict)
    #: A built-in workflow's root, built from its run's whole entry
    #: (``root(env, run_id, entry, compat)``: the planner, for ``plan``);
    #: None for a user's, whose ``fn`` is called with the inputs.
    root: Callable[..., Any] | None = None

    @property
    def where(self) -> str:
        """``module:qualname`` of the function (errors name it)."""
        return f"{self.fn.__module__}:{self.fn.__qualname__}"


def _where(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _spec(
    name: str, where: str, field: str, model: type[BaseModel], given: Any
) -> BaseModel | None:
    """``given`` (a mapping, or the model itself) as ``model``; refused naming ``field``."""
    if given is None or isinstance(given, model):
        return given
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join([field, *(str(p) for p in first["loc"])])
        raise WorkflowDefinitionError(
            f"workflow {name!r} ({where}): {loc}: {first['msg']}", function=where, field=loc
        ) from None


def register(
    name: str, fn: Callable[..., Any], *, concurrency: Any = None, budget: Any = None
) -> Workflow:
    """Register generator function ``fn`` as workflow ``name``; return it.

    ``concurrency`` and ``budget``: as a plan's (module docstring).

    Raises:
        WorkflowDefinitionError: ``fn`` or ``name`` cannot be a workflow
            (the message names the function and what is wrong).
    """
    where = _where(fn)
    if not isinstance(name, str) or not _NAME.match(name):
        raise WorkflowDefinitionError(
            f"workflow {name!r} ({where}): a workflow's name must match {WORKFLOW_NAME_PATTERN}",
            function=where,
        )
    if name in _BUILTIN:
        raise WorkflowDefinitionError(
            f"workflow {name!r} ({where}): {name!r} is the engine's built-in workflow (the "
            "planner, which runs plan documents); name yours otherwise",
            function=where,
        )
    if name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIX):
        raise WorkflowDefinitionError(
            f"workflow {name!r} ({where}): the name is the engine's (plan, callable, "
            f"workflow and names starting with {_RESERVED_PREFIX!r} are reserved)",
            function=where,
        )
    if not inspect.isgeneratorfunction(fn):
        raise WorkflowDefinitionError(
            f"workflow {name!r}: {where} is not a generator function; a workflow yields "
            "system calls (Step, Sleep, NewTask, tool(...)) and returns a dict",
            function=where,
        )
    sig = inspect.signature(fn)
    params, required, var_kw = [], [], False
    for p in sig.parameters.values():
        if p.kind is p.POSITIONAL_ONLY:
            raise WorkflowDefinitionError(
                f"workflow {name!r}: parameter {p.name!r} of {where} is positional-only; "
                "a workflow's inputs are keyword arguments",
                function=where,
                parameter=p.name,
            )
        if p.kind is p.VAR_POSITIONAL:
            raise WorkflowDefinitionError(
                f"workflow {name!r}: {where} takes *{p.name}; a workflow's inputs are "
                "keyword arguments",
                function=where,
                parameter=p.name,
            )
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
            continue
        params.append(p.name)
        if p.default is p.empty:
            required.append(p.name)
    limit = _spec(name, where, "concurrency", ConcurrencySpec, concurrency)
    if isinstance(limit, ConcurrencySpec):
        from tiffany.agents.refs import RefError, find_refs

        try:
            refs = find_refs(limit.key)
        except RefError as exc:
            raise WorkflowDefinitionError(
                f"workflow {name!r} ({where}): concurrency.key: {exc.message}",
                function=where,
                field="concurrency.key",
            ) from None
        for ref in refs:
            if ref.scope != "inputs" or (ref.name not in params and not var_kw):
                raise WorkflowDefinitionError(
                    f"workflow {name!r} ({where}): concurrency.key may reference the "
                    f"function's parameters only (${{inputs.NAME}}), not ${{{ref.text}}}",
                    function=where,
                    field="concurrency.key",
                )
    spend = _spec(name, where, "budget", BudgetSpec, budget)
    defaults = {
        p.name: p.default
        for p in sig.parameters.values()
        if p.default is not p.empty and p.kind is not p.VAR_KEYWORD
    }
    wf = Workflow(
        name,
        fn,
        tuple(params),
        tuple(required),
        var_kw,
        limit,  # type: ignore[arg-type]
        spend,  # type: ignore[arg-type]
        defaults,
        _checks(fn, params),
    )
    with _LOCK:
        old = _WORKFLOWS.get(name)
        # The same function again (its module imported a second time) replaces it.
        if old is not None and _where(old.fn) != where:
            raise WorkflowDefinitionError(
                f"workflow {name!r} ({where}) is registered already, by {old.where}",
                function=where,
            )
        _WORKFLOWS[name] = wf
    return wf


def _checks(fn: Callable[..., Any], params: list[str]) -> dict[str, Any]:
    """A strict pydantic check for each parameter with a usable annotation.

    An annotation that does not resolve (a name only a type checker sees)
    or that pydantic cannot check is no check: the parameter takes any JSON
    value, as an unannotated one does.
    """
    from pydantic import TypeAdapter

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: nothing to check by
        return {}
    checks: dict[str, Any] = {}
    for param in params:
        hint = hints.get(param)
        if hint is None or hint is Any:
            continue
        try:
            checks[param] = TypeAdapter(hint)
        except Exception:  # noqa: BLE001 - a type pydantic cannot check: not checked
            continue
    return checks


def unregister(name: str) -> None:
    """Forget workflow ``name`` (no error if there is none): for tests."""
    with _LOCK:
        _WORKFLOWS.pop(name, None)


def workflow(name: str, *, concurrency: Any = None, budget: Any = None) -> Callable[[F], F]:
    """Decorator: register the decorated generator function as workflow ``name``.

    Returns the function unchanged (a test may call it and drive it).
    ``concurrency`` (``{"key": ..., "limit": N}``) and ``budget``
    (``{"tokens": N, "usd": X}``): a plan's, with the same meaning.

    Raises:
        WorkflowDefinitionError: At decoration, naming the function.
    """
    if callable(name):
        raise WorkflowDefinitionError(
            f'@workflow needs a name: @workflow("...") above {_where(name)}',
            function=_where(name),
        )

    def decorate(fn: F) -> F:
        register(name, fn, concurrency=concurrency, budget=budget)
        return fn

    return decorate


def builtin(wf: Workflow) -> Workflow:
    """Install the engine's own workflow ``wf`` (a reserved name; ``wf.root`` builds its root)."""
    if wf.name not in _RESERVED_NAMES or wf.root is None:
        raise WorkflowDefinitionError(
            f"a built-in workflow has a reserved name and a root: {wf.name!r}", function=wf.where
        )
    _BUILTIN[wf.name] = wf
    return wf


def names() -> list[str]:
    """The users' registered workflows' names, sorted (the built-in ``plan`` is not listed)."""
    return sorted(_WORKFLOWS)


def lookup(name: str) -> Workflow:
    """Return workflow ``name``: a built-in one (``plan``) or a user's.

    Raises:
        UnknownWorkflow: None is registered under it (the message says how
            a module registers its workflows, and lists the names).
    """
    wf = _BUILTIN.get(name) or _WORKFLOWS.get(name)
    if wf is None:
        raise UnknownWorkflow(unknown_message(name), workflow=name)
    return wf


def unknown_message(name: Any) -> str:
    """Why ``name`` is no workflow here: the registered names, and how a module adds one."""
    known = names()
    hint = did_you_mean(str(name), known) if isinstance(name, str) else ""
    return (
        f"unknown workflow {name!r}{hint}; registered workflows: "
        f"{', '.join(known) or 'none'} (the server registers a workflow by importing its "
        "module: --import MOD or TIFFANY_TOOL_MODULES)"
    )


def input_problems(wf: Workflow, inputs: Mapping[str, Any]) -> list[dict[str, str]]:
    """The 422 items of ``inputs`` that ``wf``'s signature refuses (empty: none)."""
    problems = []
    if not wf.open:
        for key in inputs:
            if key not in wf.params:
                msg = (
                    f"workflow {wf.name!r} ({wf.where}) takes no input {key!r}"
                    f"{did_you_mean(str(key), wf.params)} (inputs: "
                    f"{', '.join(wf.params) or 'none'})"
                )
                problems.append({"loc": f"inputs.{key}", "msg": msg})
    for key in wf.required:
        if key not in inputs:
            msg = f"missing required input {key!r} of workflow {wf.name!r} ({wf.where})"
            problems.append({"loc": f"inputs.{key}", "msg": msg})
    for key, value in inputs.items():
        check = wf.checks.get(key)
        if check is None:
            continue
        try:
            check.validate_python(value, strict=True)
        except ValidationError as exc:
            why = exc.errors()[0]["msg"] if exc.errors() else str(exc)
            msg = f"input {key!r} of workflow {wf.name!r} ({wf.where}): {why}, got {value!r:.80}"
            problems.append({"loc": f"inputs.{key}", "msg": msg})
    return problems
