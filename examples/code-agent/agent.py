"""An agent loop written as a workflow: the model decides the tool calls, a human approves.

Run it (from this directory), with the mock model of ``mock_model.py``
serving on port 8765 in another terminal::

    TIFFANY_LLM_BASE_URL=http://127.0.0.1:8765 TIFFANY_LLM_MODEL=mock \\
        tiffany run agent:code_agent --input 'task=write add() in calc.py' \\
        --signal 'approve={"approved": true, "by": "ann"}'

Every turn is one ``llm`` tool call (its reply journaled), and every tool the
model asks for is one ``tool(...)`` call (its result journaled). The first
call that changes the workspace waits for the ``approve`` signal: a human
(``tiffany signal RUN approve --data ...``, the dashboard's form, or
``--signal`` up front). ``tiffany replay RUN --verify --import agent``
replays the whole conversation from the journal: the model is not called.

The model answers with one JSON object a turn, ``{"tool": NAME, "args":
{...}}`` or ``{"answer": TEXT}``; parsing it in the workflow itself is
deterministic (the reply is a journaled value), so it needs no ``Step``.
"""

from __future__ import annotations

import json
from typing import Any

from tiffany import workflow
from tiffany.workflows import ToolFailed, signal, tool

#: The tools the model may call, and which of them change the workspace (those need approval).
TOOLS = {"file.read": False, "file.write": True}

APPROVAL = {
    "type": "object",
    "required": ["approved", "by"],
    "properties": {"approved": {"type": "boolean"}, "by": {"type": "string", "minLength": 1}},
}

SYSTEM = (
    "You are a coding agent working in a workspace. Each turn, answer with ONE JSON object: "
    '{"tool": NAME, "args": {...}} to call a tool, or {"answer": TEXT} when done. '
    'Tools: file.read {"path"}, file.write {"path", "content"}.'
)


def decide(reply: str) -> dict[str, Any]:
    """The model's move: a tool call, or an answer (so is a reply that is no JSON)."""
    try:
        move = json.loads(reply)
    except ValueError:
        return {"answer": reply}
    return move if isinstance(move, dict) else {"answer": reply}


@workflow("code-agent")
def code_agent(task: str, max_turns: int = 6):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    calls: list[dict[str, Any]] = []
    approved_by = None
    for _turn in range(max_turns):
        reply = yield tool("llm", messages=messages)  # the model call, journaled
        messages.append({"role": "assistant", "content": reply["content"]})
        move = decide(reply["content"])
        if "tool" not in move:
            return {"answer": move.get("answer"), "calls": calls, "approved_by": approved_by}
        name, args = move["tool"], move.get("args") or {}
        if name not in TOOLS:
            result: Any = {"error": f"unknown tool {name!r}: use one of {sorted(TOOLS)}"}
        else:
            if TOOLS[name] and approved_by is None:  # the first change waits for a human
                ok = yield signal("approve", schema=APPROVAL, timeout_s=86_400)
                if not ok["approved"]:
                    return {"answer": None, "calls": calls, "refused_by": ok["by"]}
                approved_by = ok["by"]
            try:
                result = yield tool(name, **args)  # the tool the model chose, journaled
            except ToolFailed as exc:  # bad arguments or a failed call: the model sees why
                result = {"error": str(exc)}
        calls.append({"tool": name, "args": args})
        messages.append({"role": "user", "content": f"{name} returned: {json.dumps(result)}"})
    return {"answer": None, "calls": calls, "approved_by": approved_by, "gave_up": True}
