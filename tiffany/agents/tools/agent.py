"""``agent``: an LLM drives tools in a loop (OpenAI-style function calling).

``{"tool": "agent", "args": {"goal": "...", "tools": ["file.read", "http"],
"max_turns": 8}}``: the model is given the goal and the JSON Schemas of the
listed tools; each turn it answers with text (the loop ends: that is the
step's ``answer``) or with tool calls, which run and whose results go back
to it as ``tool`` messages. Every model call and every tool call is a child
task of the step (``llm:<step>:<turn>``, ``tool:<name>:<step>``) running a
durable step, so its result (the model's reply with its tokens and cost, or
the tool's output) is journaled: a replay reproduces the whole conversation
without calling the model or the tools again, and a crash mid-loop resumes
after the last call that finished.

Providers, chosen as the ``llm`` tool chooses (``llm.provider_for``: no
model configured fails the step, ``tool.llm.not_configured``): the
OpenAI-compatible endpoint (``tools`` / ``tool_calls``; a tool's name has
its dots replaced by ``__``, as function names allow no dots), or, when
asked for, the offline scripted provider: rules of ``TIFFANY_LLM_SCRIPT``
with ``turn`` (1-based) and ``tool_calls`` (``[{"name", "arguments"}]``)
drive it, so tests and demos run without a network.

Output: ``{"answer", "turns", "calls": [{"turn", "tool", "ok"}], "usage",
"cost_usd"}``. A tool the step does not list, arguments that are not valid
JSON (``{"error": "arguments are not valid JSON: ... at char N"}``) or do
not fit the tool, or a tool that fails are told to the model (as the
``tool`` message, the call counted, not ok) so that it can correct itself,
not raised; no answer within ``max_turns`` fails the step (``agent.max_turns``).

Memory: ``"memory": {"namespace": "users.alice"}`` gives the model two more
functions on that namespace of the engine's MemoryStore: ``remember(text,
key?)`` (a ``memory.put`` of the text) and ``recall(query, k?)`` (a
``memory.search``). Each is a tool call like the others (a child task, a
durable step named after its tool, in the calls as ``remember`` /
``recall``): a replay is given what the model was told, and a remembered
fact is written once however often its step runs (its op is the call's:
``tools/memory.py``, ``write_op``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar, Final

from pydantic import Field, ValidationError

from tiffany.agents.budget import metered
from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolError, ToolOutput
from tiffany.agents.tools.llm import (
    SCRIPTED_MODEL,
    LlmError,
    Usage,
    cost_usd,
    count_tokens,
    load_script,
    post_chat,
    provider_for,
    with_usage,
)
from tiffany.agents.tools.memory import (
    MAX_K,
    MAX_KEY_CHARS,
    MAX_QUERY_CHARS,
    MAX_TEXT_CHARS,
    NAMESPACE_PATTERN,
    MemoryPutTool,
    MemorySearchTool,
)
from tiffany.errors import TaskCrashed
from tiffany.kernel import Coroutine, NewTask, Step, WaitTask
from tiffany.wire.records import TaskLabel

__all__ = [
    "AgentArgs",
    "AgentMaxTurns",
    "AgentMemory",
    "AgentOutput",
    "AgentTool",
    "function_name",
    "tool_name",
]

#: Most turns an agent step may take.
MAX_TURNS: Final = 100
#: Longest tool result given back to the model, in characters.
MAX_RESULT_CHARS: Final = 20_000


class AgentMaxTurns(ToolError):
    """The model did not give its answer within ``max_turns``."""

    code = "agent.max_turns"


class AgentMemory(ToolArgs):
    """The memory an ``agent`` step's model may use (``remember`` and ``recall``)."""

    namespace: str = Field(
        pattern=NAMESPACE_PATTERN,
        description="The namespace it remembers into and recalls from (``users.alice``).",
    )
    k: int = Field(default=5, ge=1, le=MAX_K, description="Memories a recall returns by default.")


class RememberArgs(ToolArgs):
    """Remember a fact for later (it stays after this run)."""

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="The fact, in words.")
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_KEY_CHARS,
        description="A key to file it under (the same key replaces it); default: a new one.",
    )


class RecallArgs(ToolArgs):
    """Recall the remembered facts that best match a query."""

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What to recall.")
    k: int | None = Field(default=None, ge=1, le=MAX_K, description="How many facts at most.")


#: The functions ``memory`` gives the model, with their arguments.
MEMORY_FUNCTIONS: Final[dict[str, type[ToolArgs]]] = {
    "remember": RememberArgs,
    "recall": RecallArgs,
}


