"""Reconnects of the feed's clients (tenacity): transient errors retried with backoff,
deterministic ones raised at once. Real Unix sockets; a hand-written server where the
engine's would not misbehave."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import msgspec
import pytest

from tiffany.feed.relay import FeedRelay
from tiffany.feed.transport import (
    MAX_RECONNECT_DELAY_S,
    RECONNECT_DELAY_S,
    FeedClosed,
    Reconnects,
    follow,
    is_transient,
)
from tiffany.feed.upstream import SocketFeed


class GarbageServer:
    """A Unix socket server that answers every hello with a line that is not JSON."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.recv(4096)
                conn.sendall(b"this is not json\n")

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


def test_transient_means_the_engine_is_away_not_a_bad_frame() -> None:
    assert is_transient(ConnectionRefusedError())
    assert is_transient(ConnectionResetError())
    assert is_transient(FileNotFoundError())  # the socket file: the engine is restarting
    assert is_transient(FeedClosed())
    assert not is_transient(PermissionError())
    assert not is_transient(msgspec.DecodeError("bad"))
    assert not is_transient(ValueError("bad"))


def test_backoff_grows_to_its_cap_and_starts_over_after_progress() -> None:
    waits: list[float] = []
    policy = Reconnects(on_retry=lambda exc, wait: waits.append(wait), sleep=_no_sleep)
    failures = iter([True] * 5 + [False] + [True, "stop"])

    async def scenario() -> None:
        async for attempt in policy.attempts():
            with attempt:
                step = next(failures)
                if step == "stop":
                    return
                if step is False:
                    policy.progressed(attempt)  # this connection delivered, then ended
                raise ConnectionRefusedError("no engine")

    asyncio.run(asyncio.wait_for(scenario(), 30))
    first = [RECONNECT_DELAY_S * 2**i for i in range(5)]
    assert waits[:5] == [min(w, MAX_RECONNECT_DELAY_S) for w in first]
    assert waits[4] == MAX_RECONNECT_DELAY_S
    assert waits[5:] == [RECONNECT_DELAY_S, RECONNECT_DELAY_S * 2]


def test_at_once_skips_one_wait() -> None:
    waits: list[float] = []
    policy = Reconnects(on_retry=lambda exc, wait: waits.append(wait))
    n = 0

    async def scenario() -> None:
        nonlocal n
        async for attempt in policy.attempts():
            with attempt:
                n += 1
                if n == 3:
                    return
                if n == 1:
                    policy.at_once()
                raise FeedClosed()

    asyncio.run(scenario())
    assert waits == [0.0, RECONNECT_DELAY_S * 2]


def test_follow_reconnects_until_the_engine_comes_up(tmp_path: Path) -> None:
    from tiffany.feed import Hub
    from tiffany.feed.transport import FeedServer

    path = tmp_path / "pal.sock"

    async def scenario() -> dict:
        async def first():
            async for frame in follow(path, since=0):
                return frame

        task = asyncio.create_task(first())
        await asyncio.sleep(0.5)  # refused / no socket: retried meanwhile
        assert not task.done()
        hub = Hub(seq0=1)
        hub.publish("step", run_id="r", task_id=1, label="x")
        hub.drain()
        server = FeedServer(hub, path)
        server.start()
        try:
            return await asyncio.wait_for(task, 10)
        finally:
            server.stop()

    assert asyncio.run(scenario())["seq"] == 1


def test_follow_raises_a_deterministic_failure_at_once(tmp_path: Path) -> None:
    server = GarbageServer(tmp_path / "pal.sock")
    try:

        async def scenario() -> None:
            async for _ in follow(server.path, since=0):
                pass

        with pytest.raises(msgspec.DecodeError):
            asyncio.run(asyncio.wait_for(scenario(), 10))
    finally:
        server.close()
    assert server.connections == 1  # not retried


def test_the_relay_stops_and_reports_instead_of_resuming_into_the_same_failure(
    tmp_path: Path,
) -> None:
    server = GarbageServer(tmp_path / "pal.sock")

    async def scenario() -> FeedRelay:
        relay = FeedRelay(SocketFeed([server.path]))
        relay.start()
        for _ in range(500):
            if relay.failed is not None:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(RECONNECT_DELAY_S * 2)  # time a retry would have taken
        await relay.stop()
        return relay

    try:
        relay = asyncio.run(scenario())
    finally:
        server.close()
    assert relay.failed is not None
    assert "DecodeError" in relay.failed
    assert relay.connected is False
    assert server.connections == 1
