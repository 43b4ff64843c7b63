"""The activity feed between hosts: PostgreSQL LISTEN/NOTIFY against NATS (core and JetStream).

    python bench/feed_transport.py [--rate 20000] [--seconds 10]

An engine's hub drains its events every 5 ms and hands each subscriber a
batch of encoded events (``tiffany/feed/hub.py``); across hosts, a batch
must travel through something both sides reach. This script publishes
real PAL frames (a 2-step run's events, ~330 bytes each) at ``--rate``
events/s in 5 ms batches for ``--seconds``, from a publisher process, to
one subscriber in this process, through:

- **PostgreSQL NOTIFY**: one ``pg_notify`` per batch (split under the 8,000
  byte payload limit), on a connection of its own; the subscriber LISTENs.
- **NATS core**: one message per batch, at most once, no history.
- **NATS JetStream**: one message per batch into a stream (file storage),
  publish acknowledged; the subscriber is an ordered push consumer, which
  can resume from a stream sequence after a disconnect.

Printed per transport: events delivered / published, the delivered rate,
and the lag from the batch's publish to its arrival (p50, p99, max). The
targets are issue 10's feed targets: 20,000 events/s with p99 lag under
250 ms and nothing lost while the subscriber keeps up.

Needs the local PostgreSQL (``TIFFANY_BENCH_PG``) and NATS with JetStream
(``TIFFANY_BENCH_NATS``, default ``nats://127.0.0.1:4222``); ``nats-py`` is
in the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_URL = os.environ.get("TIFFANY_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
NATS_URL = os.environ.get("TIFFANY_BENCH_NATS", "nats://127.0.0.1:4222")
BATCH_S = 0.005
NOTIFY_LIMIT = 7_900
CHANNEL = "tiffany_bench_feed"
SUBJECT = "tiffany.bench.feed"


def _frames(n: int) -> list[bytes]:
    """``n`` PAL frames as an engine encodes them (msgspec, schema v2)."""
    from tiffany.feed.events import Event, encode_event

    kinds = ["spawned", "step", "blocked", "woke", "tool.started", "tool.finished", "exit"]
    return [
        encode_event(
            Event(
                seq=1_000_000 + i,
                wal_seq=1 + i // 4,
                ts=0.0,
                kind=kinds[i % len(kinds)],
                task_id=i % 50,
                ltid=i % 7,
                run_id=f"run-{i // 40:012x}",
                task=f"worker:step{i % 7}",
                task_kind="worker",
                step_id=f"step{i % 7}",
                label="sleep 0.05s",
                data={"attempt": 1},
            )
        )
        for i in range(n)
    ]


def _batches(frames: list[bytes], per_batch: int, limit: int | None) -> list[list[bytes]]:
    """The hub's batches, each split so that a joined message stays under ``limit``."""
    out: list[list[bytes]] = []
    for i in range(0, len(frames), per_batch):
        batch, size, part = frames[i : i + per_batch], 0, []
        for frame in batch:
            if limit is not None and part and size + len(frame) + 1 > limit:
                out.append(part)
                part, size = [], 0
            part.append(frame)
            size += len(frame) + 1
        if part:
            out.append(part)
    return out


# -- the publisher (a process of its own) ---------------------------------------------------


def publish(transport: str, rate: int, seconds: float) -> None:
    """Publish ``rate`` events/s for ``seconds`` in 5 ms batches, paced on the clock."""
    per_batch = max(1, int(rate * BATCH_S))
    total = int(rate * seconds)
    frames = _frames(total)
    limit = NOTIFY_LIMIT if transport == "notify" else None
    batches = _batches(frames, per_batch, limit)
    # Pace whole hub batches: the split parts of one go out together.
    per_tick = max(1, round(len(batches) / (seconds / BATCH_S)))
    if transport == "notify":
        import psycopg

        from tiffany.wal.pg import conninfo

        with psycopg.connect(conninfo(PG_URL), autocommit=True) as conn:
            _paced(
                batches,
                per_tick,
                lambda b: conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, _message(b).decode())),
            )
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, "END"))
        return
    asyncio.run(_publish_nats(transport, batches, per_tick))


