"""``WS /ws/activity`` against a real hub and feed server fed by hand, over real uvicorn.

The engine's side of the feed here is the real ``tiffany.feed`` hub and
``FeedServer`` on ``<data dir>/feed.sock``; the API is the real app under
uvicorn, with real websockets (and real TCP backpressure for the stalled
client).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from api_support import HandFeed, make_settings, wait_until, ws_connect, ws_recv_json


def _events(ws: Any, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Receive ``n`` events (pings skipped)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        frame = ws_recv_json(ws, max(0.1, deadline - time.monotonic()))
        if frame.get("type") == "ping":
            continue
        got.append(frame)
    return got


def _relay_has(live: Any, seq: int) -> bool:
    return live.state.relay.last_seq is not None and live.state.relay.last_seq >= seq


def _settings(data_dir: Path, **kw: Any) -> Any:
    return make_settings(data_dir, ws_ping_interval_s=kw.pop("ping", 0.5), **kw)


@pytest.fixture(params=[None, "websockets-sansio"], ids=["direct", "asgi"])
def ws_impl(request: pytest.FixtureRequest) -> str | None:
    """The API's own websockets (the relay writes frames itself), and plain ASGI sends."""
    return request.param


def test_live_events_arrive_in_order_and_resume_with_since(
    hand_feed, live_api_factory, ws_impl
) -> None:
    live = live_api_factory(_settings(hand_feed.data_dir), ws=ws_impl)
    wait_until(lambda: hand_feed.hub.subscribers == 1)  # the relay's one connection
    with ws_connect(f"{live.ws_base}/ws/activity") as ws:
        wait_until(lambda: len(live.state.relay.subscribers) == 1)
        seqs = hand_feed.publish(10)
        got = _events(ws, 10)
    assert [e["seq"] for e in got] == seqs
    assert got[0]["kind"] == "step"
    assert got[0]["v"] == 2
    # a reconnect with since gets exactly what came after it, from the API's ring
    with ws_connect(f"{live.ws_base}/ws/activity?since={seqs[3]}") as ws:
        got = _events(ws, 6)
        assert [e["seq"] for e in got] == seqs[4:]
        more = hand_feed.publish(2)
        assert [e["seq"] for e in _events(ws, 2)] == more
    # one engine subscription however many websockets
    assert hand_feed.hub.subscribers == 1


def test_tail_starts_with_the_recent_past(hand_feed, live_api_factory) -> None:
    live = live_api_factory(_settings(hand_feed.data_dir))
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    seqs = hand_feed.publish(10)
    wait_until(lambda: _relay_has(live, seqs[-1]))
    with ws_connect(f"{live.ws_base}/ws/activity?tail=4") as ws:
        got = _events(ws, 4)
        assert [e["seq"] for e in got] == seqs[-4:]
        more = hand_feed.publish(2)
        assert [e["seq"] for e in _events(ws, 2)] == more


def test_run_filter(hand_feed, live_api_factory, ws_impl) -> None:
    live = live_api_factory(_settings(hand_feed.data_dir), ws=ws_impl)
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    with ws_connect(f"{live.ws_base}/ws/activity?run_id=b") as ws:
        wait_until(lambda: len(live.state.relay.subscribers) == 1)
        hand_feed.publish(3, run_id="a")
        b = hand_feed.publish(2, run_id="b")
        hand_feed.publish(3, run_id="a")
        got = _events(ws, 2)
    assert [e["seq"] for e in got] == b
    assert {e["run_id"] for e in got} == {"b"}


def test_idle_websockets_get_pings(hand_feed, live_api_factory, ws_impl) -> None:
    live = live_api_factory(_settings(hand_feed.data_dir, ping=0.2), ws=ws_impl)
    with ws_connect(f"{live.ws_base}/ws/activity") as ws:
        assert ws_recv_json(ws, 5) == {"type": "ping"}


