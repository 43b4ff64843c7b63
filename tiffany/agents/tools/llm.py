"""``llm``: a chat completion from an OpenAI-compatible endpoint or a scripted model.

Providers, chosen by the operator's settings (:func:`provider_for`, the one
rule ``llm`` and ``agent`` share):

* **OpenAI-compatible** when ``ToolSettings.llm_base_url`` is set:
  ``POST {base_url}/v1/chat/completions`` with ``Authorization: Bearer
  {llm_api_key}`` (``/v1`` is not doubled when the base URL ends with it),
  through :func:`tiffany.agents.tools.http.request` in the thread pool. The
  model is the step's ``model`` or ``TIFFANY_LLM_MODEL``.
* **Scripted** (offline and deterministic) only when asked for: the model
  named ``scripted`` (``TIFFANY_LLM_MODEL=scripted``, or a step's
  ``model``), or a script of replies given (``TIFFANY_LLM_SCRIPT``) without
  an endpoint. Rules come from ``ToolSettings.llm_script``, a JSON or YAML
  file holding a list (or ``{"rules": [...]}``) of::

      {"match": "substring", "reply": "text", "steps": [...]}   # or
      {"regex": "pattern",   "reply": "text {prompt}"}

  tried in order against the last user message; ``{prompt}`` in a reply is
  replaced by that message. When no rule matches (or there is no script) a
  built-in rule answers with a summary: the first words of the prompt and
  its word, line and character counts; with ``plan=True`` it proposes two
  steps (write the summary to a file in the workspace, then read it back).
* **Neither**: the step fails with ``tool.llm.not_configured``, whose
  message names the settings that fix it. A server with no model never
  "succeeds" with canned text.

The request carries what current models accept: ``max_completion_tokens``
(the step's ``max_tokens``; ``max_tokens`` is refused by the o-series), and
``temperature`` only when the step sets one (reasoning models refuse any
but their default). When the endpoint answers 400 naming one of these
(:data:`ADJUSTABLE_PARAMS`) as unsupported, the call is sent once more
without it (``max_completion_tokens`` becomes ``max_tokens`` for an older
server) and the endpoint's refusal is remembered for that model
(:class:`Refusals`), so later calls do not pay for the 400 again.

With ``plan=True`` the result's ``steps`` holds new plan steps (a dynamic
step's tool returns them to the planner); the OpenAI provider is asked to
answer with a JSON object ``{"steps": [...]}`` and its reply is parsed.

Token counts of the scripted provider come from a whitespace tokenizer;
costs from :data:`PRICES_USD_PER_MTOK` (0 for the scripted provider and for
models not in the table). Every call emits an ``llm.usage`` event.

Discussion: the provider is chosen inside the durable step (the thread that
calls the model), never when the plan is submitted: the engine holds the
model's settings (the API process does not), a dynamic step adds ``llm``
steps at run time, and a replay, which never calls the model, never asks.

Rejected: the scripted provider as the default when nothing is set. It
made an ``agent`` step on a server without a model "succeed" with a canned
reply and no tool call, which looked like a working agent.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolError, ToolOutput, ToolSettings
from tiffany.agents.tools.http import HttpConnectError, request

__all__ = [
    "ADJUSTABLE_PARAMS",
    "PRICES_USD_PER_MTOK",
    "SCRIPTED_MODEL",
    "ChatMessage",
    "LlmArgs",
    "LlmError",
    "LlmNotConfigured",
    "LlmOutput",
    "LlmTool",
    "Refusals",
    "ScriptRule",
    "Usage",
    "cost_usd",
    "count_tokens",
    "provider_for",
    "provider_status",
    "scripted_reply",
    "with_usage",
]

#: The model name of the offline scripted provider.
SCRIPTED_MODEL = "scripted"
#: (prompt, completion) prices in US dollars per million tokens, by model prefix.
PRICES_USD_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
}
#: Words of the prompt quoted by the built-in summary.
SUMMARY_WORDS = 12
#: Default timeout of an OpenAI-compatible request, in seconds.
DEFAULT_TIMEOUT_S = 120.0
#: What the OpenAI provider is told when ``plan=True``.
PLAN_INSTRUCTIONS = (
    'Answer with only a JSON object {"steps": [...]}. Each step is an object '
    '{"id": "short_id", "tool": "tool name", "args": {...}, "after": ["step ids"]} '
    "describing the next steps of the plan; an empty list means nothing more to do."
)


class LlmError(ToolError):
    """The model could not be reached, refused, or gave an unusable answer."""

    code = "tool.llm.error"


class LlmNotConfigured(LlmError):
    """No model is configured for the step (no endpoint, and the scripted one not asked for)."""

    code = "tool.llm.not_configured"


class LlmStatusError(LlmError):
    """The endpoint answered with an HTTP error status."""

    code = "tool.llm.status"


class LlmConnectError(LlmError):
    """The endpoint could not be reached (or timed out)."""

    code = "tool.llm.connect"


class LlmPlanError(LlmError):
    """``plan=True`` but the reply holds no ``{"steps": [...]}``."""

    code = "tool.llm.plan"


class LlmScriptError(LlmError):
    """The scripted provider's rule file cannot be read."""

    code = "tool.llm.script"


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class LlmArgs(ToolArgs):
    """Arguments of ``llm``: ``messages`` or ``prompt`` (one user message), and options.

    Attributes:
        messages: The conversation.
        prompt: Shorthand for ``[{"role": "user", "content": prompt}]``.
        model: The model (default: the operator's ``llm_model``); ``scripted``
            is the offline scripted provider.
        temperature: Sampling temperature; sent only when set (reasoning
            models refuse any but their default).
        max_tokens: Most completion tokens, sent as ``max_completion_tokens``
            (the scripted provider cuts its reply).
        plan: Ask for new plan steps (the result's ``steps``).
        timeout_s: Bound on an OpenAI-compatible request, in seconds.
    """

    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    prompt: str | None = None
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    plan: bool = False
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=3600)

    @model_validator(mode="after")
    def _one_input(self) -> LlmArgs:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of messages and prompt")
        return self

    def conversation(self) -> list[dict[str, str]]:
        """Return the messages as plain dicts."""
        if self.messages is not None:
            return [m.model_dump() for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]


