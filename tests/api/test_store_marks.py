"""A PostgreSQL store's notifications wake the reads waiting for its mark; the API's async pool.

The projector notifies ``tiffany_projected`` with its new mark in the
statement that writes it; the API's watermark port listens
(:class:`tiffany.ports.watermark.PgWatermark`) besides asking its engine.
Against the real local PostgreSQL and a real Unix socket that plays an
engine too busy to answer.
"""

from __future__ import annotations

import asyncio
import socket
import time

import psycopg
import pytest
from api_support import short_dir

from tiffany.config import conninfo
from tiffany.ports.watermark import PgWatermark, SocketWatermark
from tiffany.store.models import PROJECTED_CHANNEL, channel
from tiffany.wire.control import socket_path
from tiffany.wire.shards import seq_base


async def _no_mark() -> int:
    return 0


def _silent_engine(home: object) -> socket.socket:
    """A control socket that accepts and never answers (an engine busy elsewhere)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path(home)))  # type: ignore[arg-type]
    listener.listen(8)
    return listener


async def _nobody(_run_id: str) -> int | None:
    return None


async def _until(check: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_notified_mark_wakes_a_read_the_engine_has_not_answered(pg_migrated_url: str) -> None:
    home = short_dir("tfm-")
    silent = _silent_engine(home)
    dsn = conninfo(pg_migrated_url)
    mine = channel(PROJECTED_CHANNEL, dsn)  # this store's schema's channel
    assert mine != PROJECTED_CHANNEL

    async def main() -> tuple[int, float, int]:
        marks = PgWatermark([home], lambda _engine: _no_mark(), dsn, engines_anywhere=False)
        marks.start()
        try:
            await _until(lambda: marks.listener.listening)
            read = asyncio.create_task(marks.wait(7, timeout=10.0))
            await asyncio.sleep(0.2)
            assert not read.done()  # the engine says nothing: the read waits
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("SELECT pg_notify(%s, %s)", (mine, "0 5"))
                await asyncio.sleep(0.2)
                assert not read.done()  # 5 does not cover 7
                # Another engine's mark (a store several engines share) wakes nothing here.
                await conn.execute("SELECT pg_notify(%s, %s)", (mine, "3 9"))
                await conn.execute("SELECT pg_notify(%s, %s)", (mine, "garbage"))
                # A Tiffany in another schema of the same database: not ours.
                await conn.execute("SELECT pg_notify(%s, %s)", (PROJECTED_CHANNEL, "0 9"))
                await asyncio.sleep(0.2)
                assert not read.done()
                t0 = time.monotonic()
                await conn.execute("SELECT pg_notify(%s, %s)", (mine, "0 8"))
                seen = await read
            return seen, time.monotonic() - t0, marks.marks[0].seq
        finally:
            await marks.close()

    try:
        seen, waited, mark = asyncio.run(main())
    finally:
        silent.close()
    assert seen == 8
    assert mark == 8
    assert waited < 5.0  # the notification, not the read's 10 s timeout


def test_on_the_postgresql_journal_a_read_waits_for_an_engine_of_another_host(
    pg_migrated_url: str,
) -> None:
    """No engine here, engine 3 elsewhere: its mark is made when named, its notification wakes."""
    home = short_dir("tfm-")  # no engine socket at all
    dsn = conninfo(pg_migrated_url)
    mine = channel(PROJECTED_CHANNEL, dsn)
    want = seq_base(3) + 7

    async def main() -> tuple[int, int, int]:
        marks = PgWatermark([home], lambda _engine: _no_mark(), dsn, engines_anywhere=True)
        marks.start()
        try:
            await _until(lambda: marks.listener.listening)
            read = asyncio.create_task(marks.wait(want, timeout=30.0))
            # Engine 3 learnt, asked (nobody answers here), its store mark read once:
            await _until(lambda: len(marks.marks) == 4 and marks.marks[3]._task is not None)
            await _until(lambda: marks.marks[3]._task.done())  # type: ignore[union-attr]
            assert not read.done()  # pushed: the read waits for the database's word
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("SELECT pg_notify(%s, %s)", (mine, f"3 {want + 1}"))
                seen = await read
            return seen, len(marks.marks), marks.marks[0].seq
        finally:
            await marks.close()

    seen, made, engine0 = asyncio.run(main())
    assert seen == want + 1
    assert made == 4  # engines 1 and 2 too: marks are made up to the engine named
    assert engine0 == 0  # engine 3's notification moved no other engine's mark


def test_with_the_engines_here_a_read_for_an_unknown_engine_ends_at_once(
    pg_migrated_url: str,
) -> None:
    """The file journal's engines are this host's: with none answering, the read ends behind."""
    home = short_dir("tfm-")
    marks = PgWatermark(
        [home], lambda _engine: _no_mark(), conninfo(pg_migrated_url), engines_anywhere=False
    )

    async def main() -> tuple[int, float]:
        t0 = time.monotonic()
        seen = await marks.wait(seq_base(3) + 7, timeout=30.0)
        return seen, time.monotonic() - t0

    seen, waited = asyncio.run(main())
    assert seen == 0  # behind: the API answers 503 store.behind
    assert waited < 10.0  # settled when no engine answered, not at the 30 s deadline
    assert len(marks.marks) == 1  # no mark made for an engine this host does not run


def test_without_a_postgresql_store_nothing_listens(tmp_path: object) -> None:
    marks = SocketWatermark([short_dir("tfm-")], lambda _engine: _no_mark())
    assert not hasattr(marks, "listener")


@pytest.mark.parametrize("payload", ["0 5", "12 345"])
def test_projected_mark_reads_engine_and_seq(payload: str) -> None:
    from tiffany.ports.pg import projected_mark

    engine, seq = payload.split()
    assert projected_mark(payload) == (int(engine), int(seq))
    assert projected_mark("x 5") is None
    assert projected_mark("5") is None


def test_a_statement_cancelled_mid_way_is_stopped_before_its_connection_serves_again(
    pg_migrated_url: str,
) -> None:
    """A read cancelled (its client went away): the server stops it, then the connection serves.

    psycopg cancels the statement on the server when its task is cancelled;
    the pool takes the connection back only if it is idle again (else it
    closes it), so the next read never meets the old one's results.
    """
    from tiffany.ports.pg import AsyncPool

    async def main() -> tuple[object, object]:
        pool = AsyncPool(conninfo(pg_migrated_url), 2, application_name="tiffany-test")
        try:
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")  # an idle connection, which slow() takes

            async def slow() -> None:
                async with pool.connection() as conn:
                    await conn.execute("SELECT pg_sleep(30)")

            task = asyncio.create_task(slow())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with pool.connection() as conn:
                one = await (await conn.execute("SELECT 1")).fetchone()
                sleeping = await (
                    await conn.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE query LIKE 'SELECT pg_sleep%' AND state = 'active'"
                    )
                ).fetchone()
            return one, sleeping
        finally:
            await pool.close()

    one, sleeping = asyncio.run(main())
    assert one == (1,)  # nothing of the cancelled statement pending on the connection
    assert sleeping == (0,)  # the cancelled statement is not running anywhere
    with psycopg.connect(conninfo(pg_migrated_url)) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tiffany-test'"
        ).fetchone()
    assert left == (0,)  # closed at the cancel and at the pool's close
