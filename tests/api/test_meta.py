"""``GET /api/meta``: the status vocabulary the dashboard reads instead of a copy of its own."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from api_support import make_settings
from fastapi.testclient import TestClient

from tiffany.api import create_app
from tiffany.api.routes.system import STATIC_DIR
from tiffany.wire.status import (
    STATE_LABELS,
    TASK_STATUS,
    TERMINAL,
    TERMINAL_TASK,
    RunStatus,
    StepStatus,
    TaskState,
)

TOKEN = "s3cret-token"


@pytest.fixture
def client(api_dir) -> Iterator[TestClient]:
    app = create_app(make_settings(api_dir, api_token=TOKEN))
    with TestClient(app) as c:
        yield c


def test_the_vocabulary_is_the_wire_s_and_needs_no_token(client: TestClient) -> None:
    got = client.get("/api/meta")
    assert got.status_code == 200
    meta = got.json()
    assert meta["run_statuses"] == [s.value for s in RunStatus]
    assert set(meta["terminal_run_statuses"]) == {s.value for s in TERMINAL}
    assert meta["step_statuses"] == [s.value for s in StepStatus]
    assert meta["task_states"] == [s.value for s in TaskState]
    assert set(meta["terminal_task_states"]) == {s.value for s in TERMINAL_TASK}
    assert meta["status_of"] == {
        **{k.value: v.value for k, v in TASK_STATUS.items()},  # type: ignore[attr-defined]
        "cancelling": "cancelled",
    }
    assert meta["state_labels"] == {k.value: v for k, v in STATE_LABELS.items()}  # type: ignore[attr-defined]


def test_the_openapi_document_describes_it(client: TestClient) -> None:
    doc = client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    op = doc["paths"]["/api/meta"]["get"]
    assert op["security"] == []
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Vocabulary"
    }


def test_the_dashboard_holds_no_copy_of_the_statuses() -> None:
    """The lists of statuses come from the server: no script spells one out.

    (A script may name the few statuses an action applies to, as the bulk
    cancel's ``["pending", "running"]``: not the vocabulary's lists.)
    """
    status = r"\"(pending|running|waiting|succeeded|failed|cancelled|done|crashed)\""
    listed = re.compile(rf"\[\s*{status},\s*{status},\s*{status}")
    mapped = re.compile(r"done:\s*\"succeeded\"|crashed:\s*\"failed\"")
    for script in sorted(STATIC_DIR.glob("*.js")):
        source = script.read_text(encoding="utf-8")
        assert not listed.search(source), f"{script.name} lists statuses"
        assert not mapped.search(source), f"{script.name} maps task states"
    vocab = (STATIC_DIR / "vocab.js").read_text(encoding="utf-8")
    assert 'fetch("api/meta"' in vocab
