"""Tokens never reach a log; refused websockets are not logged as errors.

Finding 5 (uvicorn logged ``?token=`` websocket URLs in plain text) and
finding 12 (a refused websocket logged "ASGI callable returned without
completing handshake" at ERROR).
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import structlog
from process_support import serve_json as _serve_json
from process_support import terminate
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tiffany.config import Settings
from tiffany.log import REDACTED, configure_logging, redact_text

TOKEN = "tok-9d1e7c2b4a6f8e0d"
BAD = "bad-5c3a1f9e7d2b"


def _get(url: str, token: str) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_served_instance_never_logs_its_token(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    env = {**os.environ, "TIFFANY_LOG_FORMAT": "json", "TIFFANY_API_TOKEN": TOKEN}
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data), "--port", "0"],
            stdout=log_file,
            stderr=log_file,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        while _serve_json(data) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        info = _serve_json(data)
        assert info is not None, log_path.read_text()[-2000:]
        url = str(info["url"])
        ws_url = url.replace("http://", "ws://", 1) + "ws/activity"

        with connect(f"{ws_url}?token={TOKEN}", open_timeout=10) as ws:
            ws.send(json.dumps({"type": "ping"}))  # accepted: the URL (with its query) is logged
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{ws_url}?token={BAD}", open_timeout=10)
        assert refused.value.response.status_code == 401
        assert _get(f"{url}api/runs", TOKEN) == 200
        assert _get(f"{url}api/runs?token={TOKEN}&x=1", BAD) == 401
        assert _get(f"{url}api/runs", BAD) == 401
    finally:
        terminate(proc)
    text = log_path.read_text()
    assert "/ws/activity?token=" + REDACTED in text  # the lines are there, masked
    assert TOKEN not in text
    assert BAD not in text
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    errors = [r for r in records if r.get("level") in ("error", "critical")]
    assert errors == [], errors


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ('GET "/ws/activity?token=abc123def" 101', "abc123def"),
        ("GET /x?a=1&api_key=k3y-v4lue&b=2", "k3y-v4lue"),
        ("headers: {'Authorization': 'Bearer s3cr3t.t0k'}", "s3cr3t.t0k"),
        ('{"authorization": "Basic dXNlcjpwYXNz"}', "dXNlcjpwYXNz"),
        ("upstream said: bearer abc.def-ghi", "abc.def-ghi"),
    ],
)
def test_redact_text_masks_tokens(line: str, secret: str) -> None:
    out = redact_text(line)
    assert secret not in out
    assert REDACTED in out


def test_configured_secrets_and_secret_keys_are_masked_everywhere() -> None:
    stream = io.StringIO()
    settings = Settings(api_token="literal-token-4242", llm_api_key="sk-live-77", _env_file=None)
    configure_logging(settings, log_format="json", log_level="INFO", stream=stream)
    try:
        log = structlog.get_logger("t")
        log.info("saw literal-token-4242 in a body", detail={"password": "hunter2", "n": 1})
        logging.getLogger("uvicorn.error").info("key sk-live-77 via %s", "stdlib")
        try:
            raise RuntimeError("failed with literal-token-4242")
        except RuntimeError:
            log.exception("boom")
        logging.getLogger("uvicorn.error").error(
            "ASGI callable returned without completing handshake."
        )
    finally:
        configure_logging(log_format="json", log_level="INFO", stream=sys.stderr)
    text = stream.getvalue()
    for secret in ("literal-token-4242", "sk-live-77", "hunter2"):
        assert secret not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert records[-1]["level"] == "info"
    assert len(records) == 4