class AgentArgs(ToolArgs):
    """Arguments of ``agent``."""

    goal: str = Field(min_length=1, description="What the model is asked to do.")
    tools: list[str] = Field(default_factory=list, description="Tools the model may call.")
    max_turns: int = Field(
        default=8, ge=1, le=MAX_TURNS, description="Most model calls before the step fails."
    )
    model: str | None = Field(default=None, description="The model (default: the operator's).")
    system: str | None = Field(default=None, description="A system message before the goal.")
    timeout_s: float = Field(default=120.0, gt=0, le=3600, description="A model call's bound.")
    memory: AgentMemory | None = Field(
        default=None,
        description="Give the model ``remember(text, key?)`` and ``recall(query, k?)`` on this "
        "namespace of memory (each call journaled, a write made once).",
    )


class AgentCall(ToolOutput):
    """One tool call the model made."""

    turn: int
    tool: str
    ok: bool = Field(description="False when refused or failed (the model was told why).")


class AgentOutput(ToolOutput):
    """What ``agent`` returns."""

    answer: str = Field(description="The model's final text.")
    turns: int = Field(description="Model calls made.")
    calls: list[AgentCall] = Field(description="The tool calls, in order.")
    usage: Usage = Field(description="Tokens of every model call, summed.")
    cost_usd: float = Field(description="Estimated cost of every model call, in US dollars.")


def function_name(tool: str) -> str:
    """A tool's name as a function name (no dots: ``file.write`` -> ``file__write``)."""
    return tool.replace(".", "__")


def tool_name(function: str) -> str:
    """The tool a function name stands for (:func:`function_name` undone)."""
    return function.replace("__", ".")


def _schemas(ctx: ToolContext, names: list[str]) -> list[dict[str, Any]]:
    out = []
    for name in names:
        tool = ctx.tools.lookup(name)
        doc = (tool.__doc__ or name).strip().splitlines()[0]
        params = tool.Args.model_json_schema()
        out.append(
            {
                "type": "function",
                "function": {"name": function_name(name), "description": doc, "parameters": params},
            }
        )
    return out


