"""What the dashboard's pages read, on ``tiffany serve`` with a scripted model.

* The plan's graph: each step of ``GET /api/runs/{id}`` says what it runs
  after, whether it is dynamic, and which dynamic step added it; a step that
  has not started is there too.
* An agent step's conversation (``GET /api/runs/{id}/steps/{step}/
  conversation``): each turn's text, tokens and cost, its tool calls with
  their arguments and results, from the journaled calls; a call refused
  (a tool the step was not given) is there, without a result.
* Schedules list their next ticks.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator

import httpx
import pytest
from api_support import (
    AGENT_PLAN,
    AGENT_SCRIPT,
    GRAPH_PLAN,
    finished_run,
    read_run,
    run_step,
    serve,
    short_dir,
    submit_plan,
)
from process_support import wait_for

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``tiffany serve`` whose ``llm`` and ``agent`` steps follow :data:`AGENT_SCRIPT`."""
    from process_support import terminate

    data_dir = short_dir("tfd-")
    script = data_dir / "script.yaml"
    script.write_text(AGENT_SCRIPT)
    proc, url = serve(data_dir, env_extra={"TIFFANY_LLM_SCRIPT": str(script)})
    try:
        yield url
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_the_run_detail_tells_each_steps_place_in_the_graph(server: str) -> None:
    created = submit_plan(server, GRAPH_PLAN)
    run_id = created["run_id"]

    def children_done() -> dict | None:
        run = read_run(server, run_id, created["seq"])
        ids = {s["step_id"]: s["status"] for s in run["steps"]}
        return run if ids.get("review") == "succeeded" else None

    run = wait_for(children_done, TIMEOUT_S, "the dynamic step's children")
    graph = {s["step_id"]: (s["after"], s["added_by"], s["dynamic"]) for s in run["steps"]}
    assert graph == {
        "think": ([], None, True),
        "gate": ([], None, False),
        "publish": (["gate", "think"], None, False),
        "draft": (["think"], "think", False),
        "review": (["draft", "think"], "think", False),
    }
    # Not started: it waits for gate, which waits for its signal.
    assert run_step(run, "publish")["status"] == "pending"
    assert run_step(run, "gate")["status"] == "running"
    sent = httpx.post(f"{server}/api/runs/{run_id}/signals/go", json={}, timeout=TIMEOUT_S)
    assert sent.status_code == 202, sent.text
    assert finished_run(server, run_id)["status"] == "succeeded"


def test_an_agent_steps_conversation_is_read_from_its_journaled_calls(server: str) -> None:
    created = submit_plan(server, AGENT_PLAN)
    run_id = created["run_id"]
    run = finished_run(server, run_id)
    assert run["status"] == "succeeded", run["error"]
    r = httpx.get(f"{server}/api/runs/{run_id}/steps/work/conversation", timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    talk = r.json()
    output = run_step(run, "work")["output"]
    assert talk["status"] == "succeeded"
    assert talk["args"]["goal"] == AGENT_PLAN["steps"][0]["args"]["goal"]  # the template
    assert (talk["answer"], talk["usage"]) == (output["answer"], output["usage"])
    turns = talk["turns"]
    assert [(t["attempt"], t["turn"], t["status"]) for t in turns] == [
        (1, 1, "succeeded"),
        (1, 2, "succeeded"),
        (1, 3, "succeeded"),
    ]
    assert [t["text"] for t in turns] == [
        "I will write the note first.",
        "Now I check what I wrote.",
        "The note is written and reads back as intended.",
    ]
    # Each turn's tokens; summed, the step's.
    total = sum(t["usage"]["total_tokens"] for t in turns)
    assert total == output["usage"]["total_tokens"]
    assert all(t["model"] == "scripted" and t["cost_usd"] == 0.0 for t in turns)
    write, (read, shell), none = (t["tool_calls"] for t in turns)
    assert none == []
    assert write[0]["tool"] == "file.write"
    assert write[0]["arguments"] == {
        "path": "notes.md",
        "content": "Tiffany journals every model and tool call.",
    }
    assert (write[0]["status"], write[0]["ok"]) == ("succeeded", True)
    assert write[0]["result"] == {"path": "notes.md", "bytes": 43}
    assert read["tool"] == "file.read"
    assert read["result"]["content"] == "Tiffany journals every model and tool call."
    # Refused (not one of the step's tools): no task ran it; the step's output says so.
    assert (shell["tool"], shell["ltid"], shell["ok"]) == ("shell", None, False)
    assert shell["arguments"] == {"argv": ["rm", "notes.md"]}
    assert shell["result"] is None
    # The tasks named are the run's.
    ltids = {t["ltid"] for t in run["tasks"]}
    assert {t["ltid"] for t in turns} | {write[0]["ltid"], read["ltid"]} <= ltids


def test_a_conversation_of_no_agent_step_is_refused_by_name(server: str) -> None:
    created = submit_plan(server, AGENT_PLAN)
    run_id = created["run_id"]
    finished_run(server, run_id)
    base = f"{server}/api/runs/{run_id}/steps"
    nope = httpx.get(f"{base}/nope/conversation", timeout=TIMEOUT_S)
    assert (nope.status_code, nope.json()["code"]) == (404, "step.not_found")
    unknown = httpx.get(f"{server}/api/runs/run-nope/steps/work/conversation", timeout=TIMEOUT_S)
    assert (unknown.status_code, unknown.json()["code"]) == (404, "run.not_found")
    nap = {"id": "a", "tool": "sleep", "args": {"seconds": 0}}
    one = submit_plan(server, {"name": "one", "steps": [nap]})["run_id"]
    finished_run(server, one)
    plain = httpx.get(f"{server}/api/runs/{one}/steps/a/conversation", timeout=TIMEOUT_S)
    assert plain.status_code == 422, plain.text
    assert plain.json()["code"] == "step.no_conversation"
    assert "sleep step" in plain.json()["message"]


def test_a_schedule_lists_its_next_ticks(server: str) -> None:
    body = {"plan": {"name": "s", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}}
    added = httpx.post(
        f"{server}/api/schedules", json={**body, "cron": "0 9 * * *"}, timeout=TIMEOUT_S
    )
    assert added.status_code == 201, added.text
    sid = added.json()["schedule_id"]
    try:
        row = httpx.get(f"{server}/api/schedules/{sid}", timeout=TIMEOUT_S).json()
        ticks = row["next_ticks"]
        assert len(ticks) == 5
        assert ticks[0] == row["next_tick"]
        assert [b - a for a, b in itertools.pairwise(ticks)] == [86_400.0] * 4
        listed = httpx.get(f"{server}/api/schedules", timeout=TIMEOUT_S).json()["schedules"]
        assert next(s for s in listed if s["schedule_id"] == sid)["next_ticks"] == ticks
        paused = httpx.post(f"{server}/api/schedules/{sid}/pause", timeout=TIMEOUT_S).json()
        assert (paused["next_tick"], paused["next_ticks"]) == (None, [])
    finally:
        httpx.delete(f"{server}/api/schedules/{sid}", timeout=TIMEOUT_S)
