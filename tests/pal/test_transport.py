"""The PAL feed over a real Unix socket: resume across API and engine restarts."""

from __future__ import annotations

import asyncio
import time

from tiffany.feed import Hub
from tiffany.feed.transport import FeedServer, follow


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


def test_follow_lines_reassembles_frames_split_across_reads(tmp_path):
    """Frames cut at any byte (and one far larger than a read) come out whole, in order;
    pings are dropped and a cutoff ends the stream."""
    import json

    from tiffany.feed.transport import follow_lines

    path = tmp_path / "split.sock"
    big = "x" * 200_000  # more than one 64 KiB read
    frames = [{"seq": i, "run_id": "r", "label": big if i == 3 else f"#{i}"} for i in range(1, 6)]
    wire = b"".join(
        json.dumps(f).encode() + b"\n"
        for f in [*frames[:2], {"type": "ping"}, *frames[2:], {"type": "cutoff", "last_seq": 5}]
    )

    async def scenario():
        hello = asyncio.get_running_loop().create_future()

        async def serve(reader, writer):
            hello.set_result(json.loads(await reader.readline()))
            for i in range(0, len(wire), 7_777):  # odd cuts, mid-frame
                writer.write(wire[i : i + 7_777])
                await writer.drain()
                await asyncio.sleep(0)
            writer.close()

        server = await asyncio.start_unix_server(serve, path=str(path))
        async with server:
            got = [item async for batch in follow_lines(path, since=7) for item in batch]
        return await hello, got

    hello, got = asyncio.run(scenario())
    assert hello == {"since": 7, "run_id": None}
    heads = [head for head, _ in got]
    assert [h.seq for h in heads] == [1, 2, 3, 4, 5, None]
    assert heads[-1].type == "cutoff"
    assert [json.loads(text) for _, text in got[:5]] == frames  # passed on as written