def _memory_schemas() -> list[dict[str, Any]]:
    """The ``remember`` and ``recall`` functions (an ``agent`` step with ``memory``)."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": (model.__doc__ or name).strip().splitlines()[0],
                "parameters": model.model_json_schema(),
            },
        }
        for name, model in MEMORY_FUNCTIONS.items()
    ]


def _chat(
    ctx: ToolContext,
    messages: list[dict[str, Any]],
    functions: list[dict[str, Any]],
    turn: int,
    model: str | None,
    timeout_s: float,
) -> dict[str, Any]:
    """One model call (a durable step, in the thread pool): the reply, tokens and cost."""
    provider, named = provider_for(ctx.settings, model)
    if provider == "openai":
        reply = _openai(ctx, messages, functions, named, timeout_s)
    else:
        reply = _scripted(ctx, messages, turn, named)
    usage = reply["usage"]
    cost = (
        0.0
        if provider == SCRIPTED_MODEL
        else cost_usd(reply["model"], usage["prompt_tokens"], usage["completion_tokens"])
    )
    reply["cost_usd"] = cost
    ctx.emit(
        "llm.usage", {"provider": provider, "model": reply["model"], **usage, "cost_usd": cost}
    )
    return reply


def _scripted(
    ctx: ToolContext, messages: list[dict[str, Any]], turn: int, model: str
) -> dict[str, Any]:
    rules = load_script(ctx.settings.llm_script) if ctx.settings.llm_script else []
    last = str(messages[-1].get("content") or "")
    content, calls = f"Done: {messages[1 if messages[0]['role'] == 'system' else 0]['content']}", []
    for rule in rules:
        if (rule.turn is None or rule.turn == turn) and rule.matches(last):
            content = rule.reply.replace("{prompt}", last)
            calls = [
                {"id": f"call_{turn}_{i}", "name": c["name"], **_arguments(c.get("arguments"))}
                for i, c in enumerate(rule.tool_calls or [])
            ]
            break
    prompt_tokens = sum(count_tokens(str(m.get("content") or "")) for m in messages)
    completion_tokens = count_tokens(content) + sum(len(c["arguments"]) for c in calls)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    return {"content": content, "tool_calls": calls, "usage": usage, "model": model}


def _openai(
    ctx: ToolContext,
    messages: list[dict[str, Any]],
    functions: list[dict[str, Any]],
    model: str,
    timeout_s: float,
) -> dict[str, Any]:
    settings = ctx.settings
    assert settings.llm_base_url is not None
    payload: dict[str, Any] = {"model": model, "messages": messages}
    if functions:
        payload["tools"] = functions
    url, body = post_chat(settings, payload, timeout_s, ctx.emit)
    doc: Any = None
    try:
        doc = json.loads(body)
        message = doc["choices"][0]["message"]
        calls = []
        for c in message.get("tool_calls") or []:
            calls.append(
                {
                    "id": str(c.get("id") or ""),
                    "name": tool_name(str(c["function"]["name"])),
                    **_arguments(c["function"].get("arguments")),
                }
            )
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        error = LlmError(f"llm endpoint {url}: unexpected reply: {exc!r}", body=body[:2000])
        raise with_usage(error, doc, model) from exc  # paid for: the budget counts it
    raw_usage = doc.get("usage") or {}
    content = message.get("content") or ""
    prompt_tokens = int(raw_usage.get("prompt_tokens", 0))
    completion_tokens = int(raw_usage.get("completion_tokens", count_tokens(content)))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": int(raw_usage.get("total_tokens", prompt_tokens + completion_tokens)),
    }
    return {
        "content": content,
        "tool_calls": calls,
        "usage": usage,
        "model": str(doc.get("model") or model),
    }


def _arguments(raw: Any) -> dict[str, Any]:
    """A tool call's ``arguments`` as the model sent them: ``{"arguments": value}``.

    Text is parsed as JSON (an object); text that is not valid JSON is kept
    as it came, with ``invalid`` saying why, for the model to be told
    (:func:`_tool_call`): one malformed call must not fail the whole reply.
    """
    if raw is None or raw == "":
        return {"arguments": {}}
    if not isinstance(raw, str):
        return {"arguments": raw}
    try:
        return {"arguments": json.loads(raw)}
    except json.JSONDecodeError as exc:
        return {
            "arguments": raw,
            "invalid": f"arguments are not valid JSON: {exc.msg} at char {exc.pos}",
        }


def _call_task(step: Step) -> Coroutine:
    """A child task of the agent step running one durable call (model or tool)."""
    return (yield step)


def _tool_call(
    ctx: ToolContext,
    allowed: list[str],
    call: Mapping[str, Any],
    turn: int,
    ordinal: int,
    memory: AgentMemory | None = None,
) -> Coroutine:
    """Run the ``ordinal``-th tool call of the step (in ``turn``); ``(ok, result)``.

    The tool sees the call's ordinal (``ToolContext.call``): what it names
    after its step and attempt (``plan.run``'s child run) is the call's own.
    A tool that is a model call itself (``llm``: ``metered == "call"``)
    counts against the run's budget as the agent's own turns do: checked
    before (a spent budget stops the agent, it is not told to the model),
    its usage charged after, failed or not.
    """
    name = str(call.get("name"))
    if name not in allowed:
        return False, {"error": f"tool {name!r} is not one of this step's tools: {allowed}"}
    if call.get("invalid"):
        return False, {"error": str(call["invalid"])}
    if memory is not None and name in MEMORY_FUNCTIONS:
        return (yield from _memory_call(ctx, memory, name, call.get("arguments") or {}, ordinal))
    tool = ctx.tools.lookup(name)
    try:
        args = tool.Args.model_validate(call.get("arguments") or {})
    except ValidationError as exc:
        return False, {"error": f"bad arguments: {exc.errors(include_url=False)}"}
    budget = ctx.budget if metered(tool) == "call" else None
    if budget is not None:
        budget.check(f"step {ctx.step_id} turn {turn}: tool {name}")
    ctx = replace(ctx, call=ordinal)
    try:
        if not tool.durable:
            return True, (yield tool.run(args, ctx))
        step_for = getattr(tool, "step_for", None)
        step = step_for(args, ctx.settings) if step_for is not None else None
        if step is None:
            step = Step(tool.run, args, ctx, name=name)
        tid = yield NewTask(
            _call_task(step),
            name=f"tool:{name}:{ctx.step_id}",
            meta=TaskLabel("tool", ctx.step_id, name),
        )
        result = yield WaitTask(tid)
    except Exception as exc:  # noqa: BLE001 - told to the model, as the tool's result
        cause = exc.__cause__ or exc
        if budget is not None:
            budget.charge(getattr(cause, "fields", None))
        return False, {"error": f"{type(cause).__name__}: {cause}"}
    if budget is not None and budget.charge(result) and budget.over():
        raise budget.exceeded(f"step {ctx.step_id} turn {turn}: tool {name}'s usage")
    return True, result


def _memory_call(
    ctx: ToolContext, memory: AgentMemory, name: str, raw: Any, ordinal: int
) -> Coroutine:
    """A ``remember`` or ``recall`` call: ``memory.put`` or ``memory.search``; ``(ok, result)``.

    The store's call is a durable step named after its tool, in a child task
    (as the agent's other tool calls): its whole answer is journaled (a
    put's with its embedding, for ``tiffany db rebuild``); the model is
    told the part that matters to it.
    """
    try:
        given = MEMORY_FUNCTIONS[name].model_validate(raw)
    except ValidationError as exc:
        return False, {"error": f"bad arguments: {exc.errors(include_url=False)}"}
    tool: Any
    if isinstance(given, RememberArgs):
        tool = MemoryPutTool()
        args: Any = tool.Args.model_validate(
            {"namespace": memory.namespace, "key": given.key, "value": given.text}
        )
    else:
        assert isinstance(given, RecallArgs)
        tool = MemorySearchTool()
        args = tool.Args.model_validate(
            {"namespace": memory.namespace, "query": given.query, "k": given.k or memory.k}
        )
    ctx = replace(ctx, call=ordinal)
    step = Step(tool.run, args, ctx, name=tool.name)
    try:
        tid = yield NewTask(
            _call_task(step),
            name=f"tool:{name}:{ctx.step_id}",
            meta=TaskLabel("tool", ctx.step_id, tool.name),
        )
        result = yield WaitTask(tid)
    except Exception as exc:  # noqa: BLE001 - told to the model, as the call's result
        cause = exc.__cause__ or exc
        return False, {"error": f"{type(cause).__name__}: {cause}"}
    if name == "remember":
        return True, {
            "remembered": True,
            "key": result.get("key"),
            "version": result.get("version"),
        }
    memories = [
        {"key": i.get("key"), "text": i.get("text"), "score": i.get("score")}
        for i in result.get("items") or []
    ]
    return True, {"memories": memories, "as_of": result.get("as_of")}


class AgentTool:
    """Let a model call tools until it answers."""

    name: ClassVar[str] = "agent"
    Args: ClassVar[type[ToolArgs]] = AgentArgs
    Output: ClassVar[type[ToolOutput]] = AgentOutput
    durable: ClassVar[bool] = False
    #: Each turn is a model call: the loop checks and counts the run's budget itself.
    metered: ClassVar[str] = "self"

    def run(self, args: AgentArgs, ctx: ToolContext) -> Coroutine:
        """The loop (in the worker task; each call a child task and a durable step)."""
        if ctx.tools is None:
            raise ToolError("this engine offers the agent no tools")
        functions = _schemas(ctx, args.tools)
        allowed = list(args.tools)
        if args.memory is not None:  # remember / recall (_memory_call)
            functions += _memory_schemas()
            allowed += [n for n in MEMORY_FUNCTIONS if n not in allowed]
        messages: list[dict[str, Any]] = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        messages.append({"role": "user", "content": args.goal})
        totals = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        cost = 0.0
        calls: list[dict[str, Any]] = []
        budget = ctx.budget  # the run's (budget.py), or None: checked before each turn
        for turn in range(1, args.max_turns + 1):
            if budget is not None:
                budget.check(f"step {ctx.step_id} turn {turn}")
            step = Step(
                _chat, ctx, list(messages), functions, turn, args.model, args.timeout_s, name="llm"
            )
            tid = yield NewTask(
                _call_task(step),
                name=f"llm:{ctx.step_id}:{turn}",
                meta=TaskLabel("tool", ctx.step_id, "llm"),
            )
            try:
                reply = yield WaitTask(tid)
            except TaskCrashed as exc:  # a reply it could not use was paid for all the same
                if budget is not None:
                    budget.charge(getattr(exc.__cause__, "fields", None))
                raise
            if budget is not None and budget.charge(reply) and budget.over():
                raise budget.exceeded(f"step {ctx.step_id} turn {turn}'s usage")
            for k in totals:
                totals[k] += int(reply["usage"].get(k, 0))
            cost += float(reply.get("cost_usd") or 0.0)
            wanted = reply.get("tool_calls") or []
            if not wanted:
                return {
                    "answer": reply.get("content") or "",
                    "turns": turn,
                    "calls": calls,
                    "usage": totals,
                    "cost_usd": round(cost, 8),
                }
            messages.append(
                {
                    "role": "assistant",
                    "content": reply.get("content") or None,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {
                                "name": function_name(c["name"]),
                                # as it came when it is no JSON: what the model said
                                "arguments": c["arguments"]
                                if isinstance(c["arguments"], str)
                                else json.dumps(c["arguments"]),
                            },
                        }
                        for c in wanted
                    ],
                }
            )
            for c in wanted:
                ok, result = yield from _tool_call(
                    ctx, allowed, c, turn, len(calls) + 1, args.memory
                )
                calls.append({"turn": turn, "tool": c["name"], "ok": ok})
                text = json.dumps(result, default=str)[:MAX_RESULT_CHARS]
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": text})
        raise AgentMaxTurns(
            f"no answer within {args.max_turns} turns", max_turns=args.max_turns, calls=len(calls)
        )
