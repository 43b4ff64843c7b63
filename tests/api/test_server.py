"""``python -m tiffany.api``: ready file with the bound port, JSON logs, clean SIGTERM/SIGINT."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from api_support import clean_env, make_settings, serve_in_thread, wait_until

from tiffany.api.server import KEEP_ALIVE_S


def _start(data_dir: Path, ready: Path, *after: Path) -> subprocess.Popen[bytes]:
    env = clean_env()
    env["TIFFANY_LOG_FORMAT"] = "json"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tiffany.api",
            "--data-dir",
            str(data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            *(a for path in after for a in ("--after", str(path))),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def _signal(proc: subprocess.Popen[bytes], sig: int, timeout: float = 30) -> str:
    """Send ``sig`` and wait for the process to exit; its stderr (SIGKILL if it does not)."""
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return err.decode()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_api_process_reports_its_url_and_stops_cleanly(api_dir, sig) -> None:
    ready = api_dir / "api.json"
    proc = _start(api_dir, ready)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid
        assert info["url"].startswith("http://127.0.0.1:")
        assert not info["url"].endswith(":0/")
        with urllib.request.urlopen(info["url"] + "healthz", timeout=5) as res:
            assert json.loads(res.read()) == {"ok": True}
        with pytest.raises(urllib.error.HTTPError) as http_error:
            urllib.request.urlopen(info["url"] + "api/runs/run-x", timeout=5)
        assert http_error.value.code == 503  # no engine, no store
        time.sleep(0.1)
    finally:
        err = _signal(proc, sig)
    assert proc.returncode == 0, err
    assert not ready.exists()
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    events = [line["event"] for line in lines]
    assert "api.listening" in events
    assert "api.stopped" in events
    # uvicorn's own lines go through the same JSON renderer
    assert any(line.get("logger", "").startswith("uvicorn") for line in lines)
    request = next(line for line in lines if line["event"] == "request")
    assert request["path"] == "/api/runs/run-x"
    assert request["run_id"] == "run-x"  # bound for every line of that request
    assert request["status"] == 503


def test_a_sigterm_during_start_up_is_not_lost(api_dir) -> None:
    ready = api_dir / "api.json"
    proc = _start(api_dir, ready)
    # as soon as the process has set its handlers (it logs nothing before
    # uvicorn starts), a SIGTERM must not be lost
    time.sleep(0.8)
    err = _signal(proc, signal.SIGTERM)
    # 0 once our handlers are in place; killed by the default one before that
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert not ready.exists()


def test_an_api_started_with_its_engines_listens_only_once_they_are_up(api_dir) -> None:
    """``serve`` starts the API with the engines, ``--after`` their ready files."""
    ready, engines = api_dir / "api.json", [api_dir / "e0.json", api_dir / "e1.json"]
    proc = _start(api_dir, ready, *engines)
    try:
        time.sleep(3)  # its imports take about a second
        assert proc.poll() is None
        assert not ready.exists()
        engines[0].write_text("{}")
        time.sleep(0.5)
        assert not ready.exists()
        engines[1].write_text("{}")
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=30)
        url = json.loads(ready.read_text())["url"]
        with urllib.request.urlopen(url + "healthz", timeout=5) as res:
            assert json.loads(res.read()) == {"ok": True}
    finally:
        err = _signal(proc, signal.SIGTERM)
    assert proc.returncode == 0, err


def test_a_sigterm_while_the_api_waits_for_its_engines_stops_it(api_dir) -> None:
    ready = api_dir / "api.json"
    proc = _start(api_dir, ready, api_dir / "never.json")
    # Its handlers are in place once it says it waits (a fixed sleep raced a
    # loaded machine's interpreter start: the default action killed it, -15).
    killer = threading.Timer(120, proc.kill)
    killer.start()
    try:
        first = b""
        for line in proc.stderr or ():
            first += line
            if b"api.waiting_for_engines" in line:
                break
    finally:
        killer.cancel()
    assert b"api.waiting_for_engines" in first, first.decode()
    err = _signal(proc, signal.SIGTERM, timeout=30)
    assert proc.returncode == 0, first.decode() + err
    assert not ready.exists()


def test_a_submission_logs_one_request_line_that_names_its_run(engine) -> None:
    from fastapi.testclient import TestClient
    from structlog.contextvars import merge_contextvars
    from structlog.testing import capture_logs

    from tiffany.api.app import create_app

    plan = {"name": "logged", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}
    with (
        TestClient(create_app(make_settings(engine.data_dir))) as client,
        capture_logs(processors=[merge_contextvars]) as logs,
    ):
        answer = client.post("/api/runs", json={"plan": plan})
    assert answer.status_code == 201, answer.text
    run_id = answer.json()["run_id"]
    mine = [line for line in logs if line.get("run_id") == run_id]
    assert [line["event"] for line in mine] == ["request"]
    assert mine[0]["status"] == 201
    assert mine[0]["created"] is True
    assert mine[0]["plan"] == "logged"
    assert mine[0]["method"] == "POST"


def test_an_idle_connection_outlives_the_clients_own_idle_expiry(api_dir) -> None:
    """A keep-alive connection idle for longer than httpx's 5 s expiry is still served.

    So a client's pool drops an idle connection before the server does, and
    never sends a request on one the server is closing.
    """
    import httpx

    idle_s = httpx.Limits().keepalive_expiry
    assert idle_s is not None
    assert idle_s < KEEP_ALIVE_S
    live = serve_in_thread(make_settings(api_dir))
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().read()
        sock = conn.sock
        time.sleep(idle_s + 1)
        conn.request("GET", "/healthz")  # the same connection, if the server kept it
        answer = conn.getresponse()
        assert answer.status == 200
        assert conn.sock is sock, "the server had closed the connection"
    finally:
        conn.close()
        live.stop()


def test_a_client_gone_mid_body_is_a_499_line_not_an_error(api_dir, caplog) -> None:
    """A client that closes its connection halfway through a body is not a server error."""
    import socket

    from structlog.contextvars import merge_contextvars
    from structlog.testing import capture_logs

    live = serve_in_thread(make_settings(api_dir))
    try:
        with capture_logs(processors=[merge_contextvars]) as logs:
            with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
                sock.sendall(
                    b"POST /api/runs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n" + b'{"plan": {"na'
                )
                time.sleep(0.2)  # the route is reading the body
            lines = wait_until(lambda: [ln for ln in logs if ln.get("path") == "/api/runs"])
    finally:
        live.stop()
    assert [(ln["event"], ln.get("status")) for ln in lines] == [("request", 499)]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


def _server_send_buffer(port: int, client: tuple[str, int]) -> int:
    """The kernel send buffer of the API's side of the connection from ``client`` (``ss``)."""
    out = subprocess.run(
        ["ss", "-tmnH", "state", "established", f"( sport = :{port} and dport = :{client[1]} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.search(r"\btb(\d+)", out)
    assert found, out
    return int(found.group(1))


def test_only_websockets_have_a_bounded_send_buffer(api_dir) -> None:
    # The feed bounds a websocket's kernel send buffer (a client that never
    # reads blocks early). Set on the listening socket, every HTTP connection
    # inherited it: a 20 MB run page downloaded at 2 MB/s on loopback.
    from websockets.sync.client import connect

    from tiffany.feed.wsdirect import SOCKET_SEND_BUFFER_BYTES

    ready = api_dir / "api.json"
    proc = _start(api_dir, ready)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        port = int(json.loads(ready.read_text())["url"].rsplit(":", 1)[1].strip("/"))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b'{"ok":true}'
        http_buffer = _server_send_buffer(port, conn.sock.getsockname())
        with connect(f"ws://127.0.0.1:{port}/ws/activity", open_timeout=10) as ws:
            ws_buffer = _server_send_buffer(port, ws.socket.getsockname())
        conn.close()
    finally:
        _signal(proc, signal.SIGTERM)
    assert ws_buffer == 2 * SOCKET_SEND_BUFFER_BYTES  # the kernel doubles what it is given
    assert http_buffer > 2 * SOCKET_SEND_BUFFER_BYTES  # the kernel's own, tuned as it sends