class Usage(ToolOutput):
    """Model tokens a call used (the scripted provider counts words)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class LlmOutput(ToolOutput):
    """What ``llm`` returns."""

    content: str = Field(description="The model's reply.")
    model: str = Field(description="The model that answered.")
    usage: Usage = Field(description="Tokens the call used.")
    cost_usd: float = Field(description="Estimated cost in US dollars (0 for the scripted one).")
    steps: list[dict[str, Any]] | None = Field(
        description="New plan steps the model proposed (plan=true), else null."
    )


class ScriptRule(BaseModel):
    """One rule of a scripted provider's file."""

    model_config = ConfigDict(extra="forbid")

    match: str | None = None
    regex: str | None = None
    reply: str = ""
    steps: list[dict[str, Any]] | None = None
    #: For the ``agent`` tool: the turn the rule answers (1-based; any if unset)
    #: and the tool calls it makes (``[{"name", "arguments"}]``).
    turn: int | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def matches(self, text: str) -> bool:
        """Return True if the rule applies to ``text`` (a rule with neither key always does)."""
        if self.match is not None and self.match not in text:
            return False
        return self.regex is None or re.search(self.regex, text) is not None


def count_tokens(text: str) -> int:
    """Return the whitespace-token count of ``text`` (the scripted provider's tokenizer)."""
    return len(text.split())


def cost_usd(model: str, prompt_tokens: int, completion_tokens: int) -> float:
    """Return the price of a call: the longest matching model prefix in the table, else 0."""
    best = max((p for p in PRICES_USD_PER_MTOK if model.startswith(p)), key=len, default=None)
    if best is None:
        return 0.0
    prompt_price, completion_price = PRICES_USD_PER_MTOK[best]
    return round((prompt_tokens * prompt_price + completion_tokens * completion_price) / 1e6, 8)


def _last_user(messages: list[dict[str, str]]) -> str:
    for m in reversed(messages):
        if m["role"] == "user":
            return m["content"]
    return "\n".join(m["content"] for m in messages)


