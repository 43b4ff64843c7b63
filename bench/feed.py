"""The activity feed under load: 100 websocket subscribers and a stalled one.

    python bench/feed.py                    # ~20,000 events/s for 10 s, both modes (~1 min)
    python bench/feed.py --quick            # 2 s of load per mode (a smoke run)
    python bench/feed.py --events 5000 --subscribers 20 --seconds 20 --mode frames

Each mode runs on a fresh ``tiffany serve`` (as ``bench/api.py`` starts it:
127.0.0.1, port 0, fsync ``batch``, watchdog threshold 20 ms) and opens
``--subscribers`` websockets to ``/ws/activity`` (every event, no run filter;
the ``websockets`` client, without compression) plus one **stalled**
subscriber: a raw socket with a 4 KiB receive buffer that completes the
websocket handshake and never reads again, so the server's sends to it
block and it falls behind. Modes, side by side: ``one event a message`` (the
feed as the dashboard reads it) and ``batch=true`` (``/ws/activity?batch=true``:
a JSON array of up to 512 frames a message).

Load: runs of a fan-out plan of ``--steps`` ``sleep 0`` steps (9 events a
step: the worker's and its tool's spawned, step, blocked, woke, exit...),
submitted over ``POST /api/runs`` at a fixed rate, open loop. A warm-up run
measures the events one run produces; the rate is ``--events`` / that. The
engine's events/s come from its ``metrics`` (the hub's ``published``) and
from what the subscribers received.

Measured per subscriber: messages and events received, delivered events/s,
missing events (schema v2: each seq is ``max(previous + 1, wal_seq *
SEQS_PER_RECORD)``, so a seq above that rule's is a hole: see
:func:`missing_before`), cutoff frames and closes. Lag per event: the time it was received
here minus its ``ts`` (the wall clock when the engine's loop published it),
p50/p99/max over every event of every subscriber (a histogram with
1/16-octave buckets, max exact). The stalled subscriber's socket is read at
the end: a ``cutoff`` frame, a close frame or the connection closed count as
told; the API's count of cut-off websockets rising by more than the other
subscribers' cutoffs counts as dropped by the relay. The engine's longest
dispatch and its dispatches over 20 ms come from the control ``metrics`` op
and the watchdog's log; the engine cutting the API's relay off, from the
API's log. A per-second timeline shows where the events pile up.

Everything runs on the same machine: the subscribers share the CPUs with the
engine and the API; ``cpu`` gives each process's share of one core and what
every other process on the machine used. A client near 100% means the
figures measure the client too.

Targets: feed lag p99 < 250 ms; the stalled subscriber cut off without
hurting the others; no dispatch over 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import json
import math
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import websockets

from tiffany.feed.events import SEQS_PER_RECORD

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from api import (  # noqa: E402
    SLOW_DISPATCH_S,
    Pool,
    Serve,
    Table,
    build_request,
    describe_slow,
    header,
    machine_busy_s,
    ms,
)

EVENTS_PER_S = 20_000
SUBSCRIBERS = 100
SECONDS = 10.0
QUICK_SECONDS = 2.0
STEPS = 100
#: Targets.
TARGET_LAG_P99_S = 0.250
#: How long the subscribers get to catch up after the last run finished, in seconds.
CATCH_UP_S = 20.0
#: The stalled subscriber's socket receive buffer, in bytes.
STALLED_RCVBUF = 4096
#: Histogram resolution: buckets per octave.
PER_OCTAVE = 16


def fanout_plan(steps: int) -> dict[str, Any]:
    return {
        "name": "bench-feed",
        "steps": [{"id": f"s{i}", "tool": "sleep", "args": {"seconds": 0}} for i in range(steps)],
    }


def wall() -> float:
    return time.time()  # noqa: TID251 - events carry wall-clock ts; lag is measured against it


def missing_before(last_seq: int, seq: int, wal_seq: int) -> int:
    """Events of the unfiltered feed lost between ``last_seq`` and ``seq`` (-1: out of order).

    The hub gives an event ``max(previous seq + 1, wal_seq * SEQS_PER_RECORD)``
    (``tiffany/feed/events.py``), so the events of one WAL record are
    consecutive and a hole among them is counted exactly; an event lost
    alone in its record leaves no trace (a lower bound, then).
    """
    expected = max(last_seq + 1, wal_seq * SEQS_PER_RECORD)
    return -1 if seq < expected else seq - expected


class Frame(msgspec.Struct):
    """The fields of a feed frame the benchmark reads."""

    seq: int | None = None
    wal_seq: int = 0
    ts: float | None = None
    type: str | None = None
    last_seq: int | None = None


_decode = msgspec.json.Decoder(Frame).decode
_decode_batch = msgspec.json.Decoder(list[Frame]).decode


class LagHistogram:
    """Log-spaced buckets (1/PER_OCTAVE octave) from 1 us; exact max."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.max = 0.0

    def add(self, lag: float) -> None:
        k = int(math.log2(lag * 1e6) * PER_OCTAVE) if lag > 1e-6 else 0
        self.counts[k] = self.counts.get(k, 0) + 1
        self.n += 1
        if lag > self.max:
            self.max = lag

    def merge(self, other: LagHistogram) -> None:
        for k, c in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + c
        self.n += other.n
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding the q-quantile (nan when empty)."""
        if not self.n:
            return math.nan
        rank = q * self.n
        seen = 0
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen >= rank:
                return min(2 ** ((k + 1) / PER_OCTAVE) / 1e6, self.max)
        return self.max


class Subscriber:
    """One websocket on ``/ws/activity`` and what it received."""

    def __init__(self, index: int, batch: bool = False) -> None:
        self.index = index
        self.batch = batch
        self.messages = 0
        self.count = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.missing = 0
        self.out_of_order = 0
        self.gaps: list[tuple[int, int, float]] = []
        self.first_t = 0.0
        self.last_t = 0.0
        self.cutoff: Frame | None = None
        self.cutoff_t = 0.0
        self.close_code: int | None = None
        self.other_frames = 0
        self.lag = LagHistogram()
        self.last_ts = 0.0
        self.connected = asyncio.Event()
        self.error: str | None = None

    async def run(self, url: str) -> None:
        try:
            async with websockets.connect(
                url, compression=None, max_size=None, ping_interval=None, open_timeout=60
            ) as ws:
                self.connected.set()
                async for msg in ws:
                    self.on_message(msg)
        except websockets.ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd is not None else None
        except (OSError, TimeoutError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.connected.set()

    def on_message(self, msg: str | bytes) -> None:
        now = wall()
        self.messages += 1
        if self.batch:
            for f in _decode_batch(msg):
                self.on_frame(f, now)
        else:
            self.on_frame(_decode(msg), now)

    def on_frame(self, f: Frame, now: float) -> None:
        seq = f.seq
        if seq is None:
            if f.type == "cutoff":
                self.cutoff = f
                self.cutoff_t = now
            elif f.type != "ping":
                self.other_frames += 1
            return
        last = self.last_seq
        if last is None:
            self.first_seq = seq
            self.first_t = now
        elif (lost := missing_before(last, seq, f.wal_seq)) > 0:
            self.missing += lost
            if len(self.gaps) < 5:
                self.gaps.append((last, seq, now))
        elif lost < 0:
            self.out_of_order += 1
        self.last_seq = seq
        self.last_t = now
        self.count += 1
        if f.ts is not None:
            self.lag.add(now - f.ts)
            self.last_ts = f.ts

    @property
    def cut(self) -> bool:
        return self.cutoff is not None or self.close_code is not None


class StalledSubscriber:
    """A websocket that completes its handshake and then never reads."""

    def __init__(self, url: str, query: str = "") -> None:
        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STALLED_RCVBUF)
        self.sock.settimeout(30)
        self.sock.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /ws/activity{query} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(1)  # byte by byte: not a byte of the stream beyond the head
            if not chunk:
                raise ConnectionError("the server closed the stalled websocket's handshake")
            buf += chunk
        if b" 101 " not in buf.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {buf[:200]!r}")
        self.backlog = b""

    def read_all(self, idle_s: float = 3.0) -> dict[str, Any]:
        """Read what the server sent (at the end); report cutoff, close and EOF."""
        self.sock.settimeout(idle_s)
        data = bytearray()
        eof = reset = False
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            except ConnectionResetError:
                reset = True
                break
            if not chunk:
                eof = True
                break
            data += chunk
        self.sock.close()
        events = 0
        cutoff: dict[str, Any] | None = None
        close_code: int | None = None
        pos = 0
        while pos + 2 <= len(data):
            b0, b1 = data[pos], data[pos + 1]
            n, pos = b1 & 0x7F, pos + 2
            if n == 126:
                if pos + 2 > len(data):
                    break
                (n,) = struct.unpack_from("!H", data, pos)
                pos += 2
            elif n == 127:
                if pos + 8 > len(data):
                    break
                (n,) = struct.unpack_from("!Q", data, pos)
                pos += 8
            if pos + n > len(data):
                break
            payload = bytes(data[pos : pos + n])
            pos += n
            opcode = b0 & 0x0F
            if opcode == 1:
                with contextlib.suppress(ValueError):
                    doc = json.loads(payload)
                    for frame in doc if isinstance(doc, list) else [doc]:
                        if frame.get("type") == "cutoff":
                            cutoff = frame
                        elif "seq" in frame:
                            events += 1
            elif opcode == 8:
                close_code = struct.unpack_from("!H", payload)[0] if len(payload) >= 2 else 1005
        return {
            "bytes": len(data),
            "events": events,
            "cutoff": cutoff,
            "close_code": close_code,
            "eof": eof,
            "reset": reset,
        }


def prom_value(text: str, name: str, label: str = "") -> float:
    """A sample's value from Prometheus text (the first line naming it, with ``label``)."""
    for line in text.splitlines():
        if line.startswith(name) and label in line and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    return math.nan


