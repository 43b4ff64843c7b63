"""``tiffany.workflows.memory`` in a workflow run: every call, journaled, replayed, refused.

* one workflow makes every memory call (put with and without a key, get,
  search, link, neighbors, delete) and reads back what it wrote; its
  calls' writes carry the call's op (``RUN/tool_N/0``);
* it replays from the journal alone to the same outputs, memory changed since;
* a refusal raises ``ToolFailed`` at the yield, naming the store's code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from memory_runs import ALL_TOOLS, open_store, replayed, settings_for

from tiffany.engine import build

sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory_flows  # noqa: F401 - registers the test workflows


def _run(data_dir: Path, name: str, **inputs: object) -> tuple[str, object]:
    engine = build(settings_for(data_dir), enabled_tools=ALL_TOOLS)
    with engine.runtime as rt:
        entry, run_name = engine.prepare_workflow(name, inputs)
        run_id = engine.start_entry(entry, name=run_name)
        rt.run()
        return run_id, rt.status(run_id)


def test_a_workflow_uses_every_memory_call_and_replays_what_it_read(tmp_path: Path) -> None:
    run_id, state = _run(tmp_path, "memory-tests.notes", user="ann")
    assert state.status == "succeeded", state.error
    out = state.result["outputs"]
    assert out["city"] == "Lyon"
    assert out["top"] == "city"
    assert out["near"] == ["food"]
    assert out["deleted"] is True
    assert isinstance(out["as_of"], int)
    store = open_store(tmp_path)
    try:
        assert [h["op"] for h in store.history("users.ann", "city")] == [f"{run_id}/tool_1/0"]
        assert store.get("users.ann", out["made"]) is None
        store.put("users.ann", "city", {"city": "Paris"}, op="test:moved")
    finally:
        store.close()
    status, result = replayed(tmp_path, run_id)
    assert (status, result) == ("succeeded", state.result)


def test_a_refusal_raises_at_the_yield_naming_the_code(tmp_path: Path) -> None:
    _, state = _run(tmp_path, "memory-tests.refused")
    assert state.status == "succeeded", state.error
    assert state.result["outputs"]["error_code"] == "memory.invalid"
    assert "key" in state.result["outputs"]["message"]
