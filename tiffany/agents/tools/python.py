"""``python``: run a registered Python callable by name.

A plan cannot run arbitrary code: it names a function that the operator's
code registered, either with the decorator::

    from tiffany.agents.tools.python import python_tool

    @python_tool("word_count")
    def word_count(text: str) -> dict:
        return {"words": len(text.split())}

or through the ``tiffany.tools`` entry-point group of an installed
distribution (``word_count = "mypkg.tools:word_count"``: the entry point's
name is the function's name).

A quick function that never blocks (sub-millisecond, no I/O) may be
registered with ``inline=True`` (``@python_tool("inc", inline=True)``): its
step is then called on the scheduler's thread at the commit point, right
after its STEP_START is durable, instead of being handed to the thread pool
(``Step(inline=True)``, Temporal's "local activity"). It is journaled and
replayed exactly like any step; it saves the thread hand-off, which costs
more than a trivial function itself, and it holds the loop while it runs:
keep it trivial.

Design: ``PythonTool.run`` is a generator function, so the worker always
runs it as a kernel task inside a durable ``Step``. A *plain* callable is
then handed to the thread pool with ``yield RunInThread(...)`` (blocking
code is fine there); a *generator* callable is trampolined with ``yield
fn(**kwargs)`` and may wait on descriptors through ``tiffany.io``. Rejected:
a plain ``run`` that calls the function (a generator callable would then
come back unrun), and choosing per call (the worker picks thread or task
from ``run`` itself, once).

An exception other than :class:`ToolError` raised by the function becomes a
``tool.python.error`` ToolError naming its type, so the plan sees a stable
code and the journal a rebuildable error. Either carries the frames of the
user's code it went through (``traceback``: ``tiffany/agents/tracebacks.py``),
taken where it was caught, in the thread that ran the function, and bounded
by the operator's ``TIFFANY_TRACEBACK_*`` settings (``ToolSettings.traceback``).

A plan's ``python`` steps are checked where the plan enters (a submission,
``tiffany run``, ``tiffany plan validate``: :func:`check_python_steps`):
the function must be registered, and the names of its ``kwargs`` must fit
its signature (an unknown keyword, with a did-you-mean, or a missing
required one is refused naming ``steps[i].args.kwargs.NAME``), instead of
the step failing with a ``TypeError`` when it runs. Only names are
checked: a value may hold a ``${...}`` reference, known when the step runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any, ClassVar, TypeVar, overload

from pydantic import Field

from tiffany.agents.tools.base import (
    FreeFormOutput,
    ToolArgs,
    ToolContext,
    ToolError,
    ToolSettings,
)
from tiffany.agents.tracebacks import DEFAULT_LIMITS, TracebackLimits, traceback_fields
from tiffany.kernel import Coroutine, RunInThread, Step
from tiffany.wire.documents import did_you_mean

__all__ = [
    "ENTRY_POINT_GROUP",
    "PythonArgs",
    "PythonError",
    "PythonOutput",
    "PythonTool",
    "UnknownFunction",
    "check_python_steps",
    "functions",
    "load_entry_points",
    "lookup",
    "python_tool",
    "register_function",
    "unregister_function",
]

#: The entry-point group scanned for callables.
ENTRY_POINT_GROUP = "tiffany.tools"

F = TypeVar("F", bound=Callable[..., Any])

# The process-wide table: registration happens at import time of the
# operator's modules, before any scheduler runs; the lock covers the rare
# registration from a thread.
_FUNCTIONS: dict[str, Callable[..., Any]] = {}
_INLINE: set[str] = set()  # names registered with inline=True
_LOCK = threading.Lock()
_entry_points_loaded = False


class UnknownFunction(ToolError):
    """No callable is registered under the name."""

    code = "tool.python.unknown"


class PythonError(ToolError):
    """The registered callable raised (its type and message are in the fields)."""

    code = "tool.python.error"


def register_function(
    name: str, fn: Callable[..., Any], *, replace: bool = False, inline: bool = False
) -> None:
    """Register ``fn`` under ``name`` (a ValueError if taken and not ``replace``).

    Args:
        name: The name plans call it by.
        fn: A plain function or a generator function.
        replace: Replace a function registered under the same name.
        inline: ``fn`` is quick and never blocks: run its step on the
            scheduler's thread instead of the thread pool (see the module
            docstring). Ignored for a generator function.
    """
    if not callable(fn):
        raise TypeError(f"python tool {name!r}: {fn!r} is not callable")
    with _LOCK:
        if not replace and name in _FUNCTIONS and _FUNCTIONS[name] is not fn:
            raise ValueError(f"a python tool function named {name!r} is already registered")
        _FUNCTIONS[name] = fn
        if inline:
            _INLINE.add(name)
        else:
            _INLINE.discard(name)


def unregister_function(name: str) -> None:
    """Forget the callable registered under ``name`` (no error if there is none)."""
    with _LOCK:
        _FUNCTIONS.pop(name, None)
        _INLINE.discard(name)


@overload
def python_tool(name: F, *, inline: bool = False) -> F: ...


@overload
def python_tool(name: str | None = None, *, inline: bool = False) -> Callable[[F], F]: ...


def python_tool(name: str | F | None = None, *, inline: bool = False) -> F | Callable[[F], F]:
    """Decorator: register the decorated function; returns it unchanged.

    ``@python_tool`` registers it under its own name (``fn.__name__``),
    ``@python_tool("name")`` under another. ``inline=True`` marks a quick
    function that never blocks (see :func:`register_function`).
    """
    if callable(name):  # bare @python_tool
        fn = name
        register_function(fn.__name__, fn, inline=inline)
        return fn
    if name is not None and not isinstance(name, str):
        raise TypeError(f"python_tool: the name must be a string, not {name!r}")

    def decorate(fn: F) -> F:
        register_function(name or fn.__name__, fn, inline=inline)
        return fn

    return decorate


def load_entry_points(*, force: bool = False) -> list[str]:
    """Register the callables of the ``tiffany.tools`` entry points; return their names.

    Done once per process unless ``force``. A name already registered by the
    decorator keeps its callable.
    """
    global _entry_points_loaded
    if _entry_points_loaded and not force:
        return []
    _entry_points_loaded = True
    loaded: list[str] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _FUNCTIONS:
            continue
        register_function(ep.name, ep.load())
        loaded.append(ep.name)
    return loaded


def lookup(name: str) -> Callable[..., Any]:
    """Return the callable registered under ``name`` (entry points are loaded first).

    Raises:
        UnknownFunction: Nothing is registered under that name.
    """
    fn = _FUNCTIONS.get(name)
    if fn is None:
        load_entry_points()
        fn = _FUNCTIONS.get(name)
    if fn is None:
        known = ", ".join(sorted(_FUNCTIONS)) or "none"
        raise UnknownFunction(
            f"no python tool function {name!r} (registered: {known})", function=name
        )
    return fn


def functions() -> list[str]:
    """Return the registered names, sorted."""
    with _LOCK:
        return sorted(_FUNCTIONS)


class PythonArgs(ToolArgs):
    """Arguments of ``python``: the registered ``function`` and its keyword arguments."""

    function: str = Field(min_length=1, description="The registered function's name.")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments it is called with."
    )


class PythonOutput(FreeFormOutput):
    """Free-form: whatever the registered function returns (JSON-like)."""


class PythonTool:
    """Run a registered callable; its return value is the step's result."""

    name: ClassVar[str] = "python"
    Args: ClassVar[type[ToolArgs]] = PythonArgs
    Output: ClassVar[type[FreeFormOutput]] = PythonOutput
    durable: ClassVar[bool] = True

    def step_for(self, args: PythonArgs, settings: ToolSettings | None = None) -> Step | None:
        """Return a step that calls a plain function directly, or None.

        A thread step, or an inline one for a function registered with
        ``inline=True``. ``settings``: the operator's (the bounds on a
        failure's traceback); the defaults without them.

        The worker yields this step instead of running :meth:`run` as a
        generator step: one task and one thread hand-off fewer per call.
        Generator functions (None here) still go through :meth:`run`.
        """
        name = args.function
        try:
            fn = lookup(name)
        except UnknownFunction:
            # The same step as for a registered plain function, so that what
            # the worker yields does not depend on what this engine has
            # registered: a run recovered on an engine that lacks the function
            # replays its journal unchanged, and the journal's step gate holds
            # the step (see ``is_registered``) until an engine that has it runs.
            missing = functools.partial(_call_missing, limits=_limits(settings))
            return Step(missing, name, args.kwargs, name=f"python:{name}")
        if _is_generator_function(fn):
            return None
        # The bounds ride on the function, not in the step's arguments: the
        # journal records their count (Step.fields), which a replay compares.
        call = functools.partial(_call_plain, limits=_limits(settings))
        return Step(call, name, fn, args.kwargs, name=f"python:{name}", inline=name in _INLINE)

    def run(self, args: PythonArgs, ctx: ToolContext) -> Coroutine:
        """Run the function: plain ones in the thread pool, generator ones here."""
        name, limits = args.function, ctx.settings.traceback
        fn = lookup(name)
        if not inspect.isgeneratorfunction(fn):  # its errors are wrapped in the thread
            return (yield RunInThread(_call_plain, name, fn, args.kwargs, limits))
        try:
            return (yield fn(**args.kwargs))
        except ToolError as exc:
            _add_frames(exc, limits)
            raise
        except Exception as exc:
            raise _wrapped(name, exc, limits) from exc


