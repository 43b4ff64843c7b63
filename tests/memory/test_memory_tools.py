"""The ``memory.*`` tools in plans: an engine in-process on a real SQLite store.

* a plan puts facts, then gets one through a reference to the put's key and
  searches them: outputs as the tools' ``Output`` models describe, the
  item's provenance (run, step, op ``RUN/STEP/0``) in the store; on the
  embedded store and on PostgreSQL;
* links, neighbours and a delete;
* refusals name the field: a bad namespace at submission
  (``steps[0].args.namespace``) and from an input when the step runs
  (``args.namespace``); the store's own (a reserved key, a value too
  large) fail the step with ``memory.invalid`` and the field, nothing
  written;
* an engine without a store fails the step with ``memory.unavailable``;
* the store is opened on a thread of its own, at the first memory step
  (never by ``build``, never on the loop's thread).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from memory_runs import ALL_TOOLS, open_store, run_plan, settings_for

from tiffany.agents import PlanError
from tiffany.agents.tools import ToolContext
from tiffany.agents.tools import memory as tools
from tiffany.engine import build

FACTS = {
    "name": "facts",
    "inputs": {"key": "paris"},
    "steps": [
        {
            "id": "learn",
            "tool": "memory.put",
            "args": {
                "namespace": "facts.geo",
                "key": "${inputs.key}",
                "value": {"city": "Paris", "country": "France"},
                "text": "Paris is the capital of France",
            },
        },
        {
            "id": "note",
            "tool": "memory.put",
            "args": {"namespace": "facts.geo", "value": "Berlin is the capital of Germany"},
        },
        {
            "id": "read",
            "tool": "memory.get",
            "args": {"namespace": "facts.geo", "key": "${steps.learn.output.key}"},
            "after": ["learn"],
        },
        {
            "id": "find",
            "tool": "memory.search",
            "args": {"namespace": "facts.geo", "query": "capital of France", "k": 2},
            "after": ["learn", "note"],
        },
    ],
    "outputs": {
        "learn": "${steps.learn.output}",
        "note": "${steps.note.output}",
        "read": "${steps.read.output}",
        "find": "${steps.find.output}",
        "city": "${steps.read.output.item.value.city}",
        "best": "${steps.find.output.items[0].key}",
    },
}


def _error(state: Any, step: str) -> dict[str, Any]:
    return state.error.fields["steps"][step]["error"]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_plan_puts_then_gets_and_searches_through_references(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("pg_schema_url") if backend == "postgres" else None
    run_id, state = run_plan(tmp_path, FACTS, **({"database_url": url} if url else {}))
    assert state.status == "succeeded", state.error
    out = state.result["outputs"]
    assert out["city"] == "Paris"
    assert out["best"] == "paris"  # the France fact ranks first for its own words
    tools.MemoryPutOutput.model_validate(out["learn"])
    tools.MemoryPutOutput.model_validate(out["note"])
    tools.MemoryGetOutput.model_validate(out["read"])
    tools.MemorySearchOutput.model_validate(out["find"])
    assert out["learn"]["op"] == f"{run_id}/learn/0"
    assert (out["learn"]["version"], out["learn"]["created"]) == (1, True)
    assert out["read"]["found"] is True
    assert out["read"]["item"]["run_id"] == run_id
    assert out["read"]["item"]["step_id"] == "learn"
    # as_of: the store's seq the read stood at (after the write it read)
    assert out["read"]["as_of"] >= out["learn"]["store_seq"]
    assert out["find"]["as_of"] >= max(out["learn"]["store_seq"], out["note"]["store_seq"])
    assert len(out["find"]["items"]) == 2
    store = open_store(tmp_path, url)
    try:
        made = out["note"]["key"]  # no key given: one made from the op
        assert store.get("facts.geo", made)["value"] == "Berlin is the capital of Germany"
        history = store.history("facts.geo", "paris")
        assert [(h["version"], h["op"], h["step_id"]) for h in history] == [
            (1, f"{run_id}/learn/0", "learn")
        ]
    finally:
        store.close()


def test_links_neighbours_and_a_delete(tmp_path: Path) -> None:
    plan = {
        "name": "graph",
        "steps": [
            {
                "id": "a",
                "tool": "memory.put",
                "args": {"namespace": "people", "key": "ann", "value": "Ann"},
            },
            {
                "id": "b",
                "tool": "memory.put",
                "args": {"namespace": "people", "key": "bob", "value": "Bob"},
            },
            {
                "id": "knows",
                "tool": "memory.link",
                "args": {
                    "subject": {"namespace": "people", "key": "ann"},
                    "relation": "knows",
                    "object": {"namespace": "people", "key": "bob"},
                    "props": {"since": 2020},
                },
                "after": ["a", "b"],
            },
            {
                "id": "near",
                "tool": "memory.neighbors",
                "args": {"namespace": "people", "key": "ann"},
                "after": ["knows"],
            },
            {
                "id": "forget",
                "tool": "memory.delete",
                "args": {"namespace": "people", "key": "bob"},
                "after": ["near"],
            },
            {
                "id": "gone",
                "tool": "memory.get",
                "args": {"namespace": "people", "key": "bob"},
                "after": ["forget"],
            },
        ],
        "outputs": {s: f"${{steps.{s}.output}}" for s in ("knows", "near", "forget", "gone")},
    }
    run_id, state = run_plan(tmp_path, plan)
    assert state.status == "succeeded", state.error
    out = state.result["outputs"]
    tools.MemoryLinkOutput.model_validate(out["knows"])
    tools.MemoryNeighborsOutput.model_validate(out["near"])
    tools.MemoryDeleteOutput.model_validate(out["forget"])
    assert out["knows"]["op"] == f"{run_id}/knows/0"
    near = out["near"]["items"]
    assert [(n["key"], n["relation"], n["direction"], n["depth"]) for n in near] == [
        ("bob", "knows", "out", 1)
    ]
    assert near[0]["value"] == "Bob"
    assert out["forget"]["deleted"] is True
    assert out["gone"] == {"found": False, "item": None, "as_of": out["gone"]["as_of"]}
    assert out["gone"]["as_of"] >= out["forget"]["store_seq"]


def test_a_bad_namespace_is_refused_at_submission_naming_the_field(tmp_path: Path) -> None:
    engine = build(settings_for(tmp_path), enabled_tools=ALL_TOOLS)
    with engine.runtime, pytest.raises(PlanError) as info:
        engine.prepare_plan(
            {
                "name": "bad",
                "steps": [
                    {
                        "id": "p",
                        "tool": "memory.put",
                        "args": {"namespace": "no spaces", "value": 1},
                    }
                ],
            }
        )
    assert [e["loc"] for e in info.value.errors] == ["steps[0].args.namespace"]


def test_refusals_when_the_step_runs_name_the_field_and_write_nothing(tmp_path: Path) -> None:
    plan = {
        "name": "refused",
        "inputs": {"ns": "ok.ns"},
        "steps": [
            {"id": "ns", "tool": "memory.put", "args": {"namespace": "${inputs.ns}", "value": 1}},
            # the store's own bounds: "search" is a key the HTTP route keeps for itself
            {
                "id": "key",
                "tool": "memory.put",
                "args": {"namespace": "ok.ns", "key": "search", "value": 1},
            },
            {
                "id": "big",
                "tool": "memory.put",
                "args": {"namespace": "ok.ns", "key": "big", "value": "x" * (70 * 1024)},
            },
        ],
    }
    _, state = run_plan(tmp_path, plan, {"ns": "not a namespace"})
    assert state.status == "failed"
    ns = _error(state, "ns")
    assert ns["code"] == "plan.args"
    assert ns["message"].startswith("args.namespace:")
    key = _error(state, "key")
    assert (key["code"], key["field"]) == ("memory.invalid", "key")
    big = _error(state, "big")
    assert (big["code"], big["field"]) == ("memory.invalid", "value")
    store = open_store(tmp_path)
    try:
        assert store.items("ok.ns")["items"] == []
    finally:
        store.close()


def test_an_engine_without_a_store_fails_the_step_memory_unavailable(tmp_path: Path) -> None:
    engine = build(settings_for(tmp_path), enabled_tools=ALL_TOOLS)
    engine.env.memory = None  # as a replay's engine pieces have it
    plan = {
        "name": "none",
        "steps": [{"id": "g", "tool": "memory.get", "args": {"namespace": "a", "key": "b"}}],
    }
    with engine.runtime as rt:
        run_id = engine.submit_plan(plan)
        rt.run()
        state = rt.status(run_id)
    assert state.status == "failed"
    assert _error(state, "g")["code"] == "memory.unavailable"


def test_the_store_opens_on_its_own_thread_at_the_first_memory_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tiffany.memory

    opened: list[str] = []
    real = tiffany.memory.MemoryStore.from_settings

    def watched(*args: Any, **kw: Any) -> Any:
        opened.append(threading.current_thread().name)
        return real(*args, **kw)

    monkeypatch.setattr(tiffany.memory.MemoryStore, "from_settings", staticmethod(watched))
    engine = build(settings_for(tmp_path), enabled_tools=ALL_TOOLS)
    with engine.runtime as rt:
        assert opened == []  # build opens nothing
        sleepy = {"name": "s", "steps": [{"id": "z", "tool": "sleep", "args": {"seconds": 0}}]}
        engine.submit_plan(sleepy)
        rt.run()
        assert opened == []  # a run without memory steps opens nothing
        run_id = engine.submit_plan(FACTS)
        rt.run()
        assert rt.status(run_id).status == "succeeded"
    assert opened == ["tiffany-memory-open"]  # once, off the loop's (main) thread


def test_a_writes_op_is_its_steps_place_never_its_attempt(tmp_path: Path) -> None:
    ctx = ToolContext("run-1", "learn", 1, tmp_path)
    assert tools.write_op(ctx) == "run-1/learn/0"
    assert tools.write_op(replace(ctx, attempt=3)) == "run-1/learn/0"  # a retry: the same write
    called = replace(ctx, call=2)  # an agent's second tool call
    assert tools.write_op(called) == "run-1/learn/2"
    # an agent's later attempt is a new conversation: its calls are writes of their own
    assert tools.write_op(replace(called, attempt=2)) == "run-1/learn/2@2"


def test_the_store_closes_with_the_runtime(tmp_path: Path) -> None:
    engine = build(settings_for(tmp_path), enabled_tools=ALL_TOOLS)
    memory = engine.env.memory
    with engine.runtime as rt:
        run_id = engine.submit_plan(FACTS)
        rt.run()
        assert rt.status(run_id).status == "succeeded"
        assert memory.seq() >= 2
    with pytest.raises(tools.MemoryUnavailable, match="stopping"):
        memory.get("facts.geo", "paris")


def test_an_agents_memory_needs_the_memory_tools_enabled(tmp_path: Path) -> None:
    enabled = [t for t in ALL_TOOLS if t != "memory.search"]
    engine = build(settings_for(tmp_path), enabled_tools=enabled)
    step = {"id": "chat", "tool": "agent", "args": {"goal": "hi", "memory": {"namespace": "u"}}}
    with engine.runtime, pytest.raises(PlanError) as info:
        engine.prepare_plan({"name": "a", "steps": [step]})
    (error,) = info.value.errors
    assert error["loc"] == "steps[0].args.memory"
    assert "--enable-tool memory.search" in error["msg"]


def test_an_opening_that_failed_is_tried_again_by_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tiffany.memory

    real = tiffany.memory.MemoryStore.from_settings
    tries: list[int] = []

    def flaky(*args: Any, **kw: Any) -> Any:
        tries.append(1)
        if len(tries) == 1:
            raise OSError("the database is not there yet")
        return real(*args, **kw)

    monkeypatch.setattr(tiffany.memory.MemoryStore, "from_settings", staticmethod(flaky))
    plan = {
        "name": "retry",
        "steps": [
            {
                "id": "p",
                "tool": "memory.put",
                "args": {"namespace": "n", "key": "k", "value": 1},
                "retries": 1,
                "backoff": 0.01,
            }
        ],
        "outputs": {"p": "${steps.p.output}"},
    }
    engine = build(settings_for(tmp_path), enabled_tools=ALL_TOOLS)
    with engine.runtime as rt:
        run_id = engine.submit_plan(plan)
        rt.run()
        state = rt.status(run_id)
    assert state.status == "succeeded", state.error
    assert len(tries) == 2
    assert state.result["outputs"]["p"]["version"] == 1


def test_a_full_namespace_refuses_the_put_naming_the_setting(tmp_path: Path) -> None:
    steps = [
        {
            "id": f"p{i}",
            "tool": "memory.put",
            "args": {"namespace": "small", "key": f"k{i}", "value": i},
        }
        for i in range(3)
    ]
    for i in (1, 2):
        steps[i]["after"] = [f"p{i - 1}"]
    _, state = run_plan(tmp_path, {"name": "full", "steps": steps}, memory_max_items=2)
    assert state.status == "failed"
    error = _error(state, "p2")
    assert (error["code"], error["field"]) == ("memory.full", "namespace")
    assert [s for s, v in state.error.fields["steps"].items() if v["status"] == "succeeded"] == [
        "p0",
        "p1",
    ]


def test_the_tools_bounds_are_the_stores() -> None:
    from tiffany.memory import limits

    assert f"^{limits.NAMESPACE_RE.pattern}$" == tools.NAMESPACE_PATTERN
    assert f"^{limits.RELATION_RE.pattern}$" == tools.RELATION_PATTERN
    assert tools.MAX_KEY_CHARS == limits.KEY_MAX_CHARS
    assert tools.MAX_TEXT_CHARS == limits.TEXT_MAX_BYTES
    assert tools.MAX_QUERY_CHARS == limits.QUERY_MAX_CHARS
    assert tools.MAX_TTL_S == limits.TTL_MAX_S
    assert tools.MAX_K == limits.K_MAX
    assert tools.MAX_DEPTH == limits.MAX_DEPTH
    assert tools.MAX_NEIGHBORS == limits.LIMIT_MAX
