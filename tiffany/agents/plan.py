"""Plans: the JSON/YAML documents users write, and their validation.

A plan names its inputs (with defaults), its steps (each a tool call with
arguments) and its outputs. Steps form a DAG through ``after``; arguments
and outputs may reference inputs and earlier results::

    {"name": "triage",
     "inputs": {"repo": "demo"},
     "steps": [
       {"id": "fetch", "tool": "http", "args": {"method": "GET", "url": "http://127.0.0.1:9000/a"}},
       {"id": "count", "tool": "shell",
        "args": {"argv": ["wc", "-c"], "stdin": "${steps.fetch.output.body}"},
        "after": ["fetch"], "retries": 2, "timeout_s": 10}],
     "outputs": {"size": "${steps.count.output.stdout}"}}

The plan's shape (:class:`Plan`, :class:`StepSpec`, :class:`ConcurrencySpec`,
:class:`BudgetSpec`) is defined in :mod:`tiffany.wire.plan`, which the API
process imports too for its OpenAPI schema; this module re-exports those
models and adds the checks a shape cannot make.

Validation happens before anything runs and reports every problem with the
path of the field at fault (``steps[2].after[0]: unknown step 'b'``): shape
errors from pydantic, then unknown tools, duplicate ids, unknown ``after``
targets, cycles (named with their members) and references to steps that are
not upstream of the step that uses them. A shape error in a field the other
checks do not build on (a step's id, ``retries``, an unknown field) is
listed with them; one they build on (``after``, ``args``) is listed alone.

A plan that validates can be journaled and projected: the document first
passes :func:`tiffany.wire.documents.check` (depth, size, int64 integers, finite
floats, string keys, valid Unicode without NUL), and the arguments of a
built-in tool that hold no ``${...}`` reference are validated against the
tool's argument model at submit (``sleep`` of NaN, inf or 1e300 is refused
then, naming ``steps[0].args.seconds``, not when the step runs).

A field the plan's shape does not have (``aftr``) is named with a
did-you-mean and the fields allowed there.

Strict validation (``strict=True``: a submission, ``tiffany plan validate``)
checks more, with hints: the plan's own fields take their JSON type only
(``retries: true``, ``backoff: "1.5"``, ``continue_on_error: 1`` are
refused, as the API's OpenAPI schema says), a misspelt tool gets a did-you-mean, a tool that
exists but is disabled on this server says how to enable it, and every
step's arguments are checked against its tool's model even when some hold
references: an unknown argument (listing the allowed ones, with a
did-you-mean) and a missing required one are errors either way; a field
whose value holds a reference is only type-checked once resolved, when the
step runs (``"${inputs.n}"`` may become a number), and so are the checks
across fields (``llm``'s "messages or prompt") of a step that defers one.

Discussion:
    Why two levels: the planner parses a journaled plan again on every
    replay and recovery (``planner.py``), leniently. A plan an earlier
    version accepted must parse the same way for ever, or a replay of its
    run would end differently; the stricter checks therefore run only where
    a plan enters the system.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from tiffany.agents.refs import find_refs
from tiffany.errors import TiffanyError
from tiffany.wire.documents import DocumentError, check, did_you_mean, load_text
from tiffany.wire.plan import (
    MAX_CONCURRENCY_LIMIT,
    MAX_RETRIES,
    MAX_STEPS,
    BudgetSpec,
    ConcurrencySpec,
    Plan,
    StepSpec,
)

__all__ = [
    "MAX_CONCURRENCY_LIMIT",
    "MAX_RETRIES",
    "MAX_STEPS",
    "OPAQUE_ARGS",
    "BudgetSpec",
    "ConcurrencySpec",
    "Plan",
    "PlanError",
    "StepSpec",
    "check_args",
    "check_inputs",
    "check_tools",
    "did_you_mean",
    "disabled_message",
    "load_plan",
    "parse_plan",
    "unknown_tool_message",
]

#: Arguments a tool takes as they are: references inside them are not this
#: plan's (``plan.run``'s child plan has its own ``${inputs...}``; a
#: ``signal.wait``'s payload schema is a literal, checked at submission).
OPAQUE_ARGS: dict[str, frozenset[str]] = {
    "plan.run": frozenset({"plan"}),
    "signal.wait": frozenset({"schema"}),
}


class PlanError(TiffanyError):
    """A plan is invalid; ``errors`` lists ``{"loc": "steps[2].after[0]", "msg": ...}``."""

    code = "plan.invalid"

    def __init__(self, errors: list[dict[str, str]]) -> None:
        lines = "; ".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"] for e in errors)
        super().__init__(f"invalid plan: {lines}", errors=errors)
        self.errors = errors


def _loc(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out


def parse_plan(
    data: Mapping[str, Any],
    tools: Iterable[str] | None = None,
    *,
    known_steps: Iterable[str] = (),
    loc_prefix: str = "",
    strict: bool = False,
    disabled: Iterable[str] = (),
    checked: bool = False,
) -> Plan:
    """Validate ``data`` as a plan; raise :class:`PlanError` listing every problem.

    Args:
        data: The decoded plan document.
        tools: Tool names that exist (None: do not check).
        known_steps: Ids of steps already in the plan (for steps added at run time).
        loc_prefix: Prefix of error locations (for added steps).
        strict: Check as at submission (see the module docstring): hints, and
            arguments of steps that hold references. Never for a journaled plan.
        disabled: Tools that exist but are not enabled here (strict only: the
            error says how to enable them instead of "unknown").
        checked: ``data`` passed :func:`tiffany.wire.documents.check` already (the
            engine checks a submission's whole body first): not checked twice.
    """
    if not checked:
        try:
            check(data)
        except DocumentError as exc:
            raise PlanError([{"loc": loc_prefix + _loc(exc.loc), "msg": exc.msg}]) from None
    try:
        # Strict at entry: a number, a flag or a name of the JSON type its field
        # has (``retries: true``, ``backoff: "1.5"``, ``continue_on_error: 1``
        # were taken, though the API's schema says they are refused); a
        # journaled plan is parsed as it was accepted.
        plan = Plan.model_validate(data, strict=strict)
    except ValidationError as exc:
        errors = [
            {"loc": loc_prefix + _loc(e["loc"]), "msg": _shape_message(e)}
            for e in exc.errors(include_url=False)
        ]
        rest = _without_bad_fields(data, exc)
        if rest is not None:
            more = _problems(rest, tools, known_steps, loc_prefix, strict, disabled)
            errors.extend(e for e in more if e not in errors)
        raise PlanError(errors) from None
    errors = _problems(plan, tools, known_steps, loc_prefix, strict, disabled)
    if errors:
        raise PlanError(errors)
    return plan


#: The model of each object of a plan, by its path (list indexes left out).
_MODEL_AT: dict[tuple[str, ...], type[BaseModel]] = {
    (): Plan,
    ("steps",): StepSpec,
    ("concurrency",): ConcurrencySpec,
    ("budget",): BudgetSpec,
}


def _shape_message(error: Any) -> str:
    """Pydantic's message for a shape error; an unknown field's names the known ones.

    A misspelt field (``aftr``, ``ouputs``) was "Extra inputs are not
    permitted": it gets a did-you-mean and the fields allowed there.
    """
    where = error["loc"]
    model = _MODEL_AT.get(tuple(p for p in where[:-1] if isinstance(p, str)))
    if error["type"] != "extra_forbidden" or model is None or not where:
        return str(error["msg"])
    key, allowed = str(where[-1]), list(model.model_fields)
    return f"unknown field {key!r}{did_you_mean(key, allowed)} (allowed: {', '.join(allowed)})"


#: A step's fields that have defaults and that no other check of the plan reads:
#: one that fails its shape is left out for the rest of the checks.
_INERT_STEP_FIELDS = frozenset({"retries", "backoff", "timeout_s", "continue_on_error", "dynamic"})
#: The same for the plan's own fields (``name`` gets a stand-in).
_INERT_PLAN_FIELDS = frozenset({"name", "description", "concurrency", "budget"})


def _without_bad_fields(data: Mapping[str, Any], exc: ValidationError) -> Plan | None:
    """Return the plan with the fields that failed their shape left out, for the other checks.

    So that every problem is listed at once (a bad step id used to hide an
    unknown tool until it was fixed). Left out: an unknown field, a bad
    step id given as a string (kept as written: the checks only compare
    ids), and the fields no other check reads (:data:`_INERT_STEP_FIELDS`).
    None when another field is at fault (``steps``, ``after``, ``args``,
    ``inputs``, ``outputs``...): the checks would report what follows from
    leaving it out (a reference "not upstream" of a step whose ``after``
    was dropped), so the shape errors are told alone, as before.

    Discussion: the result is for reporting only; a plan with any shape
    error is refused whatever the other checks find.
    """
    steps = data.get("steps")
    if not isinstance(steps, list):
        return None
    plan = dict(data)
    plan["steps"] = copies = [dict(s) if isinstance(s, Mapping) else s for s in steps]
    ids: dict[int, str] = {}  # steps whose id is kept as written
    for e in exc.errors(include_url=False):
        where, kind = e["loc"], e["type"]
        if len(where) >= 3 and where[0] == "steps" and isinstance(where[1], int):
            step, field = copies[where[1]], where[2]
            if not isinstance(step, dict):
                return None
            if kind == "extra_forbidden" or field in _INERT_STEP_FIELDS:
                step.pop(field, None)
            elif field == "id" and isinstance(step.get("id"), str) and step["id"]:
                ids[where[1]] = step["id"]
                step["id"] = f"_{where[1]}"  # valid; the id as written is put back below
            else:
                return None
        elif len(where) >= 1 and (kind == "extra_forbidden" or where[0] in _INERT_PLAN_FIELDS):
            plan.pop(str(where[0]), None)
        else:
            return None
    plan.setdefault("name", "plan")
    try:
        valid = Plan.model_validate(plan)
    except ValidationError:
        return None
    for i, step_id in ids.items():
        valid.steps[i].id = step_id
    return valid


def _problems(
    plan: Plan,
    tools: Iterable[str] | None,
    known_steps: Iterable[str],
    loc_prefix: str,
    strict: bool,
    disabled: Iterable[str],
) -> list[dict[str, str]]:
    """The problems of a plan of the right shape: ids, tools, arguments, references."""
    if strict:
        errors = check_steps(
            plan.steps, plan.inputs, None, known_steps=known_steps, loc_prefix=loc_prefix
        )
        errors[:0] = check_tools(plan.steps, tools, disabled, loc_prefix)
        errors.extend(check_args(plan.steps, tools, disabled, loc_prefix))
    else:
        errors = check_steps(
            plan.steps, plan.inputs, tools, known_steps=known_steps, loc_prefix=loc_prefix
        )
        errors.extend(_check_args(plan.steps, loc_prefix))
    step_ids = {s.id for s in plan.steps}
    for name, value in plan.outputs.items():
        for path, ref in _refs_in(value, f"outputs.{name}"):
            if ref.scope == "invalid":
                msg = f"bad reference ${{{ref.text}}}: use inputs.NAME or steps.ID.output"
                errors.append({"loc": path, "msg": msg})
            elif ref.scope == "inputs" and ref.name not in plan.inputs:
                errors.append({"loc": path, "msg": f"unknown input {ref.name!r}"})
            elif ref.scope == "steps" and ref.name not in step_ids:
                errors.append({"loc": path, "msg": f"unknown step {ref.name!r}"})
    if plan.concurrency is not None:
        for ref in find_refs(plan.concurrency.key):
            if ref.scope != "inputs" or ref.name not in plan.inputs:
                msg = f"the key may reference declared inputs only, not {ref.scope}.{ref.name}"
                errors.append({"loc": "concurrency.key", "msg": msg})
    return errors


@functools.cache
def _arg_models() -> dict[str, type[BaseModel]]:
    """The argument models of the built-in tools, by tool name (imported on first use)."""
    from tiffany.agents.tools import BUILTIN_TOOLS

    tools: list[Any] = list(BUILTIN_TOOLS)
    return {str(tool.name): tool.Args for tool in tools}


def _subloc(parts: Iterable[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _check_args(steps: list[StepSpec], loc_prefix: str) -> list[dict[str, str]]:
    """Validate the literal arguments of built-in tools (a reference is resolved at run time)."""
    models = _arg_models()
    errors: list[dict[str, str]] = []
    for i, s in enumerate(steps):
        model = models.get(s.tool)
        if model is None or any(True for _ in _refs_in(_scanned(s), "")):
            continue
        try:
            model.model_validate(s.args)
        except ValidationError as exc:
            errors.extend(
                {"loc": f"{loc_prefix}steps[{i}].args{_subloc(e['loc'])}", "msg": e["msg"]}
                for e in exc.errors(include_url=False)
                if e["type"] != "missing"  # a missing argument is the run's to report
            )
    return errors


def check_inputs(plan: Plan, inputs: Mapping[str, Any]) -> list[dict[str, str]]:
    """Return a problem per given input the plan does not declare (with a did-you-mean)."""
    declared = list(plan.inputs)
    listed = ", ".join(declared) or "none"
    return [
        {
            "loc": f"inputs.{key}",
            "msg": f"not an input of this plan{did_you_mean(key, declared)} (inputs: {listed})",
        }
        for key in sorted(set(inputs) - set(declared))
    ]


def disabled_message(tool: str) -> str:
    """How a disabled tool is told apart from an unknown one, with the fix."""
    return (
        f"tool {tool!r} is disabled on this server: start it with --enable-tool {tool} "
        f"(or add {tool} to TIFFANY_ENABLED_TOOLS)"
    )


def unknown_tool_message(tool: str, known: Iterable[str]) -> str:
    """An unknown tool, with a did-you-mean and the known ones."""
    names = sorted(known)
    return f"unknown tool {tool!r}{did_you_mean(tool, names)} (known: {', '.join(names)})"


def check_tools(
    steps: list[StepSpec],
    tools: Iterable[str] | None,
    disabled: Iterable[str],
    loc_prefix: str = "",
) -> list[dict[str, str]]:
    """Return a problem per step whose tool is unknown (did-you-mean) or disabled (the fix)."""
    if tools is None:
        return []
    enabled, off = set(tools), set(disabled) - set(tools)
    errors = []
    for i, s in enumerate(steps):
        if s.tool in enabled:
            continue
        msg = (
            disabled_message(s.tool)
            if s.tool in off
            else unknown_tool_message(s.tool, enabled | off)
        )
        errors.append({"loc": f"{loc_prefix}steps[{i}].tool", "msg": msg})
    return errors


def check_args(
    steps: list[StepSpec],
    tools: Iterable[str] | None = None,
    disabled: Iterable[str] = (),
    loc_prefix: str = "",
) -> list[dict[str, str]]:
    """Check every built-in tool step's arguments against its model (strict validation).

    Unknown and missing arguments are errors whatever the values; a field
    holding a ``${...}`` reference is left to the run (see the module
    docstring). ``agent``'s ``tools`` must name tools that exist here.
    """
    from tiffany.agents.tools.schema import arg_fields

    models = _arg_models()
    errors: list[dict[str, str]] = []
    for i, s in enumerate(steps):
        model = models.get(s.tool)
        if model is None:
            continue
        loc = f"{loc_prefix}steps[{i}].args"
        fields = arg_fields(model)
        opaque = OPAQUE_ARGS.get(s.tool, frozenset())
        deferred = {k for k, v in s.args.items() if k not in opaque and find_refs(v)}
        errors.extend(_check_arg_names(s, fields, loc))
        errors.extend(_check_arg_values(s, model, fields, deferred, loc))
        if s.tool == "agent" and tools is not None and "tools" not in deferred:
            errors.extend(_check_agent_tools(s.args.get("tools"), tools, disabled, loc))
        if s.tool == "agent" and tools is not None and s.args.get("memory") is not None:
            errors.extend(_check_agent_memory(tools, disabled, loc))
    return errors


def _check_arg_names(s: StepSpec, fields: Mapping[str, Any], loc: str) -> list[dict[str, str]]:
    """A step's unknown arguments (with a did-you-mean) and its missing required ones."""
    allowed = [k for k, f in fields.items() if f.shown]
    errors = [
        {
            "loc": f"{loc}.{key}",
            "msg": f"unknown argument {key!r} of tool {s.tool!r}{did_you_mean(key, allowed)} "
            f"(allowed: {', '.join(allowed)})",
        }
        for key in s.args
        if key not in fields
    ]
    given = {fields[k].name for k in s.args if k in fields}
    errors.extend(
        {"loc": f"{loc}.{key}", "msg": f"missing required argument {key!r} of tool {s.tool!r}"}
        for key, f in fields.items()
        if f.required and f.name not in given and f.shown
    )
    return errors


def _check_arg_values(
    s: StepSpec,
    model: type[BaseModel],
    fields: Mapping[str, Any],
    deferred: set[str],
    loc: str,
) -> list[dict[str, str]]:
    """The literal arguments validated by the tool's model (references left to the run)."""
    literal = {k: v for k, v in s.args.items() if k in fields and k not in deferred}
    try:
        model.model_validate(literal)
    except ValidationError as exc:
        errors = []
        for e in exc.errors(include_url=False):
            if e["type"] in ("missing", "extra_forbidden") and len(e["loc"]) == 1:
                continue  # told by _check_arg_names (or deferred to the run)
            if not e["loc"] and deferred:
                continue  # a check across fields, one of them not known yet
            errors.append({"loc": loc + _subloc(e["loc"]), "msg": e["msg"]})
        return errors
    return []


#: The tools an ``agent`` step's ``memory`` calls (``remember``, ``recall``).
_AGENT_MEMORY_TOOLS = ("memory.put", "memory.search")


def _check_agent_memory(
    tools: Iterable[str], disabled: Iterable[str], loc: str
) -> list[dict[str, str]]:
    """An ``agent`` step's ``memory``: remember and recall are ``memory.*`` steps, enabled here."""
    enabled, off = set(tools), set(disabled)
    return [
        {
            "loc": f"{loc}.memory",
            "msg": f"remember and recall call {name}: {disabled_message(name)}",
        }
        for name in _AGENT_MEMORY_TOOLS
        if name not in enabled and name in off
    ]


def _check_agent_tools(
    listed: Any, tools: Iterable[str], disabled: Iterable[str], loc: str
) -> list[dict[str, str]]:
    """The ``agent`` step's ``tools``: each must be a tool this server runs."""
    if not isinstance(listed, list):
        return []
    enabled, off = set(tools), set(disabled) - set(tools)
    errors = []
    for j, name in enumerate(listed):
        if not isinstance(name, str) or name in enabled or find_refs(name):
            continue
        msg = disabled_message(name) if name in off else unknown_tool_message(name, enabled | off)
        errors.append({"loc": f"{loc}.tools[{j}]", "msg": msg})
    return errors


def check_steps(
    steps: list[StepSpec],
    inputs: Mapping[str, Any],
    tools: Iterable[str] | None,
    *,
    known_steps: Iterable[str] = (),
    loc_prefix: str = "",
) -> list[dict[str, str]]:
    """Return the semantic problems of ``steps`` (ids, after, cycles, references, tools)."""
    errors: list[dict[str, str]] = []
    tool_names = set(tools) if tools is not None else None
    known = set(known_steps)
    ids: dict[str, int] = {}
    for i, s in enumerate(steps):
        loc = f"{loc_prefix}steps[{i}]"
        if s.id in ids or s.id in known:
            errors.append({"loc": f"{loc}.id", "msg": f"duplicate step id {s.id!r}"})
        ids.setdefault(s.id, i)
        if tool_names is not None and s.tool not in tool_names:
            errors.append(
                {
                    "loc": f"{loc}.tool",
                    "msg": f"unknown tool {s.tool!r} (known: {', '.join(sorted(tool_names))})",
                }
            )
    all_ids = set(ids) | known
    for i, s in enumerate(steps):
        for j, dep in enumerate(s.after):
            if dep not in all_ids:
                errors.append(
                    {"loc": f"{loc_prefix}steps[{i}].after[{j}]", "msg": f"unknown step {dep!r}"}
                )
            elif dep == s.id:
                errors.append(
                    {
                        "loc": f"{loc_prefix}steps[{i}].after[{j}]",
                        "msg": "a step cannot wait for itself",
                    }
                )
    cycle = _find_cycle({s.id: [d for d in s.after if d in ids] for s in steps})
    if cycle:
        errors.append(
            {"loc": f"{loc_prefix}steps", "msg": "cycle: " + " -> ".join([*cycle, cycle[0]])}
        )
        return errors
    graph = {s.id: s.after for s in steps}
    for i, s in enumerate(steps):
        for path, ref in _refs_in(_scanned(s), f"{loc_prefix}steps[{i}].args"):
            if ref.scope == "invalid":
                errors.append(
                    {
                        "loc": path,
                        "msg": f"bad reference ${{{ref.text}}}: use inputs.NAME or steps.ID.output",
                    }
                )
            elif ref.scope == "inputs" and ref.name not in inputs:
                errors.append({"loc": path, "msg": f"unknown input {ref.name!r}"})
            elif ref.scope == "steps":
                if ref.name not in all_ids:
                    errors.append({"loc": path, "msg": f"unknown step {ref.name!r}"})
                elif ref.name not in known and not _is_upstream(graph, ref.name, s.id):
                    errors.append(
                        {
                            "loc": path,
                            "msg": (
                                f"step {ref.name!r} is not upstream of {s.id!r}: add it to after"
                            ),
                        }
                    )
    return errors


def _scanned(step: StepSpec) -> dict[str, Any]:
    """The step's arguments whose references are this plan's (``OPAQUE_ARGS`` left out)."""
    opaque = OPAQUE_ARGS.get(step.tool)
    if not opaque:
        return step.args
    return {k: v for k, v in step.args.items() if k not in opaque}


def _refs_in(value: Any, path: str) -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _refs_in(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _refs_in(v, f"{path}[{i}]")
    elif isinstance(value, str):
        for ref in find_refs(value):
            yield path, ref


def _find_cycle(graph: Mapping[str, list[str]]) -> list[str] | None:
    """Return the members of a cycle in order, or None (iterative DFS: no depth limit)."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    for root in graph:
        if color[root] != white:
            continue
        color[root] = grey
        path = [root]
        iters = [iter(graph.get(root, ()))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                color[path.pop()] = black
                iters.pop()
                continue
            state = color.get(nxt)
            if state == grey:
                return path[path.index(nxt) :]
            if state == white:
                color[nxt] = grey
                path.append(nxt)
                iters.append(iter(graph.get(nxt, ())))
    return None


def _is_upstream(graph: Mapping[str, list[str]], target: str, start: str) -> bool:
    """True if ``target`` is reachable from ``start`` through ``after`` edges.

    A direct dependency (the usual reference) costs one list scan; otherwise
    an iterative search (no recursion: a 10,000-step chain is fine).
    """
    direct = graph.get(start, ())
    if target in direct:
        return True
    seen = {start}
    todo = list(direct)
    while todo:
        node = todo.pop()
        if node == target:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


def load_plan(path: str | Path) -> dict[str, Any]:
    """Read a plan file (JSON, or YAML for .yaml/.yml) with the document limits; return it."""
    p = Path(path)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{p.name}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        raise PlanError([{"loc": "", "msg": msg}]) from None
    try:
        data = load_text(text, p.suffix in (".yaml", ".yml"))
    except DocumentError as exc:
        where = _loc(exc.loc)
        kind = p.suffix.lstrip(".") or "JSON"
        msg = f"{p.name}: not valid {kind}: {exc.msg}"
        raise PlanError([{"loc": where, "msg": msg}]) from None
    if not isinstance(data, dict):
        raise PlanError(
            [{"loc": "", "msg": f"{p.name}: a plan is an object, got {type(data).__name__}"}]
        )
    return data