async def _publish_nats(transport: str, batches: list[list[bytes]], per_tick: int) -> None:
    import nats

    nc = await nats.connect(NATS_URL)
    js = nc.jetstream() if transport == "jetstream" else None
    start = time.perf_counter()
    for i in range(0, len(batches), per_tick):
        due = start + (i // per_tick) * BATCH_S
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        for batch in batches[i : i + per_tick]:
            if js is not None:
                await js.publish(SUBJECT, _message(batch))
            else:
                await nc.publish(SUBJECT, _message(batch))
    if js is not None:
        await js.publish(SUBJECT, b"END")
    else:
        await nc.publish(SUBJECT, b"END")
    await nc.flush()
    await nc.close()


def _paced(batches: list[list[bytes]], per_tick: int, send: Any) -> None:
    start = time.perf_counter()
    for i in range(0, len(batches), per_tick):
        due = start + (i // per_tick) * BATCH_S
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        for batch in batches[i : i + per_tick]:
            send(batch)


def _message(batch: list[bytes]) -> bytes:
    """A batch on the wire: its publish time, then the frames, one a line."""
    now = time.time()  # noqa: TID251 - lag between processes: the wall clock both read
    return f"{now:.6f}\n".encode() + b"\n".join(batch)


# -- the subscriber (this process) ----------------------------------------------------------


def _take(text: bytes, lags: list[float]) -> int:
    head, _, body = text.partition(b"\n")
    lags.append(time.time() - float(head))  # noqa: TID251 - see _message
    n = 0
    for line in body.split(b"\n"):
        json.loads(line)  # the subscriber decodes what it relays
        n += 1
    return n


async def _subscribe_notify(started: asyncio.Event, lags: list[float]) -> int:
    import psycopg

    from tiffany.wal.pg import conninfo

    got = 0
    conn = await psycopg.AsyncConnection.connect(conninfo(PG_URL), autocommit=True)
    async with conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        started.set()
        async for note in conn.notifies():
            if note.payload == "END":
                return got
            got += _take(note.payload.encode(), lags)
    return got


async def _subscribe_nats(transport: str, started: asyncio.Event, lags: list[float]) -> int:
    import nats

    got = 0
    done = asyncio.Event()
    nc = await nats.connect(NATS_URL)

    async def on_msg(msg: Any) -> None:
        nonlocal got
        if msg.data == b"END":
            done.set()
            return
        got += _take(msg.data, lags)

    if transport == "jetstream":
        js = nc.jetstream()
        stream = "TIFFANY_BENCH_FEED"
        with contextlib.suppress(Exception):  # absent on the first run
            await js.delete_stream(stream)
        await js.add_stream(name=stream, subjects=[SUBJECT], storage="file")
        await js.subscribe(SUBJECT, cb=on_msg, ordered_consumer=True)
    else:
        await nc.subscribe(SUBJECT, cb=on_msg)
    await nc.flush()
    started.set()
    await done.wait()
    if transport == "jetstream":
        await nc.jetstream().delete_stream("TIFFANY_BENCH_FEED")
    await nc.close()
    return got


async def _measure(transport: str, rate: int, seconds: float) -> dict[str, Any]:
    lags: list[float] = []
    started = asyncio.Event()
    if transport == "notify":
        task = asyncio.create_task(_subscribe_notify(started, lags))
    else:
        task = asyncio.create_task(_subscribe_nats(transport, started, lags))
    await started.wait()
    t0 = time.perf_counter()
    pub = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--publish",
        transport,
        "--rate",
        str(rate),
        "--seconds",
        str(seconds),
    )
    got = await asyncio.wait_for(task, seconds * 4 + 30)
    wall = time.perf_counter() - t0
    await pub.wait()
    lags.sort()
    return {
        "published": int(rate * seconds),
        "delivered": got,
        "rate": got / wall,
        "p50": statistics.median(lags) * 1000,
        "p99": lags[int(len(lags) * 0.99) - 1] * 1000,
        "max": lags[-1] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--publish", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        publish(args.publish, args.rate, args.seconds)
        return
    print(f"{args.rate:,} events/s for {args.seconds:g} s in 5 ms batches; {os.cpu_count()} CPUs")
    print(
        f"{'transport':<16} {'delivered':>19} {'events/s':>9} {'lag p50 ms':>10} "
        f"{'p99 ms':>8} {'max ms':>8}"
    )
    for transport in ("notify", "nats", "jetstream"):
        r = asyncio.run(_measure(transport, args.rate, args.seconds))
        name = {"notify": "PG NOTIFY", "nats": "NATS core", "jetstream": "NATS JetStream"}
        print(
            f"{name[transport]:<16} {r['delivered']:>9,} / {r['published']:<9,} "
            f"{r['rate']:>9,.0f} {r['p50']:>10.1f} {r['p99']:>8.1f} {r['max']:>8.1f}"
        )


if __name__ == "__main__":
    main()
