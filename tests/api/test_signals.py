"""Signals over HTTP and the CLI, as users send them: ``tiffany serve``, kill -9, PostgreSQL.

* approval: a run waits in ``signal.wait``; the engine is killed -9 while it
  waits; ``serve`` restarts it; the signal sent after the restart finishes
  the run, which then replays identically;
* a signal sent before its step waits is kept for it; the same
  ``Idempotency-Key`` journals it once; a timeout fails the step after its
  retries; bad names, bodies and runs get 422, 413, 404 and 409;
* ``tiffany signal`` beside a running server;
* on the PostgreSQL journal, through an API replica with no engine socket
  (the request goes through ``engine_requests``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Any

import httpx
from api_support import (
    clean_env,
    finished_run,
    read_run,
    run_step,
    serve,
    short_dir,
    start_engine,
    submit_plan,
)
from process_support import terminate, wait_for

APPROVAL = {
    "name": "approval",
    "steps": [
        {"id": "draft", "tool": "file.write", "args": {"path": "draft.txt", "content": "v1"}},
        {
            "id": "approve",
            "tool": "signal.wait",
            "args": {"name": "approve", "timeout_s": 3600},
            "after": ["draft"],
        },
        {
            "id": "publish",
            "tool": "file.write",
            "args": {"path": "published.txt", "content": "${steps.approve.output.by}"},
            "after": ["approve"],
        },
    ],
}


def test_an_approval_waits_across_a_kill_9_and_the_signal_finishes_the_run(served) -> None:
    data_dir, url = served
    submitted = submit_plan(url, APPROVAL)
    run_id, seq = submitted["run_id"], submitted["seq"]
    waiting = wait_for(
        lambda: run_step(read_run(url, run_id, seq), "approve")["waiting"], 30, "the step to wait"
    )
    assert waiting == "signal approve"
    before = json.loads((data_dir / "serve.json").read_text())["engine_pid"]
    os.kill(before, signal.SIGKILL)
    wait_for(
        lambda: json.loads((data_dir / "serve.json").read_text())["engine_pid"] != before,
        30,
        "serve to restart the engine",
    )
    # The restarted engine holds the run, still waiting: the signal is journaled (202) ...
    seen: list[Any] = []

    def send() -> httpx.Response | None:
        r = httpx.post(f"{url}/api/runs/{run_id}/signals/approve", json={"by": "alice"}, timeout=30)
        seen.append((r.status_code, r.text[:200]))
        return None if r.status_code == 503 else r  # 503: the engine is starting again

    try:
        r = wait_for(send, 60, "the engine to take commands")
    except AssertionError as exc:  # say what the API answered, and what serve logged
        log = (data_dir / "serve.log").read_text(errors="replace")[-6000:]
        raise AssertionError(f"{exc}; answers: {seen[-5:]}; serve.log:\n{log}") from None
    assert r is not None, seen
    assert r.status_code == 202, r.text
    answer = r.json()
    assert answer["run_id"] == run_id
    assert answer["name"] == "approve"
    # ... and a read with its seq sees it (no sleep): the step no longer waits.
    assert run_step(read_run(url, run_id, answer["seq"]), "approve")["waiting"] is None
    run = finished_run(url, run_id)
    assert run["status"] == "succeeded"
    assert run_step(run, "approve")["output"] == {"by": "alice"}
    assert (data_dir / "workspaces" / run_id / "published.txt").read_text() == "alice"
    r = httpx.post(f"{url}/api/runs/{run_id}/signals/approve", json=1, timeout=30)
    assert r.status_code == 409, r.text
    verdict = httpx.post(f"{url}/api/runs/{run_id}/verify", timeout=120).json()
    assert verdict["identical"], verdict


def test_a_signal_sent_again_after_it_finished_its_run_gets_the_first_answer(served) -> None:
    """A client that lost the 202 and sends the signal again, same key, is told it was delivered.

    The signal finishes the run at once: the retry meets a finished run. It
    gets the first delivery's seq (202), not a 409; another signal, or the
    same key on another name, still gets the 409.
    """
    _, url = served
    submitted = submit_plan(url, APPROVAL)
    run_id, seq = submitted["run_id"], submitted["seq"]
    wait_for(lambda: run_step(read_run(url, run_id, seq), "approve")["waiting"], 30, "the wait")
    base = f"{url}/api/runs/{run_id}/signals"
    key = {"Idempotency-Key": "approve-once"}
    first = httpx.post(f"{base}/approve", json={"by": "ada"}, headers=key, timeout=30)
    assert first.status_code == 202, first.text
    assert finished_run(url, run_id)["status"] == "succeeded"
    again = httpx.post(f"{base}/approve", json={"by": "ada"}, headers=key, timeout=30)
    assert again.status_code == 202, again.text
    assert again.json() == first.json()
    other = httpx.post(f"{base}/approve", json={"by": "ada"}, timeout=30)
    assert other.status_code == 409, other.text
    renamed = httpx.post(f"{base}/reject", json={"by": "ada"}, headers=key, timeout=30)
    assert renamed.status_code == 409, renamed.text


def test_a_signal_before_its_wait_is_kept_a_key_journals_it_once_and_a_timeout_fails(
    served,
) -> None:
    _, url = served
    plan = {
        "name": "early",
        "steps": [
            # Held until the test says so (not a sleep: under load any
            # duration can pass before the read below).
            {"id": "first", "tool": "signal.wait", "args": {"name": "start"}},
            {"id": "approve", "tool": "signal.wait", "args": {"name": "go"}, "after": ["first"]},
            {
                "id": "late",
                "tool": "signal.wait",
                "args": {"name": "never", "timeout_s": 0.2},
                "retries": 1,
                "backoff": 0.05,
                "after": ["first"],
            },
        ],
    }
    run_id = submit_plan(url, plan)["run_id"]
    answers = [
        httpx.post(
            f"{url}/api/runs/{run_id}/signals/go",
            json=[1, "two"],
            headers={"Idempotency-Key": "approve-once"},
            timeout=30,
        )
        for _ in range(2)
    ]
    assert [a.status_code for a in answers] == [202, 202]
    assert answers[0].json() == answers[1].json()
    assert answers[0].json()["signal_id"] == "approve-once"
    assert (
        run_step(read_run(url, run_id, answers[0].json()["seq"]), "approve")["status"] == "pending"
    )
    start = httpx.post(f"{url}/api/runs/{run_id}/signals/start", json=None, timeout=30)
    assert start.status_code == 202, start.text
    run = finished_run(url, run_id)
    assert run["status"] == "failed"
    assert run_step(run, "approve")["output"] == [1, "two"]
    late = run_step(run, "late")
    assert late["status"] == "failed"
    assert late["error"]["code"] == "signal.timeout"
    assert len(late["attempts"]) == 2
    records = httpx.get(f"{url}/api/runs/{run_id}/events", params={"limit": 1000}).json()
    signals = [r for r in records["records"] if r["type"] == "WAKE" and r["ltid"] == 0]
    assert [s["data"]["value"][0] for s in signals] == ["go", "start"]  # go once, for two requests
    verdict = httpx.post(f"{url}/api/runs/{run_id}/verify", timeout=120).json()
    assert verdict["identical"], verdict


def test_bad_signals_are_refused_naming_what_is_wrong(served) -> None:
    _, url = served
    submitted = submit_plan(url, APPROVAL)
    run_id, seq = submitted["run_id"], submitted["seq"]
    base = f"{url}/api/runs/{run_id}/signals"
    r = httpx.post(f"{base}/bad%20name", json=1)
    assert (r.status_code, r.json()["detail"][0]["loc"]) == (422, ["path", "name"])
    r = httpx.post(f"{base}/approve", content=b'{"by": [1,', headers={"content-type": "x"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["offset"] == 10
    r = httpx.post(f"{base}/approve", content=b"[" + b"1," * 200_000 + b"1]")
    assert r.status_code == 413
    assert httpx.post(f"{url}/api/runs/no-such-run/signals/approve", json=1).status_code == 404
    # Nothing of that reached the run: it still waits.
    assert wait_for(
        lambda: run_step(read_run(url, run_id, seq), "approve")["waiting"], 30, "the wait"
    )
    assert httpx.post(f"{base}/approve", json={"by": "bob"}).status_code == 202
    assert finished_run(url, run_id)["status"] == "succeeded"


def test_the_cli_signals_a_run_beside_the_running_server(served) -> None:
    data_dir, url = served
    run_id = submit_plan(url, APPROVAL)["run_id"]
    cli = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "signal", run_id]
    bad = subprocess.run([*cli, "approve", "--data", "{oops"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "--data: malformed JSON at byte 1" in bad.stderr
    ok = subprocess.run(
        [*cli, "approve", "--data", '{"by": "carol"}', "--id", "cli-1"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert f"run {run_id}: signal approve journaled (seq " in ok.stdout
    run = finished_run(url, run_id)
    assert run_step(run, "approve")["output"] == {"by": "carol"}
    gone = subprocess.run([*cli, "approve"], capture_output=True, text=True)
    assert gone.returncode == 1
    assert "already finished (succeeded)" in gone.stderr


def test_a_signal_through_the_database_on_the_postgresql_journal(pg_schema_url: str) -> None:
    engine_dir, api_dir = short_dir("tfs-e-"), short_dir("tfs-a-")
    env = {"TIFFANY_DATABASE_URL": pg_schema_url, "TIFFANY_JOURNAL": "postgres"}
    engine = start_engine(engine_dir, env_extra=env)
    ready = api_dir / "api.json"
    api = subprocess.Popen(
        [sys.executable, "-m", "tiffany", "api", "--ready-file", str(ready)],
        stdout=(api_dir / "api.log").open("ab"),
        stderr=subprocess.STDOUT,
        env=clean_env()
        | env
        | {"TIFFANY_DATA_DIR": str(api_dir), "TIFFANY_PORT": "0", "TIFFANY_LOG_FORMAT": "json"},
    )
    try:
        wait_for(ready.exists, 60, "the API")
        url = str(json.loads(ready.read_text())["url"]).rstrip("/")
        wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, 60, "readyz")
        submitted = submit_plan(url, APPROVAL)
        run_id, seq = submitted["run_id"], submitted["seq"]
        wait_for(lambda: run_step(read_run(url, run_id, seq), "approve")["waiting"], 30, "the wait")
        # Through the database to the engine, the engine's own names are refused too.
        forged = subprocess.run(
            [sys.executable, "-m", "tiffany", "signal", run_id, "concurrency.slot"],
            capture_output=True,
            text=True,
            env=clean_env() | env | {"TIFFANY_DATA_DIR": str(api_dir)},
            check=False,
        )
        assert forged.returncode == 2, (forged.stdout, forged.stderr)
        assert "reserved namespace" in forged.stderr
        r = httpx.post(f"{url}/api/runs/{run_id}/signals/approve", json={"by": "dana"}, timeout=30)
        assert r.status_code == 202, r.text
        run = finished_run(url, run_id)
        assert (run["status"], run_step(run, "approve")["output"]) == ("succeeded", {"by": "dana"})
        r = httpx.post(f"{url}/api/runs/{run_id}/signals/approve", json=1, timeout=30)
        assert r.status_code == 409, r.text
    finally:
        terminate(api)
        engine.stop()


# -- the engine's own signals, and how many a run holds ---------------------------------

#: A parent whose sub-plan waits for a person's approval.
APPROVED_CHILD = {
    "name": "parent",
    "steps": [
        {
            "id": "sub",
            "tool": "plan.run",
            "args": {
                "plan": {
                    "name": "kid",
                    "steps": [{"id": "ok", "tool": "signal.wait", "args": {"name": "approve"}}],
                    "outputs": {"approved_by": "${steps.ok.output.by}"},
                }
            },
        }
    ],
    "outputs": {"approved_by": "${steps.sub.output.approved_by}"},
}
FORGED_END = {"status": "succeeded", "outputs": {"approved_by": "MALLORY"}}


def _waits(url: str, run_id: str) -> bool:
    """Whether the run's step ``ok`` waits for its signal (404: not in the store yet)."""
    r = httpx.get(f"{url}/api/runs/{run_id}", timeout=30)
    return r.status_code == 200 and bool(run_step(r.json(), "ok")["waiting"])