def test_an_api_restart_resumes_from_the_engines_ring(hand_feed, live_api_factory) -> None:
    # Events the API never saw (it was down): a resume fetches them from the
    # engine through a catch-up connection, then continues live without a gap.
    seqs = hand_feed.publish(20)
    live = live_api_factory(_settings(hand_feed.data_dir))
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    later = hand_feed.publish(3)
    wait_until(lambda: _relay_has(live, later[-1]))
    with ws_connect(f"{live.ws_base}/ws/activity?since={seqs[4]}") as ws:
        got = _events(ws, 15 + 3)
        assert [e["seq"] for e in got] == seqs[5:] + later
        live_seqs = hand_feed.publish(5)
        assert [e["seq"] for e in _events(ws, 5)] == live_seqs
    assert live.state.relay.catchups == 1
    wait_until(lambda: hand_feed.hub.subscribers == 1)  # the catch-up connection is gone


def test_a_catch_up_before_the_relay_saw_anything(hand_feed, live_api_factory) -> None:
    seqs = hand_feed.publish(5)
    live = live_api_factory(_settings(hand_feed.data_dir))
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    with ws_connect(f"{live.ws_base}/ws/activity?since={seqs[1]}") as ws:
        assert [e["seq"] for e in _events(ws, 3)] == seqs[2:]
        more = hand_feed.publish(4)
        assert [e["seq"] for e in _events(ws, 4)] == more


def test_a_resume_older_than_every_ring_gets_gone_then_live_events(api_dir, live_api_factory):
    from tiffany.feed import Hub
    from tiffany.feed.transport import FeedServer

    hub = Hub(ring_size=5, seq0=100)
    server = FeedServer(hub, api_dir / "feed.sock")
    server.start()
    feed = HandFeed(api_dir, hub, server)
    try:
        feed.publish(20)  # the engine's ring holds only the last 5
        live = live_api_factory(_settings(api_dir))
        wait_until(lambda: hub.subscribers == 1)
        with ws_connect(f"{live.ws_base}/ws/activity?since=101") as ws:
            first = _events(ws, 1)[0]
            assert first["type"] == "gone"
            assert "reload" in first["reason"]
            wait_until(lambda: len(live.state.relay.subscribers) == 1)
            more = feed.publish(3)
            assert [e["seq"] for e in _events(ws, 3)] == more
    finally:
        feed.server.stop()


def test_an_engine_restart_sends_gone_in_order_then_the_new_seqs(hand_feed, live_api_factory):
    live = live_api_factory(_settings(hand_feed.data_dir))
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    with ws_connect(f"{live.ws_base}/ws/activity") as ws:
        wait_until(lambda: len(live.state.relay.subscribers) == 1)
        old = hand_feed.publish(3)
        assert [e["seq"] for e in _events(ws, 3)] == old
        hand_feed.restart(seq0=50_000)  # a new engine: a new, empty ring, higher seqs
        wait_until(lambda: hand_feed.hub.subscribers == 1)
        new = hand_feed.publish(2)
        got = _events(ws, 3)
    assert got[0]["type"] == "gone"
    assert [e["seq"] for e in got[1:]] == new
    # a client resuming from before the restart gets the rest, the gap marked, the new ones
    with ws_connect(f"{live.ws_base}/ws/activity?since={old[0]}") as ws:
        got = _events(ws, 2 + 1 + 2)
    assert [e.get("seq") for e in got] == [old[1], old[2], None, *new]
    assert got[2]["type"] == "gone"
    assert live.state.relay.upstream_gone == 1


# -- backpressure --------------------------------------------------------------------


class StalledClient:
    """A websocket client on a raw socket that reads nothing until told to.

    A small receive buffer, and no reading: the server's writes back up
    into its own transport, exactly like a browser tab that stopped.
    """

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(1)  # byte by byte: leave the frames in the kernel
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head

    def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def frames(self, timeout: float = 20.0) -> list[tuple[int, bytes]]:
        """Read every frame until the server closes: ``[(opcode, payload)]``."""
        self.sock.settimeout(timeout)
        out = []
        while self._fill(2):
            b0, b1 = self.buf[0], self.buf[1]
            length, head = b1 & 0x7F, 2
            if length == 126:
                self._fill(4)
                length, head = struct.unpack(">H", self.buf[2:4])[0], 4
            elif length == 127:
                self._fill(10)
                length, head = struct.unpack(">Q", self.buf[2:10])[0], 10
            if not self._fill(head + length):
                break
            payload = self.buf[head : head + length]
            self.buf = self.buf[head + length :]
            out.append((b0 & 0x0F, payload))
            if b0 & 0x0F == 0x8:  # close
                break
        return out

    def close(self) -> None:
        self.sock.close()


