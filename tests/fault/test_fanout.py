"""Fair fan-out: stalled websocket subscribers beside reading ones, on a real ``tiffany serve``.

Finding 6 of the reliability review: 200 websockets that never read made 40
submissions take 40 s instead of 0.8 s, and nothing capped the subscribers.
Here a real ``serve`` (engine, projector and API processes on 127.0.0.1)
gets stalled subscribers (raw sockets with a 4 KiB receive buffer that
complete the websocket handshake and never read again) and reading ones
(the ``websockets`` client, one event a message), up to its subscriber cap,
then a load of runs. What must hold (no timing is asserted: latency is
``bench/fanout.py``'s):

* subscriber cap + 1 is accepted and closed at once with code 1013 and a
  reason, and the refusal is logged as a warning, not an error;
* every submission succeeds;
* every stalled subscriber is cut off by the send deadline and its
  connection closed; the API lets go of it (its subscriber count drops);
* every reading subscriber receives every event, in order, without a gap
  (or a ``cutoff`` it resumes from with ``since``);
* the API's RSS stays bounded.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_support import terminate
from process_support import wait_for as _wait

from tiffany.feed import SEQS_PER_RECORD

STALLED = 100
READERS = 20
CAP = STALLED + READERS
RUNS = 12
#: Steps a run: each makes some nine events, so the stalled sockets' buffers fill.
STEPS = 30
SEND_TIMEOUT_S = 2.0
#: The API's RSS may not grow beyond this, in MB (it starts near 80 MB).
RSS_LIMIT_MB = 300


def _clean_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.update(TIFFANY_LOG_FORMAT="json", TIFFANY_WAL_FSYNC="batch", **settings)
    return env


@contextlib.contextmanager
def _serve(**settings: str) -> Iterator[dict[str, Any]]:
    data_dir = Path(tempfile.mkdtemp(prefix="tfo-", dir="/tmp"))
    log_path = data_dir / "serve.log"
    argv = [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data_dir), "--port", "0"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, env=_clean_env(**settings), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        ready = data_dir / "serve.json"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(ready.read_text())
                break
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.05)
        yield {**info, "log": log_path, "data_dir": data_dir}
    finally:
        terminate(proc, 30)
        shutil.rmtree(data_dir, ignore_errors=True)


def _log(path: Path, event: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            rec = json.loads(line)
            if rec.get("event") == event:
                out.append(rec)
    return out


def _events(path: Path, part: str) -> collections.Counter[str]:
    """How many lines of each event whose name holds ``part`` (a failure's context)."""
    seen: collections.Counter[str] = collections.Counter()
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and part in line:
            event = str(json.loads(line).get("event"))
            if part in event:
                seen[event] += 1
    return seen


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _stalled(base: str) -> socket.socket:
    """A websocket on /ws/activity that completes its handshake and never reads again."""
    host, port = base.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws/activity HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # not a byte of the stream beyond the head
        assert chunk, "the server closed a stalled websocket's handshake"
        head += chunk
    assert b" 101 " in head.split(b"\r\n", 1)[0], head
    return sock


class Reader(threading.Thread):
    """A websocket client that reads every event; resumes with ``since`` after a cutoff."""

    def __init__(self, ws_base: str) -> None:
        super().__init__(daemon=True)
        self.ws_base = ws_base
        self.seqs: list[int] = []
        self.wal_seqs: list[int] = []
        self.cutoffs = 0
        self.connected = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from websockets.exceptions import ConnectionClosed
        from websockets.sync.client import connect

        try:
            while not self.stop.is_set():
                url = self.ws_base + "ws/activity"
                if self.seqs:
                    url += f"?since={self.seqs[-1]}"
                with connect(url, proxy=None, compression=None, max_size=None) as ws:
                    self.connected.set()
                    with contextlib.suppress(ConnectionClosed):
                        while not self.stop.is_set():
                            try:
                                frame = json.loads(ws.recv(timeout=0.5))
                            except TimeoutError:
                                continue
                            if "seq" in frame:
                                self.seqs.append(frame["seq"])
                                self.wal_seqs.append(frame["wal_seq"])
                            elif frame.get("type") == "cutoff":
                                self.cutoffs += 1
                                break
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_stalled_subscribers_are_cut_off_and_readers_get_every_event() -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    settings = {
        "TIFFANY_WS_MAX_SUBSCRIBERS": str(CAP),
        "TIFFANY_WS_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S),
    }
    with _serve(**settings) as info:
        base = info["url"]
        ws_base = "ws://" + base.split("//", 1)[1]
        api_pid = int(info["api_pid"])
        rss_before = _rss_mb(api_pid)

        readers = [Reader(ws_base) for _ in range(READERS)]
        for r in readers:
            r.start()
        for r in readers:
            assert r.connected.wait(30), r.error
        stalled = [_stalled(base) for _ in range(STALLED)]
        _wait(
            lambda: _metric(base, "tiffany_api_feed_subscribers") == CAP,
            30,
            "every subscriber attached",
        )

        # one more: refused with 1013 and a reason, logged as a warning
        with (
            connect(ws_base + "ws/activity", proxy=None, compression=None) as extra,
            pytest.raises(ConnectionClosed) as closed,
        ):
            extra.recv(timeout=10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1013
        assert "too many subscribers" in closed.value.rcvd.reason
        refusals = _log(info["log"], "websocket refused: too many subscribers")
        assert [r["level"] for r in refusals] == ["warning"]

        # the load: every submission succeeds
        plan = {
            "name": "fanout",
            "steps": [
                {"id": f"s{i}", "tool": "sleep", "args": {"seconds": 0}} for i in range(STEPS)
            ],
        }
        body = json.dumps({"plan": plan}).encode()
        run_ids = []
        for _ in range(RUNS):
            req = urllib.request.Request(
                base + "api/runs", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=60) as resp:
                assert resp.status == 201
                answer = json.loads(resp.read())
                run_ids.append((answer["run_id"], answer["seq"]))

        def finished() -> bool:
            for run_id, seq in run_ids:
                read = base + f"api/runs/{run_id}?min_seq={seq}"  # never a 404 for a run just made
                with urllib.request.urlopen(read, timeout=10) as resp:
                    if json.loads(resp.read())["status"] != "succeeded":
                        return False
            return True

        _wait(finished, 120, "every run finished")

        # the stalled ones: cut off by the send deadline, the API lets go of them
        _wait(
            lambda: _metric(base, "tiffany_api_feed_subscribers") <= READERS,
            60,
            "the stalled subscribers cut off",
        )

        # The relay lets go of a subscriber (the gauge drops) before its handler
        # has stopped the sender and logged the cut: the lines follow shortly.
        def reasons() -> collections.Counter[str]:
            cut = _log(info["log"], "websocket cut off")
            return collections.Counter(str(r.get("reason")) for r in cut)

        def drained() -> int:
            return sum(n for reason, n in reasons().items() if "did not drain" in reason)

        with contextlib.suppress(AssertionError):  # judged below, with what the log shows
            _wait(lambda: drained() >= STALLED, 30, "the cut-offs logged")
        assert drained() >= STALLED, (reasons(), _events(info["log"], "websocket"))
        assert _log(info["log"], "websocket sender failed") == []
        assert _rss_mb(api_pid) < max(RSS_LIMIT_MB, rss_before + 150)

        # their connections are closed: reading one to its end finds EOF, with no
        # more than the socket buffers held (no ring of events per subscriber)
        for sock in stalled:
            sock.settimeout(20)
            total = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(1 << 16):
                    total += len(chunk)
            assert total < 2_000_000
            sock.close()

        # the readers: every event, in order, no gap; then the last one
        _wait(lambda: all(r.seqs for r in readers), 10, "events at every reader")
        time.sleep(1.0)
        last_seq = max(r.seqs[-1] for r in readers)
        _wait(
            lambda: all(r.seqs and r.seqs[-1] == last_seq for r in readers),
            30,
            "every reader at the last event",
        )
        for r in readers:
            r.stop.set()
        for r in readers:
            r.join(10)
            assert r.error is None, r.error
            assert r.seqs == sorted(set(r.seqs)), "a repeat or out of order"
            # seq = max(previous + 1, wal_seq * SEQS_PER_RECORD) (tiffany/feed/events.py)
            steps = zip(r.seqs, r.seqs[1:], r.wal_seqs[1:], strict=False)
            assert all(s == max(a + 1, w * SEQS_PER_RECORD) for a, s, w in steps), "a gap"
        # all attached before the load: every reader got the very same events
        assert all(r.seqs[-1000:] == readers[0].seqs[-1000:] for r in readers)
        assert len(readers[0].seqs) >= RUNS * STEPS
