"""The API token: every route but /healthz, /api/meta and the dashboard's files needs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from api_support import make_settings, ws_connect
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from tiffany.api import create_app

TOKEN = "s3cret-token"

#: Every data route of the API, with a method (the auth check is the same for all).
PROTECTED = [
    ("GET", "/api/runs"),
    ("POST", "/api/runs"),
    ("GET", "/api/runs/run-x"),
    ("GET", "/api/runs/run-x/events"),
    ("GET", "/api/runs/run-x/steps/step-x/conversation"),
    ("POST", "/api/runs/run-x/cancel"),
    ("POST", "/api/runs/run-x/verify"),
    ("GET", "/api/runs/run-x/export"),
    ("GET", "/api/runs/run-x/waits"),
    ("POST", "/api/runs/run-x/rerun"),
    ("POST", "/api/runs/run-x/signals/approve"),
    ("GET", "/api/schedules"),
    ("POST", "/api/schedules"),
    ("GET", "/api/schedules/sched-x"),
    ("DELETE", "/api/schedules/sched-x"),
    ("POST", "/api/schedules/sched-x/pause"),
    ("POST", "/api/schedules/sched-x/resume"),
    ("GET", "/api/memory"),
    ("GET", "/api/memory/notes"),
    ("GET", "/api/memory/notes/search"),
    ("GET", "/api/memory/notes/note-x"),
    ("DELETE", "/api/memory/notes/note-x"),
    ("GET", "/api/tools"),
    ("GET", "/api/tools/approve"),  # {name}: the table test's stand-in for any name
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/no-such-route"),
]


@pytest.fixture
def client(api_dir) -> Iterator[TestClient]:
    app = create_app(make_settings(api_dir, api_token=TOKEN))
    with TestClient(app) as c:
        yield c


def test_the_table_covers_every_route(client) -> None:
    paths = {
        path.replace("{run_id}", "run-x")
        .replace("{name}", "approve")
        .replace("{schedule_id}", "sched-x")
        .replace("{step_id}", "step-x")
        .replace("{namespace}", "notes")
        .replace("{key}", "note-x")
        for path in client.app.openapi()["paths"]
    }
    listed = {path for _, path in PROTECTED} | {"/healthz", "/api/meta"}
    assert paths <= listed


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_data_routes_need_the_token(client, method: str, path: str) -> None:
    missing = client.request(method, path)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["code"] == "auth.unauthorized"
    wrong = client.request(method, path, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.json()["message"] == "invalid bearer token"
    basic = client.request(method, path, headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    # a query token is for websockets only
    assert client.request(method, f"{path}?token={TOKEN}").status_code == 401
    ok = client.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code != 401


@pytest.mark.parametrize("path", ["/healthz", "/", "/static/dom.js", "/api/meta"])
def test_liveness_and_the_dashboard_files_need_no_token(client, path: str) -> None:
    r = client.get(path)
    assert r.status_code in (200, 404)  # 404: a dashboard file not written yet
    assert r.status_code != 401


def test_websockets_need_the_token_in_the_header_or_the_query(client) -> None:
    with pytest.raises(WebSocketDenialResponse) as info, client.websocket_connect("/ws/activity"):
        pass
    assert info.value.status_code == 401
    with pytest.raises(WebSocketDenialResponse), client.websocket_connect("/ws/activity?token=x"):
        pass
    with client.websocket_connect(f"/ws/activity?token={TOKEN}") as ws:
        ws.close()
    with client.websocket_connect(
        "/ws/activity", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as ws:
        ws.close()


def test_a_real_server_answers_an_unauthorized_websocket_with_401(api_dir, live_api_factory):
    from websockets.exceptions import InvalidStatus

    live = live_api_factory(make_settings(api_dir, api_token=TOKEN, ws_ping_interval_s=0.2))
    with pytest.raises(InvalidStatus) as info, ws_connect(f"{live.ws_base}/ws/activity"):
        pass
    assert info.value.response.status_code == 401
    with ws_connect(f"{live.ws_base}/ws/activity?token={TOKEN}") as ws:
        assert ws.recv(timeout=5) == '{"type":"ping"}'


def test_no_token_configured_means_open(api_dir) -> None:
    app = create_app(make_settings(api_dir))
    with TestClient(app) as c:
        assert c.get("/api/runs").status_code != 401
