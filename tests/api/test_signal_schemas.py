"""Signal payloads with a schema: refused at send, nothing journaled; early names warned of.

* a ``signal.wait`` step's ``schema`` is checked when the plan is submitted
  (422 naming ``steps[i].args.schema``: not a schema, or a ``$ref`` that
  leaves it);
* a payload that does not satisfy it is refused at send, 422 naming the
  field (its ``loc``, its JSON pointer, the step), and nothing is journaled
  (the run's events hold no signal); the run still waits, and a good
  payload finishes it;
* a name several steps wait for is held to every one of their schemas;
* a signal no step waits for is taken (it may be early) with a
  ``warning`` naming what the run waits for;
* ``tiffany signal`` prints the refusal's fields and exits 2, and the
  warning;
* on the PostgreSQL journal, through the database to the engine, the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
from api_support import (
    clean_env,
    finished_run,
    read_run,
    run_step,
    short_dir,
    start_engine,
    submit_plan,
)
from process_support import terminate, wait_for

#: What the approval example asks of an approval (examples/approval/plan.yaml).
APPROVAL_SCHEMA = {
    "type": "object",
    "required": ["approved", "by"],
    "properties": {
        "approved": {"type": "boolean", "const": True},
        "by": {"type": "string", "minLength": 1},
        "note": {"type": "string"},
    },
    "additionalProperties": False,
}
APPROVAL = {
    "name": "approval",
    "steps": [
        {
            "id": "approve",
            "tool": "signal.wait",
            "args": {"name": "approve", "schema": APPROVAL_SCHEMA},
        },
        {
            "id": "publish",
            "tool": "file.write",
            "args": {"path": "p.txt", "content": "${steps.approve.output.by}"},
            "after": ["approve"],
        },
    ],
    "outputs": {"by": "${steps.approve.output.by}"},
}


def _signals_journaled(url: str, run_id: str) -> list[Any]:
    """The run's signal records (WAKEs of task 0), from its events."""
    records = httpx.get(f"{url}/api/runs/{run_id}/events", params={"limit": 1000}, timeout=30)
    assert records.status_code == 200, records.text
    return [r for r in records.json()["records"] if r["type"] == "WAKE" and r["ltid"] == 0]


def _waiting(url: str, run_id: str, seq: int) -> dict[str, Any] | None:
    run = read_run(url, run_id, seq)
    return run if run_step(run, "approve")["waiting"] else None


def test_a_wait_schema_is_checked_when_the_plan_is_submitted(served) -> None:
    _, url = served
    for schema, words in (
        ({"type": "objekt"}, "not a valid JSON Schema"),
        ({"$ref": "https://example.org/approval.json"}, "points outside the schema"),
        ({"$ref": "#/$defs/missing"}, "points to nothing in the schema"),
        ("not an object", "valid dictionary"),
    ):
        plan = {
            "name": "bad-schema",
            "steps": [
                {"id": "first", "tool": "sleep", "args": {"seconds": 0}},
                {"id": "approve", "tool": "signal.wait", "args": {"name": "a", "schema": schema}},
            ],
        }
        r = httpx.post(f"{url}/api/runs", json={"plan": plan}, timeout=30)
        assert r.status_code == 422, r.text
        (item,) = r.json()["detail"]
        assert item["loc"][:4] == ["steps", 1, "args", "schema"], item
        assert words in item["msg"], item


def test_a_payload_the_schema_refuses_is_refused_at_send_and_nothing_is_journaled(
    served,
) -> None:
    data_dir, url = served
    submitted = submit_plan(url, APPROVAL)
    run_id, seq = submitted["run_id"], submitted["seq"]
    wait_for(lambda: _waiting(url, run_id, seq), 60, "the approve step to wait")
    base = f"{url}/api/runs/{run_id}/signals/approve"
    # What the dashboard's Approve sent, and what the README's example sent.
    for payload, pointer in (({"approved": True}, "/by"), ({"by": "alice"}, "/approved")):
        r = httpx.post(base, json=payload, timeout=30)
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["code"] == "signal.payload_invalid", body
        (item,) = body["detail"]
        field = pointer[1:]
        assert item == {
            "loc": ["body", field],
            "msg": f"'{field}' is a required property",
            "pointer": pointer,
            "step": "approve",
            "code": "signal.payload_invalid",
        }
        assert body["message"] == (
            f"signal approve's payload does not satisfy step approve's schema: {pointer}: "
            f"'{field}' is a required property"
        )
    wrong = httpx.post(base, json={"approved": False, "by": "", "extra": 1}, timeout=30)
    assert wrong.status_code == 422, wrong.text
    pointers = [i["pointer"] for i in wrong.json()["detail"]]
    assert pointers == ["", "/approved", "/by"], wrong.json()  # the extra field: the object's
    # Nothing of those reached the journal: the run still waits for its approval.
    assert _signals_journaled(url, run_id) == []
    assert read_run(url, run_id)["status"] == "waiting"
    # The CLI says which field, and exits 2 (a 422).
    cli = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "signal", run_id]
    refused = subprocess.run(
        [*cli, "approve", "--data", '{"approved": true, "by": 7}'],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        "tiffany: signal approve's payload does not satisfy step approve's schema:",
        "  body.by: 7 is not of type 'string'",
    ]
    assert _signals_journaled(url, run_id) == []
    ok = httpx.post(base, json={"approved": True, "by": "ada", "note": "ship it"}, timeout=30)
    assert ok.status_code == 202, ok.text
    assert "warning" not in ok.json()
    done = finished_run(url, run_id)
    assert (done["status"], done["outputs"]) == ("succeeded", {"by": "ada"})
    assert len(_signals_journaled(url, run_id)) == 1


