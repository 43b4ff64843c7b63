"""The engine's refusals become HTTP answers in one place (``tiffany/api/problems.py``).

One table: each domain refusal, the status and the body the API answers
with. The bodies are those the API gave when the engine still raised
HTTP statuses (tests/api pins them route by route too).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tiffany.api import problems
from tiffany.errors import (
    REFUSALS,
    CommandTooLarge,
    EngineFault,
    EngineNotReady,
    EngineUnavailable,
    InvalidCommand,
    KeyReused,
    LimitExceeded,
    MalformedCommand,
    Refusal,
    RunConflict,
    RunExists,
    RunFinished,
    RunNotFinished,
    RunNotFound,
    SignalBytesHeldFull,
    SignalsHeldFull,
    VerifyTimedOut,
)

HELD = LimitExceeded("max_pending_signals", 2, "run r holds 2 signals", held=2).to_dict()
HELD_BYTES = LimitExceeded("max_pending_signal_bytes", 10, "run r holds 9 bytes").to_dict()
PAYLOAD = [{"loc": ["body", "n"], "msg": "bad", "pointer": "/n", "step": "w", "code": "x.y"}]

#: refusal -> (status, code, detail in the body)
TABLE: list[tuple[Refusal, int, str, Any]] = [
    (RunNotFound("no run 'r'"), 404, "run.not_found", None),
    (RunFinished("run r already finished (ok)", detail={"status": "ok"}), 409, "run.conflict",
     {"status": "ok"}),
    (RunNotFinished("run r has not finished"), 409, "run.conflict", None),
    (RunExists("run r exists already", detail={"run_id": "r"}), 409, "run.conflict",
     {"run_id": "r"}),
    (KeyReused("Idempotency-Key 'k' was used", detail={"run_id": "r"}), 409, "run.conflict",
     {"run_id": "r"}),
    (InvalidCommand("signal name must match x", field="name"), 422, "plan.invalid",
     [{"loc": ["name"], "msg": "signal name must match x"}]),
    (InvalidCommand("bad plan", field="plan", detail=[{"loc": "steps[0].after[0]", "msg": "no"}]),
     422, "plan.invalid", [{"loc": ["steps", 0, "after", 0], "msg": "no"}]),
    (InvalidCommand("payload", field="payload", detail=PAYLOAD), 422, "x.y", PAYLOAD),
    (MalformedCommand("no such command"), 400, "request.invalid", None),
    (CommandTooLarge("the request is 9 bytes"), 413, "engine.refused", None),
    (SignalsHeldFull(HELD["message"], detail=HELD), 429, "limit.max_pending_signals", HELD),
    (SignalBytesHeldFull(HELD_BYTES["message"], detail=HELD_BYTES), 413,
     "limit.max_pending_signal_bytes", HELD_BYTES),
    (EngineNotReady("the engine is stopping"), 503, "engine.not_ready", None),
    (EngineNotReady("the store is at seq 3", detail={"min_seq": 5, "store_seq": 3}), 503,
     "engine.not_ready", {"min_seq": 5, "store_seq": 3}),
    (VerifyTimedOut("verify of r took over 5 s"), 504, "engine.refused", None),
    (EngineFault("the verify worker died"), 500, "engine.refused", None),
]  # fmt: skip


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    problems.install(app)
    raised: dict[str, BaseException] = {}

    @app.get("/raise/{i}")
    async def raise_it(i: int) -> None:
        raise raised[str(i)]

    app.state.raised = raised
    return TestClient(app, raise_server_exceptions=False)


def _answer(client: TestClient, exc: BaseException) -> Any:
    raised = client.app.state.raised  # type: ignore[attr-defined]
    raised[str(len(raised))] = exc
    return client.get(f"/raise/{len(raised) - 1}")


@pytest.mark.parametrize(
    ("refused", "status", "code", "detail"), TABLE, ids=[type(r[0]).__name__ for r in TABLE]
)
def test_each_refusal_has_one_http_answer(
    client: TestClient, refused: Refusal, status: int, code: str, detail: Any
) -> None:
    answer = _answer(client, refused)
    assert answer.status_code == status
    assert answer.json() == {"code": code, "message": refused.message, "detail": detail}
    assert ("retry-after" in answer.headers) == (status == 503)


def test_the_table_covers_every_kind_of_refusal() -> None:
    covered = {type(r) for r, *_ in TABLE}
    assert set(REFUSALS.values()) - covered == {Refusal, RunConflict}  # the bases
    for cls in REFUSALS.values():
        assert problems.status_of(cls("x")) >= 400


def test_no_engine_to_ask_is_a_503_that_names_no_path(client: TestClient) -> None:
    answer = _answer(client, EngineUnavailable("no engine listens on /secret/control.sock"))
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == str(problems.RETRY_AFTER_S)
    assert answer.json()["code"] == "engine.unavailable"
    assert "/secret" not in answer.text
