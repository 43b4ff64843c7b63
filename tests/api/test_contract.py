"""What the API tells clients about itself is what it does: 405's ``Allow``, the OpenAPI schema.

The app under a real uvicorn on 127.0.0.1 (no engine: a method refused
with 405 never reaches one, and a schema is the app's).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import LiveApi, make_settings

#: Every method a client may try (RFC 9110's, less CONNECT and TRACE).
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@pytest.fixture
def live(api_dir: Path, live_api_factory: Callable[..., LiveApi]) -> Iterator[LiveApi]:
    yield live_api_factory(make_settings(api_dir))


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