def test_a_name_two_steps_wait_for_is_held_to_both_schemas(served) -> None:
    _, url = served

    def wait(step: str, needs: str) -> dict[str, Any]:
        schema = {"type": "object", "required": [needs]}
        return {"id": step, "tool": "signal.wait", "args": {"name": "go", "schema": schema}}

    plan = {"name": "two-waits", "steps": [wait("a", "x"), {**wait("b", "y"), "after": ["a"]}]}
    submitted = submit_plan(url, plan)
    run_id = submitted["run_id"]
    base = f"{url}/api/runs/{run_id}/signals/go"
    r = httpx.post(base, json={"x": 1}, timeout=30)  # would do for a, not for b
    assert r.status_code == 422, r.text
    assert [(i["step"], i["pointer"]) for i in r.json()["detail"]] == [("b", "/y")]
    for _ in range(2):
        assert httpx.post(base, json={"x": 1, "y": 2}, timeout=30).status_code == 202
    assert finished_run(url, run_id)["status"] == "succeeded"


def test_a_signal_no_step_waits_for_is_kept_with_a_warning_naming_what_the_run_waits_for(
    served,
) -> None:
    data_dir, url = served
    submitted = submit_plan(url, APPROVAL)
    run_id, seq = submitted["run_id"], submitted["seq"]
    r = httpx.post(f"{url}/api/runs/{run_id}/signals/aprove", json={"by": "bob"}, timeout=30)
    assert r.status_code == 202, r.text
    assert r.json()["warning"] == (
        f"no step of run {run_id} waits for signal 'aprove': it is kept, and taken only by "
        "a wait for that name; its steps wait for: approve (step approve)"
    )
    assert [s["data"]["value"][0] for s in _signals_journaled(url, run_id)] == ["aprove"]
    cli = [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), "signal", run_id]
    again = subprocess.run(
        [*cli, "aproved"], capture_output=True, text=True, env=clean_env(), check=False
    )
    assert again.returncode == 0, again.stderr
    assert "tiffany: warning: no step of run" in again.stderr
    assert "its steps wait for: approve (step approve)" in again.stderr
    wait_for(lambda: _waiting(url, run_id, seq), 60, "the approve step to wait")
    assert read_run(url, run_id)["status"] == "waiting"  # the early ones do not answer it
    ok = httpx.post(
        f"{url}/api/runs/{run_id}/signals/approve",
        json={"approved": True, "by": "bob"},
        timeout=30,
    )
    assert (ok.status_code, "warning" in ok.json()) == (202, False)
    assert finished_run(url, run_id)["status"] == "succeeded"


def test_a_refused_payload_through_the_database_on_the_postgresql_journal(
    pg_schema_url: str,
) -> None:
    engine_dir, api_dir = short_dir("tfp-e-"), short_dir("tfp-a-")
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
        wait_for(lambda: _waiting(url, run_id, seq), 60, "the approve step to wait")
        base = f"{url}/api/runs/{run_id}/signals"
        r = httpx.post(f"{base}/approve", json={"approved": True}, timeout=30)
        assert r.status_code == 422, r.text
        assert [(i["loc"], i["pointer"]) for i in r.json()["detail"]] == [(["body", "by"], "/by")]
        # The CLI beside the database, as on another host: the same refusal.
        cli = subprocess.run(
            [sys.executable, "-m", "tiffany", "signal", run_id, "approve", "--data", "{}"],
            capture_output=True,
            text=True,
            env=clean_env() | env | {"TIFFANY_DATA_DIR": str(api_dir)},
            check=False,
        )
        assert cli.returncode == 2, (cli.stdout, cli.stderr)
        assert "  body.approved: 'approved' is a required property" in cli.stderr
        assert _signals_journaled(url, run_id) == []
        early = httpx.post(f"{base}/later", json=None, timeout=30)
        assert early.status_code == 202, early.text
        assert "its steps wait for: approve (step approve)" in early.json()["warning"]
        ok = httpx.post(f"{base}/approve", json={"approved": True, "by": "dana"}, timeout=30)
        assert ok.status_code == 202, ok.text
        run = finished_run(url, run_id)
        assert (run["status"], run["outputs"]) == ("succeeded", {"by": "dana"})
    finally:
        terminate(api)
        engine.stop()