def _refused_as_reserved(r: httpx.Response) -> None:
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["detail"][0]["loc"] == ["path", "name"]
    assert "reserved namespace" in body["message"]
    assert "'child:'" in body["message"]


def test_a_client_cannot_forge_a_sub_plans_end_over_http_or_the_cli(served) -> None:
    """``child:<id>`` is the engine's: refused (422 naming ``name``); the real end still comes."""
    data_dir, url = served
    parent = submit_plan(url, APPROVED_CHILD)["run_id"]
    child = f"{parent}.sub.1"
    wait_for(lambda: _waits(url, child), 60, "the child to wait for its approval")
    base = f"{url}/api/runs/{parent}/signals"
    _refused_as_reserved(httpx.post(f"{base}/child:{child}", json=FORGED_END, timeout=30))
    _refused_as_reserved(httpx.post(f"{base}/tiffany.end", json=FORGED_END, timeout=30))
    tiffany = [sys.executable, "-m", "tiffany"]
    data = ["--data", json.dumps(FORGED_END)]
    for where in (["--data-dir", str(data_dir)], ["--url", url]):  # the engine's socket, the API
        cli = [*tiffany, "signal", *where, parent, f"child:{child}", *data]
        forged = subprocess.run(cli, capture_output=True, text=True, env=clean_env(), check=False)
        assert forged.returncode == 2, (where, forged.stdout, forged.stderr)
        assert "reserved namespace" in forged.stderr, (where, forged.stderr)
    # A plan cannot wait for one either (it would take the end from its step).
    wait = {"id": "s", "tool": "signal.wait", "args": {"name": "child:a"}}
    sneaky = {"name": "x", "steps": [wait]}
    r = httpx.post(f"{url}/api/runs", json={"plan": sneaky}, timeout=30)
    assert r.status_code == 422, r.text
    assert "reserved namespace" in r.text
    # The parent still waits for its child, which still waits for its approver.
    assert read_run(url, parent)["status"] == "running"
    r = httpx.post(f"{url}/api/runs/{child}/signals/approve", json={"by": "alice"}, timeout=30)
    assert r.status_code == 202, r.text
    run = finished_run(url, parent)
    assert run["status"] == "succeeded", run["error"]
    assert run["outputs"] == {"approved_by": "alice"}
    verdict = httpx.post(f"{url}/api/runs/{parent}/verify", timeout=120).json()
    assert verdict["identical"], verdict


