"""The PAL feed over a real Unix socket: resume across API and engine restarts."""

from __future__ import annotations

import asyncio
import time

from tiffany.pal import Hub
from tiffany.pal.transport import FeedServer, follow


def _publish(hub: Hub, n: int, run_id: str = "r1") -> None:
    for i in range(n):
        hub.publish("step", run_id=run_id, task_id=i, label=f"#{i}")
    hub.drain()


async def _take(path, n, since=None, run_id=None, timeout=5.0):
    got = []

    async def run():
        async for frame in follow(path, since=since, run_id=run_id):
            got.append(frame)
            if len(got) >= n:
                return

    await asyncio.wait_for(run(), timeout)
    return got


def test_feed_streams_events_and_resumes_without_gaps_after_an_api_restart(tmp_path):
    hub = Hub(seq0=100)
    server = FeedServer(hub, tmp_path / "pal.sock")
    server.start()
    try:
        _publish(hub, 5)
        first = asyncio.run(_take(tmp_path / "pal.sock", 3, since=99))
        assert [f["seq"] for f in first] == [100, 101, 102]
        # the API restarts and resumes from what it had
        _publish(hub, 3)
        rest = asyncio.run(_take(tmp_path / "pal.sock", 5, since=first[-1]["seq"]))
        assert [f["seq"] for f in rest] == [103, 104, 105, 106, 107]
    finally:
        server.stop()


def test_feed_filters_by_run(tmp_path):
    hub = Hub(seq0=1)
    server = FeedServer(hub, tmp_path / "pal.sock")
    server.start()
    try:
        _publish(hub, 3, "a")
        _publish(hub, 3, "b")
        got = asyncio.run(_take(tmp_path / "pal.sock", 3, since=0, run_id="b"))
        assert {f["run_id"] for f in got} == {"b"}
        assert [f["seq"] for f in got] == [4, 5, 6]
    finally:
        server.stop()


def test_an_engine_restart_gives_gone_then_the_new_events(tmp_path):
    path = tmp_path / "pal.sock"
    hub = Hub(seq0=1)
    server = FeedServer(hub, path)
    server.start()
    _publish(hub, 2)

    async def scenario():
        frames = []

        async def consume():
            async for frame in follow(path, since=0):
                frames.append(frame)
                if frame.get("type") == "gone" or len(frames) >= 10:
                    return

        task = asyncio.create_task(consume())
        while len(frames) < 2:
            await asyncio.sleep(0.02)
        # the engine dies and comes back with a new hub (a new ring)
        server.stop()
        hub2 = Hub(seq0=10_000)
        _publish(hub2, 3)
        server2 = FeedServer(hub2, path)
        server2.start()
        try:
            await asyncio.wait_for(task, 5)
        finally:
            server2.stop()
        return frames

    frames = asyncio.run(scenario())
    assert [f.get("seq") for f in frames[:2]] == [1, 2]
    assert frames[-1] == {"type": "gone", "oldest": 10_000}


def test_a_client_that_never_reads_is_cut_off_and_others_go_on(tmp_path):
    import socket as so

    hub = Hub(seq0=1)
    server = FeedServer(hub, tmp_path / "pal.sock")
    server.start()
    try:
        stalled = so.socket(so.AF_UNIX, so.SOCK_STREAM)
        stalled.setsockopt(so.SOL_SOCKET, so.SO_RCVBUF, 4096)
        stalled.connect(str(tmp_path / "pal.sock"))
        stalled.sendall(b'{"since": null}\n')
        time.sleep(0.2)
        for _ in range(40):
            _publish(hub, 500)
        deadline = time.monotonic() + 5
        while hub.subscribers and time.monotonic() < deadline:
            _publish(hub, 100)
            time.sleep(0.05)
        assert hub.dropped_subscribers >= 1
        fresh = asyncio.run(_take(tmp_path / "pal.sock", 2, since=hub.last_seq - 2))
        assert [f["seq"] for f in fresh] == [hub.last_seq - 1, hub.last_seq]
        stalled.close()
    finally:
        server.stop()
