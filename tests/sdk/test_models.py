"""The SDK's models are the API's: one definition, ``tiffany.wire.http``.

The SDK re-exports the models the API's routes and OpenAPI document are
built from, so they cannot drift; these tests hold the SDK to the
``/openapi.json`` a real server serves (the same component names,
properties and required ones) and check that reading them starts no
FastAPI.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
from pydantic import BaseModel
from sdk_support import Served

from tiffany.api import schemas
from tiffany.sdk import models

#: SDK model -> the OpenAPI component it is.
MIRRORED: dict[type[BaseModel], str] = {
    models.SubmitAnswer: "SubmitAnswer",
    models.RunSummary: "RunSummary",
    models.RunList: "RunList",
    models.StepOut: "StepOut",
    models.TaskOut: "TaskOut",
    models.RunDetail: "RunDetail",
    models.JournalRecordOut: "JournalRecordOut",
    models.RunEvents: "RunEvents",
    models.CancelAnswer: "CancelAnswer",
    models.SignalAnswer: "SignalAnswer",
    models.WaitingFor: "WaitingFor",
    models.ScheduleOut: "ScheduleOut",
    models.ScheduleList: "ScheduleList",
}


def _required(schema: dict[str, Any]) -> set[str]:
    return set(schema.get("required", []))


def test_the_sdk_models_are_the_api_models() -> None:
    for model, name in MIRRORED.items():
        assert getattr(schemas, name) is model, name


def test_the_sdk_models_import_no_fastapi() -> None:
    code = (
        "import sys; import tiffany.sdk.models; "
        "print(sorted(m for m in sys.modules if m.startswith(('fastapi', 'starlette', "
        "'tiffany.api', 'sqlalchemy'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_sdk_models_match_the_served_openapi_document(server: Served) -> None:
    doc = httpx.get(server.url + "/openapi.json", timeout=30).json()
    components = doc["components"]["schemas"]
    for model, name in MIRRORED.items():
        assert name in components, f"the API no longer has a {name} schema"
        served = components[name]
        mine = model.model_json_schema()
        assert set(mine["properties"]) == set(served["properties"]), name
        assert _required(mine) == _required(served), name


def test_a_served_answer_validates_as_the_sdk_model(server: Served) -> None:
    listed = httpx.get(server.url + "/api/runs", timeout=30).json()
    page = models.RunList.model_validate(listed)
    assert page.counts is not None
    assert len(page) == len(listed["runs"])