def test_a_stalled_client_is_cut_off_while_another_keeps_receiving(
    hand_feed, live_api_factory, ws_impl
):
    settings = _settings(hand_feed.data_dir, ws_queue_frames=200, feed_ring_events=1000, ping=30)
    live = live_api_factory(settings, ws=ws_impl)
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    n = 3000
    received: list[int] = []

    with ws_connect(f"{live.ws_base}/ws/activity", max_size=None) as fast:
        stalled = StalledClient(live.port, "/ws/activity")
        try:
            wait_until(lambda: len(live.state.relay.subscribers) == 2)

            def read_fast() -> None:
                while len(received) < n:
                    frame = json.loads(fast.recv(timeout=30))
                    if "seq" in frame:
                        received.append(frame["seq"])

            reader = threading.Thread(target=read_fast)
            reader.start()
            seqs: list[int] = []
            for _ in range(n // 100):  # 3000 events of ~4 KiB: 12 MiB per client
                seqs += hand_feed.publish(100, pad=4000)
                # The fast client keeps up (here, by the publisher waiting for it: on a
                # loaded machine its reader thread may lag, and a client 200 frames
                # behind is, rightly, a stalled one); the stalled one never reads.
                wait_until(
                    lambda last=seqs[-1]: bool(received) and received[-1] >= last, timeout=60
                )
            reader.join(60)
            assert received == seqs  # the fast client got everything, in order
            wait_until(lambda: live.state.relay.dropped_subscribers == 1)
            assert len(live.state.relay.subscribers) == 1

            frames = stalled.frames()
        finally:
            stalled.close()

    texts = [json.loads(p) for op, p in frames if op == 0x1]
    events = [t["seq"] for t in texts if "seq" in t]
    cutoff = texts[-1]
    assert cutoff["type"] == "cutoff"
    assert events == seqs[: len(events)]  # a prefix, in order, no gap
    assert len(events) < n
    assert cutoff["last_seq"] == events[-1]  # resume point = the last one it got
    assert frames[-1][0] == 0x8
    assert struct.unpack(">H", frames[-1][1][:2])[0] == 1013  # try again later


def test_memory_of_the_relay_is_its_ring(hand_feed, live_api_factory) -> None:
    live = live_api_factory(
        _settings(hand_feed.data_dir, feed_ring_events=1000, ws_queue_frames=100)
    )
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    seqs = hand_feed.publish(3000)
    wait_until(lambda: _relay_has(live, seqs[-1]))
    ring = live.state.relay.ring
    assert len(ring) == ring.capacity < 3000
    assert live.state.relay.covers(seqs[-1000])
    assert not live.state.relay.covers(seqs[0])


@pytest.mark.parametrize(
    ("query", "field"),
    [("since=-1", "since"), ("since=abc", "since"), ("tail=-1", "tail"), ("batch=maybe", "batch")],
)
def test_bad_query_is_refused_with_a_422_naming_it(
    hand_feed, live_api_factory, ws_impl, query: str, field: str
) -> None:
    """As an HTTP request's bad query is (it was a bare 403: nothing said what was wrong)."""
    from websockets.exceptions import InvalidStatus

    live = live_api_factory(_settings(hand_feed.data_dir), ws=ws_impl)
    with pytest.raises(InvalidStatus) as refused, ws_connect(f"{live.ws_base}/ws/activity?{query}"):
        pass
    response = refused.value.response
    assert response.status_code == 422
    body = json.loads(response.body)
    assert body["code"] == "request.invalid"
    assert body["message"].startswith(f"query.{field}: ")
    assert body["detail"][0]["loc"] == ["query", field]


def test_batch_mode_sends_arrays_of_frames(hand_feed, live_api_factory, ws_impl) -> None:
    live = live_api_factory(_settings(hand_feed.data_dir, ping=0.3), ws=ws_impl)
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    with ws_connect(f"{live.ws_base}/ws/activity?batch=true") as ws:
        assert json.loads(ws.recv(timeout=5)) == [{"type": "ping"}]
        seqs = hand_feed.publish(1000)
        got: list[int] = []
        messages = 0
        while len(got) < 1000:
            frames = json.loads(ws.recv(timeout=10))
            assert isinstance(frames, list)
            messages += 1
            got += [f["seq"] for f in frames if "seq" in f]
    assert got == seqs
    assert messages < 1000  # many events a message


def test_a_relay_stuck_behind_the_engine_takes_the_live_feed_and_marks_the_gap(api_dir):
    """The relay's resume policy, with a scripted feed client in place of ``follow``."""
    import asyncio

    from tiffany.feed.relay import FeedRelay
    from tiffany.feed.transport import line_of
    from tiffany.feed.upstream import SocketFeed

    calls: list[int | None] = []

    async def scripted_follow(path, since=None, run_id=None):
        calls.append(since)
        if since is None and len(calls) == 1:
            yield [line_of({"seq": seq, "run_id": "r", "kind": "step"}) for seq in (1, 2, 3)]
            yield [line_of({"type": "cutoff", "last_seq": 3})]  # fell behind
        elif since == 3:
            yield [line_of({"type": "cutoff", "last_seq": 3})]  # cut off again at once
        else:
            yield [line_of({"seq": 100, "run_id": "r", "kind": "step"})]
            await asyncio.sleep(3600)

    async def scenario() -> list[tuple[float, str | None, str]]:
        relay = FeedRelay(SocketFeed([api_dir / "feed.sock"], lines_fn=scripted_follow))
        relay.start()
        for _ in range(200):
            if relay.last_seq == 100:
                break
            await asyncio.sleep(0.01)
        await relay.stop()
        return relay.ring.read(relay.ring.start, 100)

    entries = asyncio.run(scenario())
    assert calls == [None, 3, 3, None]
    keys = [e[0] for e in entries]
    assert keys == [1, 2, 3, 3.5, 100]
    assert json.loads(entries[3][2])["type"] == "gone"


def test_a_filtered_catch_up(hand_feed, live_api_factory) -> None:
    start = hand_feed.publish(1, run_id="a")[0]
    b1 = hand_feed.publish(3, run_id="b")
    hand_feed.publish(3, run_id="a")
    b2 = hand_feed.publish(2, run_id="b")
    live = live_api_factory(_settings(hand_feed.data_dir))
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    later_a = hand_feed.publish(2, run_id="a")
    wait_until(lambda: _relay_has(live, later_a[-1]))
    with ws_connect(f"{live.ws_base}/ws/activity?run_id=b&since={start}") as ws:
        got = _events(ws, 5)
        assert [e["seq"] for e in got] == b1 + b2
        hand_feed.publish(2, run_id="a")
        b3 = hand_feed.publish(1, run_id="b")
        assert [e["seq"] for e in _events(ws, 1)] == b3


def test_subscribers_beyond_the_cap_are_refused_with_1013(hand_feed, live_api_factory) -> None:
    from websockets.exceptions import ConnectionClosed

    live = live_api_factory(_settings(hand_feed.data_dir, ws_max_subscribers=2))
    with (
        ws_connect(f"{live.ws_base}/ws/activity"),
        ws_connect(f"{live.ws_base}/ws/activity"),
    ):
        wait_until(lambda: len(live.state.relay.subscribers) == 2)
        with (
            ws_connect(f"{live.ws_base}/ws/activity") as third,
            pytest.raises(ConnectionClosed) as closed,
        ):
            third.recv(timeout=5)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1013
        assert closed.value.rcvd.reason == "too many subscribers: try again later"
        assert live.state.relay.refused == 1
        assert len(live.state.relay.subscribers) == 2
    # a place freed is a place taken again
    wait_until(lambda: not live.state.relay.subscribers)
    with ws_connect(f"{live.ws_base}/ws/activity") as ws:
        seqs = hand_feed.publish(3)
        assert [e["seq"] for e in _events(ws, 3)] == seqs


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"ws_queue_bytes": 300_000, "ws_send_timeout_s": 60.0}, "queue full (bytes)"),
        ({"ws_queue_bytes": 10**9, "ws_send_timeout_s": 0.5}, "did not drain"),
    ],
)
def test_a_stalled_client_is_cut_off_by_its_byte_budget_or_send_deadline(
    hand_feed, live_api_factory, limits: dict[str, Any], reason: str
) -> None:
    settings = _settings(
        hand_feed.data_dir, ws_queue_frames=100_000, feed_ring_events=100_000, ping=30, **limits
    )
    live = live_api_factory(settings)
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    stalled = StalledClient(live.port, "/ws/activity")
    try:
        wait_until(lambda: len(live.state.relay.subscribers) == 1)
        for _ in range(40):  # up to 4,000 events of ~4 KiB: 16 MiB, beyond any socket buffer
            hand_feed.publish(100, pad=4000)
            time.sleep(0.02)
            if live.state.relay.dropped_subscribers:
                break
        wait_until(lambda: live.state.relay.dropped_subscribers == 1, timeout=20)
        assert not live.state.relay.subscribers
    finally:
        stalled.close()
    cut = list(live.state.relay.recent_cutoffs)
    assert len(cut) == 1
    assert reason in cut[0]


