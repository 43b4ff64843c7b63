"""``llm``: a chat completion from an OpenAI-compatible endpoint or a scripted model.

Providers, chosen by the operator's settings:

* **OpenAI-compatible** when ``ToolSettings.llm_base_url`` is set:
  ``POST {base_url}/v1/chat/completions`` with ``Authorization: Bearer
  {llm_api_key}`` (``/v1`` is not doubled when the base URL ends with it),
  through :func:`tiffany.agents.tools.http.request` in the thread pool.
* **Scripted** otherwise (the default; offline and deterministic). Rules come
  from ``ToolSettings.llm_script``, a JSON or YAML file holding a list (or
  ``{"rules": [...]}``) of::

      {"match": "substring", "reply": "text", "steps": [...]}   # or
      {"regex": "pattern",   "reply": "text {prompt}"}

  tried in order against the last user message; ``{prompt}`` in a reply is
  replaced by that message. When no rule matches (or there is no script) a
  built-in rule answers with a summary: the first words of the prompt and
  its word, line and character counts; with ``plan=True`` it proposes two
  steps (write the summary to a file in the workspace, then read it back).

With ``plan=True`` the result's ``steps`` holds new plan steps (a dynamic
step's tool returns them to the planner); the OpenAI provider is asked to
answer with a JSON object ``{"steps": [...]}`` and its reply is parsed.

Token counts of the scripted provider come from a whitespace tokenizer;
costs from :data:`PRICES_USD_PER_MTOK` (0 for the scripted provider and for
models not in the table). Every call emits an ``llm.usage`` event.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolError, ToolOutput, ToolSettings
from tiffany.agents.tools.http import HttpConnectError, request

__all__ = [
    "PRICES_USD_PER_MTOK",
    "SCRIPTED_MODEL",
    "ChatMessage",
    "LlmArgs",
    "LlmError",
    "LlmOutput",
    "LlmTool",
    "ScriptRule",
    "Usage",
    "cost_usd",
    "count_tokens",
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
        model: The model (default: the operator's ``llm_model``).
        temperature: Sampling temperature.
        max_tokens: Most completion tokens (the scripted provider cuts its reply).
        plan: Ask for new plan steps (the result's ``steps``).
        timeout_s: Bound on an OpenAI-compatible request, in seconds.
    """

    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    prompt: str | None = None
    model: str | None = None
    temperature: float = Field(default=0.0, ge=0, le=2)
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


def post_chat(settings: ToolSettings, payload: dict[str, Any], timeout_s: float) -> tuple[str, str]:
    """POST ``payload`` to the OpenAI-compatible chat endpoint; return ``(url, reply body)``.

    Shared by ``llm`` and ``agent``: the request, the API key, and the
    connect and HTTP-status errors; each reads the reply's fields itself.

    Raises:
        LlmConnectError: The endpoint could not be reached.
        LlmStatusError: It answered 400 or more.
    """
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
    if resp.status >= 400:
        raise LlmStatusError(
            f"llm endpoint {url}: HTTP {resp.status}", status=resp.status, body=body[:2000]
        )
    return url, body


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
        if settings.llm_base_url:
            model = args.model or settings.llm_model
            content, steps, usage, model = self._openai(args, ctx, messages, model)
            provider = "openai"
        else:
            model = args.model or SCRIPTED_MODEL
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
            provider = "scripted"
        cost = (
            0.0
            if provider == "scripted"
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
        payload: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "temperature": args.temperature,
        }
        if args.max_tokens is not None:
            payload["max_tokens"] = args.max_tokens
        url, body = post_chat(settings, payload, args.timeout_s)
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