def load_script(path: str) -> list[ScriptRule]:
    """Read a rule file (YAML for ``.yaml``/``.yml``, else JSON).

    Raises:
        LlmScriptError: Missing, unparsable or malformed.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
        doc = yaml.safe_load(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
        if isinstance(doc, dict):
            doc = doc.get("rules")
        if not isinstance(doc, list):
            raise ValueError("expected a list of rules or {'rules': [...]}")
        return [ScriptRule.model_validate(r) for r in doc]
    except (OSError, ValueError, yaml.YAMLError, ValidationError) as exc:
        raise LlmScriptError(f"llm script {path}: {exc}", path=path) from exc


def _builtin(prompt: str, step_id: str, plan: bool) -> tuple[str, list[dict[str, Any]] | None]:
    words = prompt.split()
    head = " ".join(words[:SUMMARY_WORDS]) + (" ..." if len(words) > SUMMARY_WORDS else "")
    lines = len(prompt.splitlines())
    summary = f"Summary: {head} ({len(words)} words, {lines} lines, {len(prompt)} characters)"
    if not plan:
        return summary, None
    path = f"{step_id}-summary.txt"
    steps: list[dict[str, Any]] = [
        {
            "id": f"{step_id}_write",
            "tool": "file.write",
            "args": {"path": path, "content": summary},
        },
        {
            "id": f"{step_id}_check",
            "tool": "file.read",
            "args": {"path": path},
            "after": [f"{step_id}_write"],
        },
    ]
    return summary, steps


def scripted_reply(
    messages: list[dict[str, str]],
    rules: list[ScriptRule],
    *,
    step_id: str = "llm",
    plan: bool = False,
    max_tokens: int | None = None,
) -> tuple[str, list[dict[str, Any]] | None]:
    """Return the scripted provider's ``(content, steps)`` for a conversation.

    ``steps`` is None unless ``plan`` (then a list, maybe empty).
    """
    prompt = _last_user(messages)
    for rule in rules:
        if rule.matches(prompt):
            content = rule.reply.replace("{prompt}", prompt)
            steps = (rule.steps or []) if plan else None
            break
    else:
        content, steps = _builtin(prompt, step_id, plan)
    if max_tokens is not None and count_tokens(content) > max_tokens:
        content = " ".join(content.split()[:max_tokens])
    return content, steps


def _parse_steps(content: str) -> list[dict[str, Any]]:
    text = content.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, flags=re.DOTALL)
    if fenced:
        text = fenced.group(1)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise LlmPlanError(f"plan reply is not JSON: {exc}", reply=content[:500]) from exc
    steps = doc.get("steps") if isinstance(doc, dict) else doc
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise LlmPlanError('plan reply holds no {"steps": [...]} list', reply=content[:500])
    return steps


def with_usage(exc: LlmError, doc: Any, model: str) -> LlmError:
    """Give ``exc``, raised after the model answered, the usage and cost its reply reports.

    The run's budget counts a failed attempt's ``usage`` and ``cost_usd``
    from its error's fields (``tiffany/agents/budget.py``): an unusable
    reply was paid for all the same. Only integer counts are taken; a reply
    that reports none (or did not parse) leaves ``exc`` as it is.
    """
    raw = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        return exc
    counts = {
        k: v
        for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        if isinstance(v := raw.get(k), int) and not isinstance(v, bool)
    }
    if not counts:
        return exc
    prompt, completion = counts.get("prompt_tokens", 0), counts.get("completion_tokens", 0)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": counts.get("total_tokens", prompt + completion),
    }
    answered = doc.get("model") if isinstance(doc, dict) else None
    cost = cost_usd(str(answered or model), prompt, completion)
    exc.fields.update(usage=usage, cost_usd=cost)
    return exc


def chat_url(base_url: str) -> str:
    """Return the chat-completions URL under an OpenAI-compatible base URL."""
    base = base_url.rstrip("/")
    return f"{base if base.endswith('/v1') else base + '/v1'}/chat/completions"


#: Optional request parameters a model may refuse, and what is sent instead
#: (None: nothing). ``max_completion_tokens`` falls back to the older name
#: for a server that predates it.
ADJUSTABLE_PARAMS: Final[dict[str, str | None]] = {
    "temperature": None,
    "max_completion_tokens": "max_tokens",
}
#: Endpoint-and-model pairs whose refusals are remembered; past it the
#: oldest is forgotten (it costs one 400 more). Plans name models freely.
MAX_REMEMBERED_MODELS: Final = 256
#: HTTP status of a request whose parameters the model refuses.
_BAD_REQUEST: Final = 400


class Refusals:
    """Which parameters each (endpoint, model) refused: they are not sent to it again.

    Process-wide (:data:`REFUSALS`), as the python tool's table of
    functions is: it is knowledge about a remote server, not a setting, and
    the thread-pool calls of every run share it. A restart forgets it (one
    400 more per model). Thread-safe.
    """

    def __init__(self, limit: int = MAX_REMEMBERED_MODELS) -> None:
        self._limit = limit
        self._refused: dict[tuple[str, str], frozenset[str]] = {}
        self._lock = threading.Lock()

    def remember(self, key: tuple[str, str], param: str) -> None:
        """Note that ``key``'s model refused ``param``."""
        with self._lock:
            known = self._refused.pop(key, frozenset())
            self._refused[key] = known | {param}
            while len(self._refused) > self._limit:
                del self._refused[next(iter(self._refused))]

    def refused(self, key: tuple[str, str]) -> frozenset[str]:
        """The parameters ``key``'s model refused."""
        return self._refused.get(key, frozenset())

    def forget(self) -> None:
        """Forget every refusal (tests)."""
        with self._lock:
            self._refused.clear()


