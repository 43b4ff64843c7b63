"""The SDK's models agree with the API's served OpenAPI document, field for field.

The SDK defines its own models (importing ``tiffany.api`` would start
FastAPI in every client); this test holds them to ``/openapi.json`` as a
real server serves it: the same component names, the same properties, the
same required ones.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel
from sdk_support import Served

from tiffany.sdk import models

#: SDK model -> the OpenAPI component it mirrors.
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
    assert models.RunList.model_validate(listed).counts is not None