def test_a_client_cannot_give_a_pending_run_its_concurrency_slot(served) -> None:
    data_dir, url = served
    limited = {
        "name": "limited",
        "concurrency": {"key": "one", "limit": 1},
        "steps": [{"id": "ok", "tool": "signal.wait", "args": {"name": "approve"}}],
    }
    first = submit_plan(url, limited)["run_id"]
    wait_for(lambda: _waits(url, first), 60, "the first to wait")
    submitted = submit_plan(url, limited)
    second = submitted["run_id"]
    assert read_run(url, second, submitted["seq"])["status"] == "pending"
    base = f"{url}/api/runs/{second}/signals"
    _refused_as_reserved(httpx.post(f"{base}/concurrency.slot", json={}, timeout=30))
    cli = [sys.executable, "-m", "tiffany", "signal", "--data-dir", str(data_dir)]
    forged = subprocess.run(
        [*cli, second, "concurrency.slot"], capture_output=True, text=True, env=clean_env()
    )
    assert forged.returncode == 2, forged.stderr
    assert "reserved namespace" in forged.stderr
    status = json.loads(
        subprocess.run(
            [sys.executable, "-m", "tiffany", "status", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            env=clean_env(),
            check=True,
        ).stdout
    )
    assert status["concurrency"]["one"] == {"running": 1, "queued": 1}, status
    assert read_run(url, second)["status"] == "pending"
    for run_id in (first, second):  # the first's end gives the second its slot
        wait_for(lambda r=run_id: _waits(url, r), 60, "the wait")
        r = httpx.post(f"{url}/api/runs/{run_id}/signals/approve", json=1, timeout=30)
        assert r.status_code == 202, r.text
        assert finished_run(url, run_id)["status"] == "succeeded"


def _engine_status(data_dir: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tiffany", "status", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=True,
    )
    return dict(json.loads(done.stdout))


def test_signals_nobody_receives_are_bounded_per_run_and_let_go_when_it_ends() -> None:
    """At most ``max_pending_signals`` (429), of ``max_pending_signal_bytes`` (413), per run."""
    from process_support import terminate

    data_dir = short_dir("tfs-")
    bounds = {"TIFFANY_MAX_PENDING_SIGNALS": "3", "TIFFANY_MAX_PENDING_SIGNAL_BYTES": "300000"}
    proc, url = serve(data_dir, env_extra=bounds)
    try:
        few, big = (submit_plan(url, APPROVAL)["run_id"] for _ in range(2))
        notes = [
            httpx.post(
                f"{url}/api/runs/{few}/signals/note",
                json={"n": i},
                headers={"Idempotency-Key": f"note-{i}"},
                timeout=30,
            )
            for i in range(4)
        ]
        assert [r.status_code for r in notes] == [202, 202, 202, 429], notes[-1].text
        refusal = notes[3].json()
        assert refusal["code"] == "limit.max_pending_signals", refusal
        assert "TIFFANY_MAX_PENDING_SIGNALS (3)" in refusal["message"]
        assert refusal["detail"]["setting"] == "TIFFANY_MAX_PENDING_SIGNALS"
        # A repeat holds nothing more: it is answered as the first was.
        again = httpx.post(
            f"{url}/api/runs/{few}/signals/note",
            json={"n": 0},
            headers={"Idempotency-Key": "note-0"},
            timeout=30,
        )
        assert (again.status_code, again.json()) == (202, notes[0].json())
        pad = {"pad": "x" * 200_000}
        sent = [httpx.post(f"{url}/api/runs/{big}/signals/blob", json=pad, timeout=30)]
        sent.append(httpx.post(f"{url}/api/runs/{big}/signals/blob", json=pad, timeout=30))
        assert [r.status_code for r in sent] == [202, 413], sent[-1].text
        assert sent[1].json()["code"] == "limit.max_pending_signal_bytes"
        assert "TIFFANY_MAX_PENDING_SIGNAL_BYTES (300000)" in sent[1].json()["message"]
        status = _engine_status(data_dir)
        assert status["signals_held"] == 4, status
        assert status["signal_bytes_held"] > 200_000, status
        for run_id in (few, big):
            assert httpx.post(f"{url}/api/runs/{run_id}/cancel", timeout=30).status_code == 202
            assert finished_run(url, run_id)["status"] == "cancelled"
        status = _engine_status(data_dir)
        assert (status["signals_held"], status["signal_bytes_held"]) == (0, 0), status
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)