# -- a since beyond the feed, and what a cut-off reader gets ------------------------------


def _refusal(ws: Any) -> tuple[dict[str, Any], Any]:
    """The ``error`` frame a refused websocket gets, and the close that follows it."""
    from websockets.exceptions import ConnectionClosed

    frame = ws_recv_json(ws, 10)
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    return frame, closed.value.rcvd


def test_a_since_beyond_the_feed_is_refused_as_http_refuses_min_seq(
    hand_feed, live_api_factory, ws_impl
) -> None:
    """An error frame (the API's 422 shape) then close 4422; a since at the last seq is fine."""
    live = live_api_factory(_settings(hand_feed.data_dir), ws=ws_impl)
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    seqs = hand_feed.publish(5)
    wait_until(lambda: _relay_has(live, seqs[-1]))
    with ws_connect(f"{live.ws_base}/ws/activity?since={seqs[-1] + 1}") as ws:
        frame, close = _refusal(ws)
    assert frame["type"] == "error"
    assert frame["code"] == "feed.since_beyond"
    assert frame["status"] == 422
    assert frame["detail"] == [{"loc": ["query", "since"], "msg": "beyond the feed"}]
    assert (frame["since"], frame["last_seq"]) == (seqs[-1] + 1, seqs[-1])
    assert close.code == 4422
    assert str(seqs[-1]) in close.reason
    assert not live.state.relay.subscribers
    with ws_connect(f"{live.ws_base}/ws/activity?since={seqs[-1]}") as ws:
        wait_until(lambda: len(live.state.relay.subscribers) == 1)
        more = hand_feed.publish(2)
        assert [e["seq"] for e in _events(ws, 2)] == more