def check_python_steps(steps: Iterable[Any], loc_prefix: str = "") -> list[dict[str, str]]:
    """Return a problem per ``python`` step this process could not call as the plan says.

    Args:
        steps: The plan's steps (``StepSpec``: ``tool`` and ``args``).
        loc_prefix: Prefix of the problems' locations.

    A literal function name must be registered (one built from a reference,
    or a function gone before a recovered run reaches it, is held by the
    journal's step gate instead: ``ToolRegistry.step_gate``), and the names
    of literal ``kwargs`` must bind to its signature (:func:`_kwargs_problems`).
    """
    problems: list[dict[str, str]] = []
    for i, spec in enumerate(steps):
        if spec.tool != "python" or not isinstance(spec.args, Mapping):
            continue
        loc = f"{loc_prefix}steps[{i}].args"
        name = spec.args.get("function")
        if not isinstance(name, str) or "${" in name:
            continue
        try:
            fn = lookup(name)
        except UnknownFunction:
            known = ", ".join(functions()) or "none"
            problems.append(
                {
                    "loc": f"{loc}.function",
                    "msg": (
                        f"no python tool function {name!r} on this engine (registered: {known});"
                        " a function of your own module registers with --import MODULE"
                        " (or TIFFANY_TOOL_MODULES) on the engine's command"
                    ),
                }
            )
            continue
        kwargs = spec.args.get("kwargs")
        if isinstance(kwargs, Mapping):  # else a reference (the run's), or the shape's error
            problems.extend(_kwargs_problems(name, fn, kwargs, f"{loc}.kwargs"))
    return problems


