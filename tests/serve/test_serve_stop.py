"""SIGTERM stops ``tiffany serve`` cleanly with websockets on the activity feed, one mid-close.

Real processes: ``serve`` on loopback, a websocket client following
``/ws/activity``, and a second one that asked for the feed's backlog, stopped
reading, and sent its close frame: its close handshake is under way (the API
echoed the close) behind bytes it never takes. The API's shutdown meets that
websocket; ``serve`` must still exit 0 with no traceback, its children gone,
and the reading client told the service restarts (close 1012).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from process_support import alive, serve_argv, serve_json, wait_for
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

#: Runs of sleep steps submitted for a backlog larger than the socket buffers between
#: the API and a client that does not read (some 1,800 events, 400 KB).
RUNS = 4
STEPS = 100


def _post(url: str, doc: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(doc).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _send_queue_bytes(server_port: int, client_port: int) -> int | None:
    """The bytes the kernel holds unsent on the API's side of a loopback connection."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, queues = fields[1], fields[2], fields[4]
        if int(local.split(":")[1], 16) == server_port and (
            int(remote.split(":")[1], 16) == client_port
        ):
            return int(queues.split(":")[0], 16)
    return None


def _stalled_subscriber(port: int) -> socket.socket:
    """A websocket on ``/ws/activity?tail=10000`` with a small receive buffer that never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws/activity?tail=10000 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    return sock


def _send_close(sock: socket.socket) -> None:
    """Send a masked close frame (code 1000), as a client does."""
    mask = os.urandom(4)
    payload = struct.pack("!H", 1000)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    sock.sendall(bytes([0x88, 0x80 | len(payload)]) + mask + masked)


def test_sigterm_with_a_feed_websocket_mid_close_exits_0_without_a_traceback(
    tmp_path: Path,
) -> None:
    data, out_log, err_log = tmp_path / "data", tmp_path / "serve.out", tmp_path / "serve.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    # The stalled subscriber is not cut off meanwhile (a cutoff is a close of the API's own).
    env.update(TIFFANY_LOG_FORMAT="json", TIFFANY_WS_SEND_TIMEOUT_S="600")
    with out_log.open("wb") as out, err_log.open("wb") as err:
        proc = subprocess.Popen(serve_argv(data, 0), stdout=out, stderr=err, env=env)
    stalled: socket.socket | None = None
    try:

        def up() -> dict[str, Any] | None:
            assert proc.poll() is None, f"serve exited {proc.returncode}"
            return serve_json(data)

        doc = wait_for(up, 120, "serve to be up")
        url = str(doc["url"])
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        steps = [{"id": f"s{i}", "tool": "sleep", "args": {"seconds": 0}} for i in range(STEPS)]
        run_ids = [
            _post(url + "api/runs", {"name": f"backlog-{n}", "steps": steps})["run_id"]
            for n in range(RUNS)
        ]
        for run_id in run_ids:
            wait_for(
                lambda run_id=run_id: _get(url + f"api/runs/{run_id}")["status"] == "succeeded",
                120,
                "the backlog runs",
            )
        with connect(
            url.replace("http", "ws", 1) + "ws/activity?tail=1", open_timeout=30
        ) as reader:
            assert json.loads(reader.recv(timeout=30))["seq"] > 0  # subscribed

            stalled = _stalled_subscriber(port)
            client_port = stalled.getsockname()[1]
            # The API wrote until the socket buffers filled; the rest waits in its transport.
            wait_for(
                lambda: (_send_queue_bytes(port, client_port) or 0) > 32 * 1024,
                60,
                "the stalled subscriber's socket to fill",
            )
            _send_close(stalled)
            wait_for(
                lambda: b'"websocket closed"' in err_log.read_bytes(),
                60,
                "the API to take the stalled subscriber's close",
            )
            # Its connection is still there: the echo of its close waits behind its backlog.
            assert (_send_queue_bytes(port, client_port) or 0) > 0

            kids = [doc["api_pid"], *doc["engine_pids"]]
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
            with contextlib.suppress(ConnectionClosed):
                while True:  # the frames sent before the close
                    reader.recv(timeout=30)
            assert reader.protocol.close_rcvd is not None
            assert reader.protocol.close_rcvd.code == 1012  # service restart: reconnect later
    finally:
        if stalled is not None:
            stalled.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    errors = err_log.read_text()
    assert code == 0, errors[-5000:]
    assert "Traceback" not in errors, errors[-5000:]
    assert "stopped cleanly" in out_log.read_text()
    assert not any(alive(pid) for pid in kids)
    assert not (data / "serve.json").exists()
