"""What the API tells clients about itself is what it does: 405's ``Allow``, the OpenAPI schema.

The app under a real uvicorn on 127.0.0.1 (no engine: a method refused
with 405 never reaches one, and a schema is the app's).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from api_support import LiveApi, make_settings

#: Every method a client may try (RFC 9110's, less CONNECT and TRACE).
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@pytest.fixture
def live(api_dir: Path, live_api_factory: Callable[..., LiveApi]) -> LiveApi:
    return live_api_factory(make_settings(api_dir))


def _url(live: LiveApi, path: str) -> str:
    """``path`` of the schema with each parameter filled in (a value every pattern takes)."""
    return live.base + re.sub(r"\{[^}]+\}", "a1", path)


def test_a_405_allows_every_method_the_path_takes(live: LiveApi) -> None:
    """``Allow`` named one route's methods: ``PUT /api/runs`` said ``Allow: POST``
    (GET and POST are two routes), ``POST /api/schedules/{id}`` said ``Allow: GET``."""
    paths: dict[str, Any] = live.app.openapi()["paths"]
    assert {"get", "post"} <= set(paths["/api/runs"])
    assert {"get", "delete"} <= set(paths["/api/schedules/{schedule_id}"])
    checked = 0
    with httpx.Client(timeout=30) as client:
        for path, operations in paths.items():
            documented = {method.upper() for method in operations}
            for method in METHODS:
                if method in documented:
                    continue
                r = client.request(method, _url(live, path))
                assert r.status_code == 405, (method, path, r.status_code)
                if method != "HEAD":  # a HEAD's answer has no body
                    assert r.json()["code"] == "http.405"
                allow = {m.strip() for m in r.headers["allow"].split(",")}
                # What the server takes, no more (HEAD and OPTIONS are 405s here too).
                assert allow == documented, (method, path)
                checked += 1
    assert checked >= 4 * len(paths)
    # The schema's own route takes HEAD as well as GET, and says so.
    r = httpx.post(live.base + "/openapi.json", timeout=30)
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, HEAD"
    assert httpx.head(live.base + "/openapi.json", timeout=30).status_code == 200


# -- the OpenAPI schema ---------------------------------------------------------------------

TOKEN = "contract-token-0123456789"


def _schema(live: LiveApi) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.get(live.base + "/openapi.json", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _deref(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


@pytest.fixture
def authed(api_dir: Path, live_api_factory: Callable[..., LiveApi]) -> LiveApi:
    return live_api_factory(make_settings(api_dir, api_token=TOKEN))


def test_the_submission_schema_describes_the_plan_the_engine_validates(authed: LiveApi) -> None:
    """``plan`` was ``object`` (any keys), and ``inputs: null``, which the server
    takes, was refused by the schema (``object``)."""
    from tiffany.agents import plan as engine
    from tiffany.api import schemas

    doc = _schema(authed)
    body = doc["paths"]["/api/runs"]["post"]["requestBody"]
    json_schema = body["content"]["application/json"]["schema"]
    assert body["content"]["application/yaml"]["schema"] == json_schema  # YAML: the same document
    # The envelope, a workflow's name and inputs, or the bare plan.
    refs = [s["$ref"].rsplit("/", 1)[1] for s in json_schema["anyOf"]]
    assert refs == ["SubmitRequest", "WorkflowSubmitRequest", "Plan"]
    workflow = _deref(doc, json_schema["anyOf"][1])
    assert workflow["additionalProperties"] is False
    assert workflow["required"] == ["workflow"]
    envelope = _deref(doc, json_schema["anyOf"][0])
    assert envelope["additionalProperties"] is False  # "unknown field beside the plan": 422
    plan_forms = envelope["properties"]["plan"]["anyOf"]
    assert plan_forms[0] == {"$ref": "#/components/schemas/Plan"}
    assert plan_forms[1]["type"] == "string"  # its JSON or YAML text
    assert {"type": "null"} in envelope["properties"]["inputs"]["anyOf"]

    # The plan's models are the engine's own (one definition, tiffany/wire/plan.py,
    # not a copy), and the schema served is theirs, word for word.
    for name in _PLAN_MODELS:
        assert getattr(schemas, name) is getattr(engine, name), name
    served = {name: doc["components"]["schemas"][name] for name in _PLAN_MODELS}
    own = engine.Plan.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = own.pop("$defs")
    assert served == {"Plan": own, **defs}
    # after's "each step once", which the engine checks in code, is in the schema too.
    assert served["StepSpec"]["properties"]["after"]["uniqueItems"] is True

    schedule = _deref(
        doc,
        doc["paths"]["/api/schedules"]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ],
    )
    # A schedule's plan is the same plan (or null: a schedule of a workflow, by name).
    plan_forms = schedule["properties"]["plan"]["anyOf"]
    assert {"$ref": "#/components/schemas/Plan"} in plan_forms
    assert {"type": "null"} in plan_forms
    workflow_forms = schedule["properties"]["workflow"]["anyOf"]
    assert {"type": "string", "minLength": 1, "maxLength": 100} in workflow_forms


_PLAN_MODELS = ("Plan", "StepSpec", "ConcurrencySpec", "BudgetSpec")


def test_the_signal_name_pattern_is_what_the_server_enforces(authed: LiveApi) -> None:
    """The name had no pattern in the schema: a client learnt the rule from a 422."""
    doc = _schema(authed)
    parameters = doc["paths"]["/api/runs/{run_id}/signals/{name}"]["post"]["parameters"]
    pattern = next(p for p in parameters if p["name"] == "name")["schema"]["pattern"]
    names = [
        "approve", "a.b:c-d_e", "x" * 128, "x" * 129, "-x", "child:run-1.s.1",
        "concurrency.slot", "tiffany.x", "tiffanyx", "childx", "a b", "é",
    ]  # fmt: skip
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=30, headers=headers) as client:
        for name in names:
            url = f"{authed.base}/api/runs/run-nosuch/signals/{quote(name, safe='')}"
            r = client.post(url, json={})
            # Past the name check: the run is looked for (no engine here: 503).
            taken = r.status_code != 422
            assert r.status_code in (404, 422, 503), (name, r.text)
            assert taken == (re.fullmatch(pattern, name) is not None), name
            if not taken:
                assert r.json()["detail"][0]["loc"] == ["path", "name"]


def test_the_time_filters_pattern_is_what_the_server_enforces(authed: LiveApi) -> None:
    """``since``/``until`` had no pattern; the server took what ``float()`` takes (``1_0``)."""
    doc = _schema(authed)
    parameters = {p["name"]: p for p in doc["paths"]["/api/runs"]["get"]["parameters"]}
    pattern = parameters["since"]["schema"]["pattern"]  # of the string (null has none)
    assert parameters["until"]["schema"]["pattern"] == pattern
    samples = [
        "", "1714557600", "1714557600.5", "-5", "2024-05-01", "2024-05-01T10:00",
        "2024-05-01T10:00:00.123456+02:00", "2024-05-01T10:00:00.000Z", "2024-05-01 10:00",
        "1_0", " 1", "1e5", "inf", "yesterday", "2024-5-1", "123456789012",
    ]  # fmt: skip
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=30, headers=headers) as client:
        for value in samples:
            r = client.get(authed.base + "/api/runs", params={"since": value})
            # Past the check the store is read (no engine here to make one: 503).
            assert r.status_code in (200, 422, 503), (value, r.text)
            assert (r.status_code != 422) == (re.search(pattern, value) is not None), value


def test_the_schema_declares_the_bearer_token_the_server_asks_for(
    authed: LiveApi, live: LiveApi
) -> None:
    """No security scheme was declared: nothing told a client of the token."""
    doc = _schema(authed)
    scheme = doc["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    with httpx.Client(timeout=30) as client:
        for path, operations in doc["paths"].items():
            for method, operation in operations.items():
                url = _url(authed, path)
                if path in ("/healthz", "/api/meta"):  # the public paths
                    assert operation["security"] == []
                    assert client.request(method, url).status_code == 200
                    continue
                assert operation["security"] == [{"bearerAuth": []}], (method, path)
                assert "401" in operation["responses"], (method, path)
                r = client.request(method, url)  # without the token
                assert r.status_code == 401, (method, path)
    # A server without a token asks for none, and says so.
    open_doc = httpx.get(live.base + "/openapi.json", timeout=30).json()
    assert "bearerAuth" in open_doc["components"]["securitySchemes"]
    for operations in open_doc["paths"].values():
        for operation in operations.values():
            assert "security" not in operation


def test_a_rerun_body_that_is_no_object_is_refused(authed: LiveApi) -> None:
    """``0``, ``false``, ``[]`` and ``""`` were taken as an empty body (``doc or {}``)."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for body in ("0", "false", "[]", '""'):
        r = httpx.post(
            authed.base + "/api/runs/run-nosuch/rerun", content=body, headers=headers, timeout=30
        )
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["loc"][0] == "body"