#: The process's refusals (see :class:`Refusals`).
REFUSALS: Final = Refusals()


def _without(payload: Mapping[str, Any], refused: Iterable[str]) -> dict[str, Any]:
    """``payload`` without the ``refused`` parameters (or under their fallback name)."""
    out = dict(payload)
    for param in refused:
        if param in out:
            value = out.pop(param)
            fallback = ADJUSTABLE_PARAMS.get(param)
            if fallback is not None and fallback not in refused:
                out[fallback] = value
    return out


def refused_param(status: int, body: str, sent: Iterable[str]) -> str | None:
    """The adjustable parameter a 400 answer says the model refuses, if we sent it.

    OpenAI names it in ``error.param`` (``unsupported_parameter``,
    ``unsupported_value``); other servers only in the message, where the
    parameter named first is the one refused (``'max_tokens' is not
    supported ... use 'max_completion_tokens'``).
    """
    if status != _BAD_REQUEST:
        return None
    sent = set(sent)
    names = [*ADJUSTABLE_PARAMS, *(v for v in ADJUSTABLE_PARAMS.values() if v)]
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        param = error.get("param")
        if isinstance(param, str) and param in names:
            return param if param in sent else None
        text = str(error.get("message") or "")
    else:
        text = body
    lowered = text.lower()
    if not any(w in lowered for w in ("unsupported", "not supported", "does not support")):
        return None
    found = [(lowered.find(n), n) for n in names if n in lowered]
    if not found:
        return None
    first = min(found)[1]
    return first if first in sent else None


def _post(settings: ToolSettings, payload: dict[str, Any], timeout_s: float) -> tuple[str, str]:
    """One POST of ``payload``: ``(url, body)``; an HTTP error status raises."""
    assert settings.llm_base_url is not None
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if settings.llm_api_key:
        headers["Authorization"] = f"Bearer {settings.llm_api_key}"
    url = chat_url(settings.llm_base_url)
    try:
        resp = request(
            "POST",
            url,
            headers=headers,
            data=json.dumps(payload).encode("utf-8"),
            timeout_s=timeout_s,
            max_body_bytes=settings.http_max_body_bytes,
        )
    except HttpConnectError as exc:
        raise LlmConnectError(f"llm endpoint {url}: {exc.message}", url=url) from exc
    body = resp.body.decode("utf-8", errors="replace")
    if resp.status >= _BAD_REQUEST:
        raise LlmStatusError(
            f"llm endpoint {url}: HTTP {resp.status}", status=resp.status, body=body[:2000]
        )
    return url, body


def post_chat(
    settings: ToolSettings,
    payload: dict[str, Any],
    timeout_s: float,
    emit: Callable[[str, Mapping[str, Any]], None] | None = None,
) -> tuple[str, str]:
    """POST ``payload`` to the OpenAI-compatible chat endpoint; return ``(url, reply body)``.

    Shared by ``llm`` and ``agent``: the request, the API key, and the
    connect and HTTP-status errors; each reads the reply's fields itself.
    A parameter the model refused before is not sent; one it refuses now
    (a 400 naming it: :func:`refused_param`) is remembered and the call
    sent again without it, at most once per adjustable parameter; ``emit``
    tells it (``llm.param_refused``).

    Raises:
        LlmConnectError: The endpoint could not be reached.
        LlmStatusError: It answered 400 or more (other than such a refusal).
    """
    assert settings.llm_base_url is not None
    key = (settings.llm_base_url, str(payload.get("model")))
    sent = _without(payload, REFUSALS.refused(key))
    for _ in range(len(ADJUSTABLE_PARAMS) + 1):
        try:
            return _post(settings, sent, timeout_s)
        except LlmStatusError as exc:
            param = refused_param(exc.fields["status"], exc.fields["body"], sent)
            if param is None:
                raise
            REFUSALS.remember(key, param)
            if emit is not None:
                emit("llm.param_refused", {"model": key[1], "param": param})
            sent = _without(sent, REFUSALS.refused(key))
    raise AssertionError("unreachable: each retry drops a parameter")  # pragma: no cover