def test_a_since_ahead_of_the_relay_is_judged_by_the_engine(hand_feed, live_api_factory) -> None:
    """The relay has seen nothing (the API restarted): the engine's feed says where it is."""
    seqs = hand_feed.publish(5)
    live = live_api_factory(_settings(hand_feed.data_dir))
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    assert live.state.relay.last_seq is None
    with ws_connect(f"{live.ws_base}/ws/activity?since={seqs[-1] + 7}&batch=true") as ws:
        message = json.loads(ws.recv(timeout=10))
        assert isinstance(message, list)
        assert (message[0]["code"], message[0]["last_seq"]) == ("feed.since_beyond", seqs[-1])
    # The engine's last seq itself: taken, and live events follow.
    with ws_connect(f"{live.ws_base}/ws/activity?since={seqs[-1]}") as ws:
        wait_until(lambda: len(live.state.relay.subscribers) == 1)
        more = hand_feed.publish(3)
        assert [e["seq"] for e in _events(ws, 3)] == more


def test_a_stalled_reader_gets_its_backlog_then_cutoff_then_1013(
    hand_feed, live_api_factory
) -> None:
    """Cut off by the send deadline while its socket is full, it reads on: all, cutoff, close.

    The reader reads only once the API is done with it (its websocket
    handler has ended): the frames were queued behind the backlog.
    """
    from websockets.exceptions import ConnectionClosed

    settings = _settings(
        hand_feed.data_dir,
        ws_queue_frames=100_000,
        ws_queue_bytes=10**9,
        feed_ring_events=100_000,
        ws_send_timeout_s=0.5,
        ws_cutoff_linger_s=120.0,
        ping=30,
    )
    live = live_api_factory(settings)
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    sock = socket.create_connection(("127.0.0.1", live.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sent: list[int] = []
    with ws_connect(
        f"{live.ws_base}/ws/activity",
        sock=sock,
        max_queue=(4, 0),
        max_size=None,
        ping_interval=None,
    ) as ws:
        wait_until(lambda: len(live.state.relay.subscribers) == 1)
        for _ in range(40):  # up to 4,000 events of ~4 KiB: beyond every buffer on the way
            sent += hand_feed.publish(100, pad=4000)
            wait_until(lambda: _relay_has(live, sent[-1]))  # noqa: B023
            if live.state.relay.dropped_subscribers:
                break
        wait_until(lambda: live.state.relay.dropped_subscribers == 1, timeout=30)
        assert "did not drain" in live.state.relay.recent_cutoffs[-1]
        wait_until(lambda: not live.server.server_state.tasks, timeout=30)  # handler ended
        got: list[dict[str, Any]] = []
        closed = None
        while closed is None:
            try:
                got.append(json.loads(ws.recv(timeout=30)))
            except ConnectionClosed as exc:
                closed = exc
    events = [f["seq"] for f in got if "seq" in f]
    assert events == sent[: len(events)]  # a prefix, in order, no gap
    assert got[-1]["type"] == "cutoff"
    assert got[-1]["last_seq"] == events[-1]
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1013


def test_a_cut_off_socket_that_never_reads_is_reset_and_freed(hand_feed, live_api_factory):
    """What the docs say it gets: no cutoff, no close frame (1006); the API lets it go."""
    settings = _settings(
        hand_feed.data_dir,
        ws_queue_frames=100_000,
        ws_queue_bytes=10**9,
        feed_ring_events=100_000,
        ws_send_timeout_s=0.5,
        ws_cutoff_linger_s=0.5,
        ping=30,
    )
    live = live_api_factory(settings)
    wait_until(lambda: hand_feed.hub.subscribers == 1)
    stalled = StalledClient(live.port, "/ws/activity")
    try:
        wait_until(lambda: len(live.state.relay.subscribers) == 1)
        for _ in range(40):
            seqs = hand_feed.publish(100, pad=4000)
            wait_until(lambda: _relay_has(live, seqs[-1]))  # noqa: B023
            if live.state.relay.dropped_subscribers:
                break
        wait_until(lambda: live.state.relay.dropped_subscribers == 1, timeout=30)
        # The connection is let go ws_cutoff_linger_s after the cutoff, not held until read.
        wait_until(lambda: not live.server.server_state.connections, timeout=30)
        try:
            frames = stalled.frames()
        except ConnectionResetError:
            frames = []
    finally:
        stalled.close()
    texts = [json.loads(p) for op, p in frames if op == 0x1]
    assert all(t.get("type") != "cutoff" for t in texts)
    assert all(op != 0x8 for op, _ in frames)
