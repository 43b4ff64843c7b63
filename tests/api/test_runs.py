"""``/api/runs`` and the system routes against a real engine process (no mocks).

The module's engine (``tiffany engine`` in a subprocess) runs the plans; the
app reads the SQL store the engine projects into and talks to it over the
control socket, as in ``tiffany serve``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from api_support import LONG_PLAN, SLEEP_PLAN, make_settings, read_your_writes, wait_until
from fastapi.testclient import TestClient
from process_support import projector_pid
from prometheus_client.parser import text_string_to_metric_families

from tiffany.api import create_app
from tiffany.ports import reads as store_reads
from tiffany.store.migrate import upgrade_url


@pytest.fixture(scope="module")
def client(engine) -> Iterator[TestClient]:
    app = create_app(make_settings(engine.data_dir, max_plan_bytes=64 * 1024))
    with TestClient(app) as c:
        yield c


def _finished(
    client: TestClient, run_id: str, min_seq: int = 0, timeout: float = 20.0
) -> dict[str, Any]:
    """Wait for a run to end (its submission is read back exactly with ``min_seq``; its end
    is a matter of time)."""

    def done() -> dict[str, Any] | None:
        detail = client.get(f"/api/runs/{run_id}", params={"min_seq": min_seq}).json()
        return detail if detail["status"] not in ("pending", "running") else None

    result: dict[str, Any] = wait_until(done, timeout, every=0.05)
    return result


def _submit(client: TestClient, plan: dict[str, Any], **kw: Any) -> httpx.Response:
    """Submit and read the run back at once (``min_seq``): later reads never 404."""
    r = client.post("/api/runs", json={"plan": plan, "inputs": kw.pop("inputs", {})}, **kw)
    if r.status_code in (200, 201):
        back = client.get(r.headers["location"])
        assert back.status_code == 200, back.text
    return r


def test_a_submitted_run_is_there_at_once_and_succeeds(client) -> None:
    r = client.post("/api/runs", json={"plan": SLEEP_PLAN})
    assert r.status_code == 201, r.text
    run_id, seq = r.json()["run_id"], r.json()["seq"]
    assert r.json()["created"] is True
    assert r.headers["location"] == f"/api/runs/{run_id}?min_seq={seq}"
    # no sleep, no retry: the read waits until the store has projected the run's seq
    first = client.get(f"/api/runs/{run_id}", params={"min_seq": seq})
    assert first.status_code == 200
    assert first.json()["run_id"] == run_id
    assert first.json()["last_seq"] >= seq
    events = client.get(f"/api/runs/{run_id}/events", params={"min_seq": seq}).json()
    assert events["records"][0] == {**events["records"][0], "seq": seq, "type": "RUN_START"}
    detail = _finished(client, run_id)
    assert detail["status"] == "succeeded"
    assert detail["name"] == "nap"
    assert [s["step_id"] for s in detail["steps"]] == ["nap"]
    assert detail["steps"][0]["status"] == "succeeded"
    assert detail["tasks"][0]["ltid"] == 1
    listed = client.get("/api/runs").json()
    assert listed["runs"][0]["run_id"] == run_id
    assert listed["counts"]["succeeded"] >= 1


def _timing(response: httpx.Response) -> dict[str, float]:
    """The ``Server-Timing`` header as ``{part: ms}``."""
    parts = {}
    for entry in response.headers["server-timing"].split(","):
        name, _, dur = entry.strip().partition(";dur=")
        parts[name] = float(dur)
    return parts


#: A run whose result is ~40 KB (a file written from its input, read back, declared its output).
BIG_PLAN = {
    "name": "big",
    "inputs": {"text": "x"},
    "outputs": {"text": "${steps.read.output.content}"},
    "steps": [
        {
            "id": "write",
            "tool": "file.write",
            "args": {"path": "a.txt", "content": "${inputs.text}"},
        },
        {"id": "read", "tool": "file.read", "args": {"path": "a.txt"}, "after": ["write"]},
    ],
}


def test_a_run_read_without_outputs_leaves_them_out_and_says_their_sizes(client) -> None:
    text = "y" * 40_000
    r = _submit(client, BIG_PLAN, inputs={"text": text})
    run_id = r.json()["run_id"]
    full = _finished(client, run_id)
    assert full["status"] == "succeeded", full
    assert full["outputs"] == {"text": text}
    whole = client.get(f"/api/runs/{run_id}")
    lean = client.get(f"/api/runs/{run_id}", params={"outputs": "false"})
    assert lean.status_code == 200
    # The result is four times in a full read (run outputs, planner result, step
    # output, worker result); the lean one still has the input (entry and inputs).
    assert len(whole.content) - len(lean.content) > 4 * len(text)
    got = lean.json()
    assert got["outputs"] is None
    assert got["outputs_size"] == len(json.dumps({"text": text}, separators=(",", ":")))
    read = next(s for s in got["steps"] if s["step_id"] == "read")
    assert read["output"] is None
    assert read["output_size"] >= len(text)
    assert all(t["result"] is None for t in got["tasks"])
    assert any((t["result_size"] or 0) >= len(text) for t in got["tasks"])
    # Everything else is the full read's.
    same = {k: v for k, v in full.items() if k not in ("outputs", "steps", "tasks")}
    assert {k: got[k] for k in same} == same
    assert [s["status"] for s in got["steps"]] == [s["status"] for s in full["steps"]]
    assert "outputs_size" not in whole.json()


def test_server_timing_says_where_a_submission_and_its_read_spent_their_time(client) -> None:
    r = client.post("/api/runs", json={"plan": SLEEP_PLAN})
    assert r.status_code == 201, r.text
    posted = _timing(r)
    assert set(posted) == {"parse", "engine", "app"}
    assert 0 < posted["engine"] <= posted["app"]
    read = client.get(r.headers["location"])
    got = _timing(read)
    # A SQLite store's run is read on the event loop: no wait for a thread.
    assert set(got) == {"projected", "store", "app"}
    assert 0 < got["projected"] + got["store"] <= got["app"]
    missing = client.get("/api/runs/run-000000000000")
    assert missing.status_code == 404
    assert set(_timing(missing)) == {"store", "app"}
    listed = client.get("/api/runs", params={"limit": 1})
    assert set(_timing(listed)) == {"queue", "store", "app"}  # a list: the threadpool's
    assert set(_timing(client.get("/healthz"))) == {"app"}


def test_a_run_too_large_for_the_loop_is_read_in_the_threadpool_alike(client, monkeypatch) -> None:
    r = _submit(client, SLEEP_PLAN)
    run_id = r.json()["run_id"]
    done = _finished(client, run_id)
    on_loop = client.get(f"/api/runs/{run_id}")
    assert "queue" not in _timing(on_loop)
    monkeypatch.setattr(store_reads, "LOOP_READ_DISPATCHES", done["dispatches"] - 1)
    threaded = client.get(f"/api/runs/{run_id}")
    assert "queue" in _timing(threaded)
    assert threaded.json() == on_loop.json() == done


def test_a_store_locked_for_the_loop_is_read_in_the_threadpool_while_the_loop_serves(
    api_dir,
) -> None:
    settings = make_settings(api_dir)
    upgrade_url(settings.database_url)  # the store's schema, as an engine makes it
    # Another process's exclusive lock (SQLite's EXCLUSIVE locking mode, taken
    # before any other connection opened the file): every reader meets it,
    # in WAL mode too, until that connection closes.
    holder = sqlite3.connect(api_dir / "tiffany.db", isolation_level=None)
    answers: dict[str, httpx.Response] = {}
    with TestClient(create_app(settings)) as client:
        try:
            holder.execute("PRAGMA locking_mode=EXCLUSIVE")
            holder.execute("BEGIN EXCLUSIVE")
            holder.execute("UPDATE runs SET name = name WHERE 0")
            reader = threading.Thread(
                target=lambda: answers.update(run=client.get("/api/runs/run-000000000000"))
            )
            reader.start()
            time.sleep(0.2)  # the read met the lock (10 ms on the loop) and waits in a thread
            started = time.monotonic()
            assert client.get("/healthz").status_code == 200
            # The loop answered at once, not after the store's 5 s busy timeout.
            assert time.monotonic() - started < 2.0
            assert reader.is_alive()  # still waiting on the lock
            assert "run" not in answers
        finally:
            holder.close()
        reader.join(10)
    got = answers["run"]
    assert got.status_code == 404, got.text  # read once the lock went: no such run
    assert "queue" in _timing(got)


def test_the_bare_plan_and_yaml_are_accepted(client) -> None:
    bare = client.post("/api/runs", json=SLEEP_PLAN)
    assert bare.status_code == 201, bare.text
    yaml_body = (
        "plan:\n  name: yaml-nap\n  steps:\n"
        "    - {id: nap, tool: sleep, args: {seconds: 0.01}}\ninputs: {}\n"
    )
    r = client.post("/api/runs", content=yaml_body, headers={"content-type": "application/yaml"})
    assert r.status_code == 201, r.text
    assert _finished(client, r.json()["run_id"], r.json()["seq"])["name"] == "yaml-nap"


def test_an_invalid_plan_is_a_422_naming_the_field(client) -> None:
    plan = {"name": "bad", "steps": [{"id": "a", "tool": "no-such-tool"}]}
    r = _submit(client, plan)
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "plan.invalid"
    assert body["detail"][0]["loc"] == ["steps", 0, "tool"]
    assert "no-such-tool" in body["detail"][0]["msg"]


def test_the_built_in_workflow_plan_is_submitted_as_a_plan_not_by_name(client) -> None:
    # A plan run is the built-in workflow ``plan``; one way submits it (its entry holds the plan).
    body = {"workflow": "plan", "inputs": {"plan": SLEEP_PLAN, "inputs": {}}}
    r = client.post("/api/runs", json=body)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["detail"][0]["loc"] == ["workflow"]
    assert '{"plan": DOCUMENT' in problem["message"]


def test_a_bad_step_id_is_a_422_listing_the_plans_other_problems_too(client) -> None:
    plan = {
        "name": "bad",
        "steps": [
            {"id": "../x", "tool": "sleep", "args": {"seconds": 0}},
            {"id": "b", "tool": "no-such-tool", "after": ["zzz"]},
        ],
    }
    r = _submit(client, plan)
    assert r.status_code == 422, r.text
    locs = [d["loc"] for d in r.json()["detail"]]
    assert locs == [["steps", 0, "id"], ["steps", 1, "tool"], ["steps", 1, "after", 0]]


def test_malformed_json_is_a_422_naming_the_offset(client) -> None:
    raw = '{"plan": {"name": "é", "steps": [}'.encode()
    r = client.post("/api/runs", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "request.invalid"
    offset = raw.index(b"}")  # bytes, not characters: "é" is two
    assert body["detail"][0]["offset"] == offset
    assert f"byte {offset}" in body["message"]


def test_a_body_over_the_cap_is_413(client) -> None:
    big = {"plan": {**SLEEP_PLAN, "pad": "x" * 70_000}}
    r = client.post("/api/runs", json=big)
    assert r.status_code == 413
    assert r.json()["code"] == "request.too_large"
    assert r.json()["limit_bytes"] == 64 * 1024

    def chunks() -> Iterator[bytes]:
        yield b'{"plan": {"pad": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}}'

    chunked = client.post("/api/runs", content=chunks())
    assert chunked.status_code == 413


def test_the_idempotency_key_names_the_first_submission(client) -> None:
    key = f"k-{time.monotonic_ns()}"
    first = _submit(client, SLEEP_PLAN, headers={"Idempotency-Key": key})
    again = _submit(client, SLEEP_PLAN, headers={"Idempotency-Key": key})
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json() == {**first.json(), "created": False}  # the same run and seq
    other = _submit(client, LONG_PLAN, headers={"Idempotency-Key": key})
    assert other.status_code == 409
    assert other.json()["message"]


def test_cancel_202_then_409_and_404(client) -> None:
    run_id = _submit(client, LONG_PLAN).json()["run_id"]
    wait_until(lambda: client.get(f"/api/runs/{run_id}").json()["status"] == "running")
    r = client.post(f"/api/runs/{run_id}/cancel")
    assert r.status_code == 202
    assert r.json() == {"run_id": run_id, "status": "cancelling"}
    assert _finished(client, run_id)["status"] == "cancelled"
    again = client.post(f"/api/runs/{run_id}/cancel")
    assert again.status_code == 409
    assert again.json()["code"] == "run.conflict"
    missing = client.post("/api/runs/run-nope/cancel")
    assert missing.status_code == 404
    assert missing.json()["code"] == "run.not_found"


def test_unknown_runs_are_404_with_a_message(client) -> None:
    for path in ("/api/runs/run-nope", "/api/runs/run-nope/events"):
        started = time.monotonic()
        r = client.get(path)
        assert r.status_code == 404
        assert "run-nope" in r.json()["message"]
        assert time.monotonic() - started < 1.0  # without min_seq nothing is waited for
        assert client.get(path, params={"min_seq": -1}).status_code == 422


def test_reads_with_min_seq_never_404_right_after_the_201(client) -> None:
    assert read_your_writes(client, 200) == [200] * 200


def test_concurrent_reads_each_answer_once_their_seq_is_projected(engine, live_api_factory) -> None:
    """50 clients at once, over real TCP: each reads its own run back with its seq."""
    live = live_api_factory(make_settings(engine.data_dir))

    async def one(c: httpx.AsyncClient) -> int:
        answer = (await c.post("/api/runs", json={"plan": SLEEP_PLAN})).json()
        got = await c.get(f"/api/runs/{answer['run_id']}", params={"min_seq": answer["seq"]})
        assert got.status_code != 200 or got.json()["last_seq"] >= answer["seq"]
        return got.status_code

    async def main() -> list[int]:
        async with httpx.AsyncClient(base_url=live.base, timeout=30) as c:
            return list(await asyncio.gather(*(one(c) for _ in range(50))))

    assert asyncio.run(main()) == [200] * 50


def test_a_seq_the_store_does_not_reach_is_a_503_naming_where_it_is(
    client, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiffany.api import deps

    monkeypatch.setattr(deps, "MIN_SEQ_WAIT_S", 0.2)
    projector = projector_pid(engine.proc.pid)
    os.kill(projector, signal.SIGSTOP)  # the store stops moving; the journal does not
    try:
        answer = client.post("/api/runs", json={"plan": SLEEP_PLAN, "inputs": {}})
        assert answer.status_code == 201, answer.text  # journaled: the engine answers
        seq = answer.json()["seq"]
        started = time.monotonic()
        r = client.get("/api/runs", params={"min_seq": seq})
        assert time.monotonic() - started < 5.0
    finally:
        os.kill(projector, signal.SIGCONT)
    assert r.status_code == 503
    assert r.headers["retry-after"]
    body = r.json()
    assert body["code"] == "store.behind"
    assert body["min_seq"] == seq
    assert body["store_seq"] < seq
    assert str(body["store_seq"]) in body["message"]
    assert client.get("/api/runs", params={"min_seq": seq}).status_code == 200  # moving again


def test_a_seq_the_journal_never_wrote_is_a_422_naming_min_seq(client) -> None:
    seq = _submit(client, SLEEP_PLAN).json()["seq"]
    for path in ("/api/runs", "/api/runs/run-0123456789ab"):
        started = time.monotonic()
        r = client.get(path, params={"min_seq": seq + 10**9})
        assert time.monotonic() - started < 2.0  # refused at once, not after the wait
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["min_seq"] == seq + 10**9
        assert seq <= body["written_seq"] < seq + 10**9
        assert "min_seq" in body["message"]
        assert body["detail"][0]["loc"] == ["query", "min_seq"]


def test_events_page_through_the_journal(client) -> None:
    run_id = _submit(client, SLEEP_PLAN).json()["run_id"]
    _finished(client, run_id)
    everything = client.get(f"/api/runs/{run_id}/events", params={"limit": 1000}).json()
    records = everything["records"]
    assert records[0]["type"] == "RUN_START"
    assert records[-1]["type"] == "RUN_END"
    assert everything["next_after"] is None
    seqs = [r["seq"] for r in records]
    assert seqs == sorted(seqs)
    paged: list[int] = []
    after = 0
    while True:
        page = client.get(f"/api/runs/{run_id}/events", params={"after": after, "limit": 3})
        body = page.json()
        assert len(body["records"]) <= 3
        paged += [r["seq"] for r in body["records"]]
        if body["next_after"] is None:
            break
        after = body["next_after"]
    assert paged == seqs
    assert client.get(f"/api/runs/{run_id}/events", params={"limit": 0}).status_code == 422


def test_runs_list_pages_newest_first_and_filters(client) -> None:
    ids = [_submit(client, SLEEP_PLAN).json()["run_id"] for _ in range(3)]
    for run_id in ids:
        _finished(client, run_id)
    page = client.get("/api/runs", params={"limit": 2}).json()
    assert [r["run_id"] for r in page["runs"]] == ids[::-1][:2]
    nxt = client.get("/api/runs", params={"limit": 2, "before": page["next_before"]}).json()
    assert nxt["runs"][0]["run_id"] == ids[0]
    assert all(r["run_no"] < page["next_before"] for r in nxt["runs"])
    ok = client.get("/api/runs", params={"status": "succeeded", "limit": 500}).json()
    assert {r["status"] for r in ok["runs"]} == {"succeeded"}
    assert sum(ok["counts"].values()) >= 3
    bad = client.get("/api/runs", params={"status": "sleeping"})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["query", "status"]


def test_runs_list_filters_by_name_inputs_and_time(client) -> None:
    tag = f"Filt-{time.monotonic_ns()}"
    declared = {"ticket": "", "who": ""}
    named = {**SLEEP_PLAN, "name": f"{tag}-Report", "inputs": declared}
    other = {**SLEEP_PLAN, "name": f"{tag}-other", "inputs": declared}
    a = _submit(client, named, inputs={"ticket": "Ticket-42", "who": 'Zoë "the" admin'}).json()
    b = _submit(client, other, inputs={"ticket": "ticket-7"}).json()
    for r in (a, b):
        _finished(client, r["run_id"])

    def ids(**params: Any) -> list[str]:
        got = client.get("/api/runs", params={"limit": 500, **params})
        assert got.status_code == 200, got.text
        return [r["run_id"] for r in got.json()["runs"]]

    # name: a substring, any case; the counts follow the filter
    assert ids(name=f"{tag.lower()}-report") == [a["run_id"]]
    assert ids(name=tag) == [b["run_id"], a["run_id"]]
    counts = client.get("/api/runs", params={"name": tag}).json()["counts"]
    assert counts["succeeded"] == 2
    assert sum(counts.values()) == 2
    assert ids(name=tag, status="failed") == []
    # q: text in the inputs (keys or values), any case, quotes and non-ASCII included
    assert ids(name=tag, q="TICKET-42") == [a["run_id"]]
    assert ids(name=tag, q='zoë "the"') == [a["run_id"]]
    assert ids(name=tag, q="ticket") == [b["run_id"], a["run_id"]]
    assert ids(name=tag, q="50%") == []  # LIKE wildcards are text here
    # since / until: epoch seconds or ISO-8601 with a zone (none: UTC)
    created = client.get(f"/api/runs/{a['run_id']}").json()["created_at"]
    assert ids(name=tag, since=str(created - 1)) == [b["run_id"], a["run_id"]]
    assert ids(name=tag, since=str(created + 3600)) == []
    iso = datetime.fromtimestamp(created - 60, UTC).isoformat()
    assert ids(name=tag, since=iso) == [b["run_id"], a["run_id"]]
    assert ids(name=tag, until=iso) == []
    naive = datetime.fromtimestamp(created + 3600, UTC).replace(tzinfo=None).isoformat()
    assert ids(name=tag, until=naive) == [b["run_id"], a["run_id"]]
    assert ids(name=tag, since=iso.replace("+00:00", "Z")) == [b["run_id"], a["run_id"]]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "yesterday"}, "since"),
        ({"until": "2024-13-45"}, "until"),
        ({"since": "nan"}, "since"),
        ({"since": "1e300"}, "since"),
        ({"since": "2024-05-02", "until": "2024-05-01"}, "until"),
        ({"name": "x" * 201}, "name"),
        ({"q": "x" * 201}, "q"),
    ],
)
def test_runs_list_bad_filters_are_a_422_naming_the_parameter(client, params, field) -> None:
    r = client.get("/api/runs", params=params)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", field]
    # The declared 422 schema (FastAPI's ValidationError) requires a type: the fuzzer checks it.
    assert r.json()["detail"][0]["type"] in ("value_error", "string_too_long")


def test_verify_reports_an_identical_replay(client) -> None:
    run_id = _submit(client, SLEEP_PLAN).json()["run_id"]
    _finished(client, run_id)
    r = client.post(f"/api/runs/{run_id}/verify")
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True
    assert r.json()["run_id"] == run_id
    assert client.post("/api/runs/run-nope/verify").status_code == 404


def test_export_answers_the_runs_export_file(client, engine) -> None:
    from tiffany.durable.export import parse_export, verify_export
    from tiffany.engine import replay_resolvers

    run_id = _submit(client, SLEEP_PLAN).json()["run_id"]
    _finished(client, run_id)
    r = client.get(f"/api/runs/{run_id}/export")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/vnd.tiffany.run-export"
    assert r.headers["content-disposition"] == f'attachment; filename="{run_id}.tfx"'
    exported = parse_export(r.content)
    assert exported.meta.run_id == run_id
    assert exported.meta.status == "succeeded"
    report = verify_export(exported, replay_resolvers(make_settings(engine.data_dir)))
    assert report.ok, report.to_dict()
    assert client.get("/api/runs/run-nope/export").status_code == 404


def test_readyz_and_healthz(client) -> None:
    assert client.get("/healthz").json() == {"ok": True}
    ready = client.get("/readyz").json()
    assert (ready["ready"], ready["reason"]) == (True, None)
    assert ready["store"]["stalled"] is False


def test_metrics_parse(client) -> None:
    run_id = _submit(client, SLEEP_PLAN).json()["run_id"]
    _finished(client, run_id)
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples[("tiffany_engine_up", ())] == 1
    assert samples[("tiffany_runs", (("status", "succeeded"),))] >= 1
    assert samples[("tiffany_dispatches_total", ())] > 0
    assert samples[("tiffany_wal_commits_total", ())] > 0
    assert families["tiffany_wal_fsync_seconds"].type == "histogram"
    assert samples[("tiffany_wal_fsync_seconds_count", ())] > 0
    assert families["tiffany_loop_slow_dispatch_seconds"].type == "histogram"
    assert ("tiffany_loop_max_dispatch_seconds", ()) in samples
    assert samples[("tiffany_feed_subscribers", ())] >= 1  # the engine's: this API's relay
    assert ("tiffany_api_feed_subscribers", ()) in samples
    assert ("tiffany_api_feed_dropped_subscribers_total", ()) in samples
    assert ("tiffany_projector_last_seq", ()) in samples
    assert ("tiffany_projector_lag_records", ()) in samples
    assert ("tiffany_api_process_resident_memory_bytes", ()) in samples
    assert samples[("tiffany_api_feed_connected", ())] == 1
    assert ("tiffany_api_feed_upstream_cutoffs_total", ()) in samples


def test_the_activity_websocket_shows_a_run(client) -> None:
    with client.websocket_connect("/ws/activity") as ws:
        wait_until(lambda: len(client.app.state.tiffany.relay.subscribers) == 1)
        run_id = _submit(client, SLEEP_PLAN).json()["run_id"]
        kinds = []
        last = 0
        while "run.finished" not in kinds:
            frame = json.loads(ws.receive_text())
            if frame.get("run_id") != run_id:
                continue
            assert frame["seq"] > last
            last = frame["seq"]
            kinds.append(frame["kind"])
    assert "run.started" in kinds
    assert "spawned" in kinds


def test_the_dashboard_is_served(client) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert "text/html" in r.headers["content-type"]


def test_without_an_engine_commands_are_503_and_readyz_says_why(api_dir) -> None:
    app = create_app(make_settings(api_dir))
    with TestClient(app) as c:
        r = c.post("/api/runs", json={"plan": SLEEP_PLAN})
        assert r.status_code == 503
        assert r.headers["retry-after"]
        assert r.json()["code"] == "engine.unavailable"
        # the socket's path (the server's data dir) is for the API's log, not the client
        assert str(api_dir) not in r.text
        assert "control.sock" not in r.text
        ready = c.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {"ready": False, "reason": "engine unreachable"}
        assert c.get("/healthz").status_code == 200
        # no store yet either: the engine creates it
        runs = c.get("/api/runs")
        assert runs.status_code == 503
        assert runs.json()["code"] == "store.unavailable"
        metrics = c.get("/metrics")
        assert metrics.status_code == 200
        assert "tiffany_engine_up 0.0" in metrics.text


def test_413_is_answered_before_the_body_is_sent(engine, live_api_factory) -> None:
    live = live_api_factory(make_settings(engine.data_dir, max_plan_bytes=1024))
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000000\r\n\r\n"
        )  # and not one byte of the body
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
