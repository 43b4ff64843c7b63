"""``tiffany/store/conversation.py``: a turn read back from a model call's journaled reply."""

from __future__ import annotations

from types import SimpleNamespace

from tiffany.store.conversation import _turn


def test_a_call_whose_arguments_were_no_json_shows_what_the_model_was_told():
    """The call kept the model's text as it came; the page showed no reason it was refused."""
    said = "arguments are not valid JSON: Expecting value at char 29"
    reply = {
        "content": None,
        "model": "gpt-4o-mini",
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "cost_usd": 0.0,
        "tool_calls": [
            {"id": "c1", "name": "file.write", "arguments": '{"path": ', "invalid": said},
            {"id": "c2", "name": "file.read", "arguments": {"path": "a.txt"}},
        ],
    }
    task = SimpleNamespace(result=reply, ltid=7, state="done", error=None)
    broken, fine = _turn(task, 1, 1)["tool_calls"]
    assert (broken["arguments"], broken["error"]) == ('{"path": ', {"message": said})
    assert (fine["arguments"], fine["error"]) == ({"path": "a.txt"}, None)