def provider_for(settings: ToolSettings, model: str | None) -> tuple[str, str]:
    """Return ``(provider, model)`` for a call naming ``model`` (or None): the one rule.

    ``"scripted"`` for the model named ``scripted`` (the step's or the
    operator's), else ``"openai"`` when an endpoint is set (a model is then
    needed), else ``"scripted"`` when a script of replies is given; the
    reported model is the one named, or ``scripted``.

    Raises:
        LlmNotConfigured: None of these: the message names the settings.
    """
    named = model or settings.llm_model
    if named == SCRIPTED_MODEL:
        return SCRIPTED_MODEL, named
    if settings.llm_base_url:
        if not named:
            raise LlmNotConfigured(
                "no model for the llm endpoint: set TIFFANY_LLM_MODEL (or the step's model)",
                setting="TIFFANY_LLM_MODEL",
            )
        return "openai", named
    if settings.llm_script:
        return SCRIPTED_MODEL, named or SCRIPTED_MODEL
    raise LlmNotConfigured(
        "no model is configured: set TIFFANY_LLM_BASE_URL and TIFFANY_LLM_MODEL for an "
        "OpenAI-compatible endpoint, or TIFFANY_LLM_MODEL=scripted (or TIFFANY_LLM_SCRIPT) "
        "for the offline scripted provider",
        setting="TIFFANY_LLM_BASE_URL",
    )


def provider_status(settings: ToolSettings) -> dict[str, Any]:
    """What the engine's status says of its model: ``{"provider", "model"}`` (None: none)."""
    try:
        provider, model = provider_for(settings, None)
    except LlmNotConfigured as exc:
        if settings.llm_base_url:  # an endpoint without a model: steps must name theirs
            return {"provider": "openai", "model": None, "note": exc.message}
        return {"provider": None, "model": None, "note": exc.message}
    return {"provider": provider, "model": model}


class LlmTool:
    """Ask a model: ``{"content", "model", "usage", "cost_usd", "steps"}``.

    ``usage`` is ``{"prompt_tokens", "completion_tokens", "total_tokens"}``;
    ``steps`` is None unless ``plan=True``.
    """

    name: ClassVar[str] = "llm"
    Args: ClassVar[type[ToolArgs]] = LlmArgs
    Output: ClassVar[type[ToolOutput]] = LlmOutput
    durable: ClassVar[bool] = True
    #: One model call per step: the worker checks and counts the run's budget.
    metered: ClassVar[str] = "call"

    def run(self, args: LlmArgs, ctx: ToolContext) -> dict[str, Any]:
        """Call the provider (in the thread pool)."""
        settings = ctx.settings
        messages = args.conversation()
        provider, model = provider_for(settings, args.model)
        if provider == "openai":
            content, steps, usage, model = self._openai(args, ctx, messages, model)
        else:
            rules = load_script(settings.llm_script) if settings.llm_script else []
            content, steps = scripted_reply(
                messages, rules, step_id=ctx.step_id, plan=args.plan, max_tokens=args.max_tokens
            )
            prompt_tokens = sum(count_tokens(m["content"]) for m in messages)
            completion_tokens = count_tokens(content)
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
        cost = (
            0.0
            if provider == SCRIPTED_MODEL
            else cost_usd(model, usage["prompt_tokens"], usage["completion_tokens"])
        )
        ctx.emit("llm.usage", {"provider": provider, "model": model, **usage, "cost_usd": cost})
        return {
            "content": content,
            "model": model,
            "usage": usage,
            "cost_usd": cost,
            "steps": steps,
        }

    def _openai(
        self, args: LlmArgs, ctx: ToolContext, messages: list[dict[str, str]], model: str
    ) -> tuple[str, list[dict[str, Any]] | None, dict[str, int], str]:
        settings = ctx.settings
        assert settings.llm_base_url is not None
        if args.plan:
            messages = [{"role": "system", "content": PLAN_INSTRUCTIONS}, *messages]
        payload: dict[str, Any] = {"model": model, "messages": messages}
        if args.temperature is not None:
            payload["temperature"] = args.temperature
        if args.max_tokens is not None:
            payload["max_completion_tokens"] = args.max_tokens
        url, body = post_chat(settings, payload, args.timeout_s, ctx.emit)
        doc: Any = None
        try:
            doc = json.loads(body)
            content = doc["choices"][0]["message"]["content"] or ""
            raw = doc.get("usage") or {}
            prompt_tokens = int(
                raw.get("prompt_tokens", sum(count_tokens(m["content"]) for m in messages))
            )
            completion_tokens = int(raw.get("completion_tokens", count_tokens(content)))
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": int(raw.get("total_tokens", prompt_tokens + completion_tokens)),
            }
            steps = _parse_steps(content) if args.plan else None
        except LlmError as exc:  # the plan reply: the model answered, and was paid for
            with_usage(exc, doc, model)
            raise
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            error = LlmError(f"llm endpoint {url}: unexpected reply: {exc!r}", body=body[:2000])
            raise with_usage(error, doc, model) from exc
        return content, steps, usage, str(doc.get("model") or model)