#: Each registered function's signature, once (None: it has none to check against).
_SIGNATURES: weakref.WeakKeyDictionary[Any, inspect.Signature | None] = weakref.WeakKeyDictionary()


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return _SIGNATURES[fn]
    except (KeyError, TypeError):  # not seen yet; TypeError: no weak reference to it
        pass
    try:
        sig: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: called as given
        sig = None
    with contextlib.suppress(TypeError):
        _SIGNATURES[fn] = sig
    return sig


def _kwargs_problems(
    name: str, fn: Callable[..., Any], kwargs: Mapping[str, Any], loc: str
) -> list[dict[str, str]]:
    """The names of ``kwargs`` that ``fn(**kwargs)`` would refuse, and the ones it lacks."""
    sig = _signature(fn)
    if sig is None:
        return []
    params = sig.parameters.values()
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    problems = []
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        for key in kwargs:
            if key not in named:
                msg = (
                    f"unexpected keyword argument {key!r} of python function {name!r}"
                    f"{did_you_mean(str(key), named)} (parameters: {', '.join(named) or 'none'})"
                )
                problems.append({"loc": f"{loc}.{key}", "msg": msg})
    for p in params:
        if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind is p.POSITIONAL_ONLY:
            msg = (
                f"python function {name!r} takes {p.name!r} by position only: "
                "a python step passes keyword arguments"
            )
            problems.append({"loc": loc, "msg": msg})
        elif p.name not in kwargs:
            msg = f"missing required argument {p.name!r} of python function {name!r}"
            problems.append({"loc": f"{loc}.{p.name}", "msg": msg})
    return problems


def _is_generator_function(fn: Callable[..., Any]) -> bool:
    code = getattr(fn, "__code__", None)  # functions and bound methods: one flag test
    if code is not None:
        return bool(code.co_flags & inspect.CO_GENERATOR)
    return inspect.isgeneratorfunction(fn)


def is_registered(name: str) -> bool:
    """Return True if a function is registered under ``name`` (entry points loaded)."""
    try:
        lookup(name)
    except UnknownFunction:
        return False
    return True


def _limits(settings: ToolSettings | None) -> TracebackLimits:
    return settings.traceback if settings is not None else DEFAULT_LIMITS


def _call_missing(
    name: str, kwargs: dict[str, Any], limits: TracebackLimits = DEFAULT_LIMITS
) -> Any:
    """Call a function that was not registered when its step was made (it may be now)."""
    fn = lookup(name)  # raises UnknownFunction, the attempt's failure, if still missing
    if _is_generator_function(fn):
        raise PythonError(
            f"python tool {name!r} became a generator function; run it with a timeout_s",
            function=name,
        )
    return _call_plain(name, fn, kwargs, limits)


def _call_plain(
    name: str,
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    limits: TracebackLimits = DEFAULT_LIMITS,
) -> Any:
    """Call a plain registered function (in the thread pool), wrapping its errors.

    Where it failed is taken here, where its traceback still is (see the
    module docstring).
    """
    try:
        return fn(**kwargs)
    except ToolError as exc:
        _add_frames(exc, limits)
        raise
    except Exception as exc:
        raise _wrapped(name, exc, limits) from exc


def _wrapped(name: str, exc: Exception, limits: TracebackLimits) -> PythonError:
    """The ``tool.python.error`` for ``exc``, raised by function ``name``, with its frames."""
    return PythonError(
        f"python tool {name!r} raised {type(exc).__name__}: {exc}",
        function=name,
        type=type(exc).__name__,
        **traceback_fields(exc, limits),
    )


def _add_frames(exc: ToolError, limits: TracebackLimits) -> None:
    """Give ``exc``, a ToolError the function raised itself, its frames (unless it has some)."""
    if "traceback" not in exc.fields:
        exc.fields.update(traceback_fields(exc, limits))