async def get_text(pool: Pool, path: str) -> str:
    status, body = await pool.request(build_request("GET", pool.hostport, path))
    return body.decode() if status == 200 else ""


async def wait_idle(serve: Serve, timeout: float) -> float:
    """Wait until the engine has no run active; return how long it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        m = await asyncio.to_thread(serve.metrics)
        if m["tiffany_runs_active"] == 0:
            return time.monotonic() - t0
        await asyncio.sleep(0.1)
    return math.nan


async def submit_open_loop(
    pool: Pool, raw: bytes, rate: float, seconds: float, errors: list[str]
) -> int:
    """POST runs at ``rate`` per second for ``seconds``; return how many were accepted."""
    loop = asyncio.get_running_loop()
    n = max(1, round(rate * seconds))
    accepted = 0
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        nonlocal accepted
        try:
            status, body = await pool.request(raw)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            errors.append(type(exc).__name__)
            return
        if status == 201:
            accepted += 1
        else:
            errors.append(f"HTTP {status}: {body[:100]!r}")

    t0 = loop.time()
    for i in range(n):
        delay = t0 + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(set(tasks), timeout=60)
    return accepted


def iso_s(record: dict[str, Any]) -> float:
    """A log record's ISO timestamp as epoch seconds."""
    stamp = str(record.get("timestamp", "")).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp() if stamp else math.nan


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    """min / median / max of values."""
    if not values:
        return "n/a"
    v = sorted(values)
    return "/".join(fmt.format(x) for x in (v[0], v[len(v) // 2], v[-1]))


async def bench(args: argparse.Namespace, batch: bool) -> dict[str, Any]:
    """One scenario on a fresh ``tiffany serve``; return its figures (printed by :func:`report`)."""
    env = {"TIFFANY_WS_QUEUE_FRAMES": str(args.queue_frames)} if args.queue_frames else {}
    query = "?batch=true" if batch else ""
    with Serve(env=env, keep=args.keep) as serve:
        print(
            f"\n[{mode_name(batch)}] tiffany serve: {serve.url} (data dir {serve.data_dir})",
            flush=True,
        )
        ws_url = serve.url.replace("http://", "ws://") + "ws/activity" + query
        pool = Pool(serve.url)
        subs = [Subscriber(i, batch) for i in range(args.subscribers)]
        tasks = [asyncio.create_task(s.run(ws_url)) for s in subs]
        await asyncio.wait_for(asyncio.gather(*(s.connected.wait() for s in subs)), 120)
        failed = [s.error for s in subs if s.error]
        if failed:
            raise RuntimeError(f"{len(failed)} subscribers failed to connect: {failed[:3]}")
        stalled = await asyncio.to_thread(StalledSubscriber, serve.url, query)
        await asyncio.sleep(0.5)
        m_conn = await asyncio.to_thread(serve.metrics)

        # Warm-up and calibration: the events one run of the plan produces.
        plan = fanout_plan(args.steps)
        raw = build_request(
            "POST", pool.hostport, "/api/runs", json.dumps({"plan": plan, "inputs": {}}).encode()
        )
        m0 = await asyncio.to_thread(serve.metrics)
        errors: list[str] = []
        await submit_open_loop(pool, raw, 1, 1, errors)
        await wait_idle(serve, 60)
        await asyncio.sleep(0.2)  # the hub drains every 5 ms
        m1 = await asyncio.to_thread(serve.metrics)
        per_run = m1["tiffany_feed_published_total"] - m0["tiffany_feed_published_total"]
        rate = args.events / max(per_run, 1)
        print(
            f"[{mode_name(batch)}] plan: fan-out of {args.steps} x sleep 0 = {per_run} events "
            f"per run; {rate:.1f} runs/s for {args.seconds:g} s -> target {args.events:,.0f} "
            f"events/s; {args.subscribers} subscribers + 1 stalled",
            flush=True,
        )
        serve.slow_dispatches()

        # The load.
        counts0 = [s.count for s in subs]
        cpu0 = (*serve.cpu(), time.process_time(), machine_busy_s())
        t0 = time.monotonic()
        w0 = wall()
        dropped: list[tuple[float, float]] = []
        timeline: list[list[str]] = []

        async def sample() -> None:
            text = await get_text(pool, "/metrics")
            relayed0 = prom_value(text, "tiffany_api_feed_events_total")
            last = (
                wall(),
                m1["tiffany_feed_published_total"],
                relayed0,
                sum(s.count for s in subs),
            )
            cpu_last = (*serve.cpu(), time.process_time(), machine_busy_s())
            while True:
                await asyncio.sleep(1.0)
                text = await get_text(pool, "/metrics")
                now = wall()
                published = prom_value(text, "tiffany_feed_published_total")
                relayed = prom_value(text, "tiffany_api_feed_events_total")
                delivered = sum(s.count for s in subs)
                dropped.append(
                    (now, prom_value(text, "tiffany_api_feed_dropped_subscribers_total"))
                )
                dt = now - last[0]
                cpu_now = (*serve.cpu(), time.process_time(), machine_busy_s())
                shares = [(b - a) / dt for a, b in zip(cpu_last, cpu_now, strict=True)]
                shares[3] = max(0.0, shares[3] - sum(shares[:3]))
                cpu_share = "/".join(f"{c:.0%}" for c in shares)
                cpu_last = cpu_now
                behind = sorted(now - s.last_ts for s in subs if s.last_ts and not s.cut)
                timeline.append(
                    [
                        f"{now - w0:.0f}",
                        f"{(published - last[1]) / dt:,.0f}",
                        f"{(relayed - last[2]) / dt:,.0f}" if last[2] == last[2] else "",
                        f"{(delivered - last[3]) / dt / max(1, len(subs)):,.0f}",
                        f"{(delivered - last[3]) / dt:,.0f}",
                        f"{behind[len(behind) // 2]:.2f}" if behind else "n/a",
                        str(sum(1 for s in subs if s.cut)),
                        cpu_share,
                    ]
                )
                last = (now, published, relayed, delivered)

        poller = asyncio.create_task(sample())
        accepted = await submit_open_loop(pool, raw, rate, args.seconds, errors)
        load_s = time.monotonic() - t0
        cpu1 = (*serve.cpu(), time.process_time(), machine_busy_s())
        m2 = await asyncio.to_thread(serve.metrics)
        idle_s = await wait_idle(serve, 300)
        m3 = await asyncio.to_thread(serve.metrics)
        # Every event since the subscribers connected (the engine publishes nothing idle).
        expected = m3["tiffany_feed_published_total"] - m_conn["tiffany_feed_published_total"]
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline:
            if all(s.count >= expected for s in subs if not s.cut):
                break
            await asyncio.sleep(0.1)
        caught_up_s = time.monotonic() - t0 - load_s
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await asyncio.sleep(0.5)
        stall = await asyncio.to_thread(stalled.read_all)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pool.close()
        records = serve.log_records("kernel.slow_dispatch", "the engine cut the API's feed off")
        slow_records = [r for r in records if r.get("event") == "kernel.slow_dispatch"]
        relay_cuts = [r for r in records if r.get("event") != "kernel.slow_dispatch"]

    # -- figures
    published = m3["tiffany_feed_published_total"] - m1["tiffany_feed_published_total"]
    engine_rate = (m2["tiffany_feed_published_total"] - m1["tiffany_feed_published_total"]) / load_s
    best = max(subs, key=lambda s: s.count)
    seq_rate = math.nan
    if best.first_seq is not None and best.last_t > best.first_t:
        seq_rate = best.count / (best.last_t - best.first_t)
    lag = LagHistogram()
    for s in subs:
        lag.merge(s.lag)
    received = [s.count - c for s, c in zip(subs, counts0, strict=True)]
    per_sub_rate = [
        (s.count - c) / (s.last_t - w0) if s.last_t > w0 else 0.0
        for s, c in zip(subs, counts0, strict=True)
    ]
    cut = [s for s in subs if s.cut]
    gapfree = [s for s in subs if not s.missing and not s.out_of_order]
    complete = [s for s in subs if not s.cut and s.count >= expected]
    cpu = [(b - a) / load_s for a, b in zip(cpu0, cpu1, strict=True)]
    cpu[3] = max(0.0, cpu[3] - sum(cpu[:3]))
    stalled_told = bool(stall["cutoff"] or stall["close_code"] or stall["eof"] or stall["reset"])
    drops = [d for _, d in dropped if d == d]
    first_drop = next((t - w0 for t, d in dropped if d == d and drops and d > drops[0]), math.nan)
    # The API's count of cut-off websockets, less ours: the stalled one, if it rose.
    relay_dropped_stalled = bool(drops) and drops[-1] - drops[0] > len(cut)
    stalled_cut = stalled_told or relay_dropped_stalled

    rows = [
        ("runs accepted / errors", f"{accepted} / {len(errors)}"),
        ("websocket messages per sub min/med/max", spread([float(s.messages) for s in subs])),
        ("events published (load + drain)", f"{published:,}"),
        ("engine events/s while loading (hub)", f"{engine_rate:,.0f}"),
        ("events/s received (best subscriber)", f"{seq_rate:,.0f}"),
        ("runs finished after the load", f"{idle_s:.1f} s"),
        (
            "live subscribers had every event after",
            "n/a (all cut off)"
            if all(s.cut for s in subs)
            else f"{caught_up_s:.1f} s"
            if all(s.count >= expected for s in subs if not s.cut)
            else f"never (waited {CATCH_UP_S:g} s)",
        ),
        ("delivered events/s per sub min/med/max", spread(per_sub_rate)),
        ("delivered events/s, all subscribers", f"{sum(per_sub_rate):,.0f}"),
        ("events received per sub min/med/max", spread([float(r) for r in received])),
        (
            "lag p50 / p99 / max, ms",
            f"{ms(lag.quantile(0.5))} / {ms(lag.quantile(0.99))} / {ms(lag.max)}",
        ),
        (
            "worst subscriber's lag p99, ms",
            ms(max((s.lag.quantile(0.99) for s in subs), default=math.nan)),
        ),
        ("gap-free subscribers", f"{len(gapfree)} of {len(subs)}"),
        ("missing events (all subscribers)", f"{sum(s.missing for s in subs):,}"),
        ("subscribers cut off (not the stalled one)", f"{len(cut)} of {len(subs)}"),
        ("subscribers with every event", f"{len(complete)} of {len(subs)}"),
        (
            "stalled: cutoff frame / close / EOF",
            f"{'yes' if stall['cutoff'] else 'no'} / "
            f"{stall['close_code'] or 'no'} / {'yes' if stall['eof'] or stall['reset'] else 'no'}",
        ),
        ("stalled: dropped by the API relay", "yes" if relay_dropped_stalled else "no"),
        ("stalled: events it had buffered", f"{stall['events']:,} ({stall['bytes']:,} B)"),
        (
            "engine cut the API's relay off",
            f"{len(relay_cuts)} times"
            + (f", first at {iso_s(relay_cuts[0]) - w0:.1f} s" if relay_cuts else ""),
        ),
        (
            "API cut-off count rose after",
            f"{first_drop:.1f} s" if first_drop == first_drop else "never",
        ),
        (
            "engine longest dispatch (cumulative)",
            f"{ms(m3['tiffany_loop_max_dispatch_seconds'])} ms",
        ),
        (
            "dispatches > 20 ms during load + drain",
            str(
                m3["tiffany_loop_slow_dispatch_seconds_count"]
                - m1["tiffany_loop_slow_dispatch_seconds_count"]
            ),
        ),
        ("cpu engine / API / this client / others", "/".join(f"{c:.0%}" for c in cpu)),
    ]
    notes = [f"    {line}" for line in describe_slow(slow_records)]
    for s in cut[:3]:
        notes.append(
            f"  sub {s.index}: cut off after {s.count:,} events "
            f"(cutoff last_seq {s.cutoff.last_seq if s.cutoff else None}, "
            f"close {s.close_code}, at {s.cutoff_t - w0:.1f} s)"
        )
    if len(cut) > 3:
        notes.append(f"  ... and {len(cut) - 3} more subscribers cut off")
    if errors:
        notes.append(f"  submit errors: {errors[:5]}")
    gone = sum(s.other_frames for s in subs)
    if gone:
        notes.append(f"  control frames other than cutoff/ping (gone): {gone}")
    for s in [s for s in subs if s.gaps][:3]:
        gaps = ", ".join(f"between {a} and {b} at {t - w0:.1f} s" for a, b, t in s.gaps)
        notes.append(f"  sub {s.index} missed {s.missing:,} events: {gaps}")
    if cpu[2] > 0.9:
        notes.append("  this client used a whole core: its own receive cost is in the figures")
    slow = (
        m3["tiffany_loop_slow_dispatch_seconds_count"]
        - m1["tiffany_loop_slow_dispatch_seconds_count"]
    )
    verdicts = {
        "lag p99 < 250 ms": lag.quantile(0.99) < TARGET_LAG_P99_S,
        "stalled cut off": stalled_cut,
        "others unhurt": not cut and len(gapfree) == len(subs),
        "no dispatch > 20 ms": slow == 0,
    }
    return {
        "rows": rows,
        "timeline": timeline,
        "notes": notes,
        "verdicts": verdicts,
        "events_per_run": per_run,
        "engine_events_per_s": engine_rate,
        "seq_rate": seq_rate,
        "lag_p50": lag.quantile(0.5),
        "lag_p99": lag.quantile(0.99),
        "lag_max": lag.max,
        "per_sub_rate": per_sub_rate,
        "cut": len(cut),
        "gap_free": len(gapfree),
        "stalled": stall,
        "max_dispatch_s": m3["tiffany_loop_max_dispatch_seconds"],
        "slow_dispatches": slow,
        "cpu": cpu,
    }


def mode_name(batch: bool) -> str:
    return "batch=true" if batch else "one event a message"


def report(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    """Print the scenarios side by side, then each one's timeline and notes."""
    modes = list(results)
    print(
        f"\nActivity feed: {args.subscribers} websockets + 1 stalled, every event, "
        f"target {args.events:,.0f} events/s for {args.seconds:g} s; lag = receive time - "
        f"event ts; targets: lag p99 < {TARGET_LAG_P99_S * 1000:.0f} ms, the stalled one cut "
        f"off without hurting the others, no dispatch > {SLOW_DISPATCH_S * 1000:.0f} ms"
    )
    first = 44
    table = Table(
        ["figure".ljust(first), *modes], widths=[first] + [max(24, len(m)) for m in modes]
    )
    for i, (name, _) in enumerate(results[modes[0]]["rows"]):
        table.row([name.ljust(first), *(results[m]["rows"][i][1] for m in modes)])
    for name in results[modes[0]]["verdicts"]:
        table.row(
            [f"target: {name}".ljust(first)]
            + ["met" if results[m]["verdicts"][name] else "MISSED" for m in modes]
        )
    for mode in modes:
        r = results[mode]
        print(
            f"\n[{mode}] per second from the start of the load: events/s the engine published, "
            "the API relay received, each subscriber and all subscribers got; how far behind "
            "(now - ts of its last event) the median live subscriber is; subscribers cut off; "
            "cpu of engine / API / this client / other processes"
        )
        tl = Table(
            ["t s", "engine/s", "relay/s", "per sub/s", "all subs/s", "behind s", "cut", "cpu"], 9
        )
        for row in r["timeline"]:
            tl.row(row)
        for line in r["notes"]:
            print(line)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_SECONDS:g} s of load")
    ap.add_argument("--events", type=float, default=EVENTS_PER_S, help="target events/s")
    ap.add_argument("--subscribers", type=int, default=SUBSCRIBERS)
    ap.add_argument("--seconds", type=float, help=f"seconds of load (default {SECONDS:g})")
    ap.add_argument("--steps", type=int, default=STEPS, help="sleep-0 steps per run")
    ap.add_argument("--queue-frames", type=int, help="the API's ws_queue_frames (default its own)")
    ap.add_argument(
        "--mode",
        choices=("frames", "batch", "both"),
        default="both",
        help="one event per websocket message, ?batch=true (arrays), or both (default)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the data dir (serve.log)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    if args.seconds is None:
        args.seconds = QUICK_SECONDS if args.quick else SECONDS
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    header("bench/feed.py", args.quick)
    started = time.monotonic()
    modes = {"frames": [False], "batch": [True], "both": [False, True]}[args.mode]
    results: dict[str, dict[str, Any]] = {}
    try:
        for batch in modes:
            results[mode_name(batch)] = asyncio.run(bench(args, batch))
        report(args, results)
    except KeyboardInterrupt:
        sys.exit("interrupted (serve stopped, temp dir removed)")
    print(f"\n(wall time {time.monotonic() - started:.0f} s)")
    if args.json:
        for r in results.values():
            del r["rows"], r["timeline"], r["notes"]
        args.json.write_text(json.dumps(results, indent=2, default=str))
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
