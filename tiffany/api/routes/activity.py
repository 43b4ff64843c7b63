"""``WS /ws/activity?run_id=&since=SEQ``: the activity feed as JSON text frames.

Each frame is one PAL event (schema v2, ``tiffany/feed/events.py``) with a
strictly increasing ``seq`` (across engine restarts too; not consecutive)
and the ``wal_seq`` of the journal record it comes from (what
``GET /api/runs/{id}?min_seq=`` takes), or a control frame:

* ``{"type": "gone", "oldest", "reason"}``: events after your ``since`` are
  no longer held (or the engine restarted before you had them all): reload
  state over HTTP; the live stream continues after it;
* ``{"type": "cutoff", "last_seq", "reason"}``: you fell too far behind and
  are disconnected; reconnect with ``since=<the last seq you received>``;
* ``{"type": "ping"}``: sent when idle, so both sides notice a dead peer;
* ``{"type": "error", "code", "message", "detail", ...}``: the request is
  refused (the API's error shape), then the websocket is closed with
  ``4000 + the HTTP status`` the same request gets over HTTP. One today:
  ``feed.since_beyond`` (close 4422, as ``min_seq`` beyond the journal is
  a 422): ``since`` is above the feed's last seq (``last_seq`` in the
  frame), a seq this feed never sent. Resume without ``since`` and reload
  state over HTTP.

With ``batch=true`` every message is instead a JSON array of such frames
(up to 512 a message): what a client that follows a busy engine should ask
for, since a message costs the API the same whether it carries one event or
hundreds.

At most ``ws_max_subscribers`` websockets at once: one more is accepted
and closed at once with code 1013 (try again later) and the reason ``too
many subscribers: try again later``. A client that falls more than
``ws_queue_frames`` frames or ``ws_queue_bytes`` bytes behind, or whose
socket does not drain within ``ws_send_timeout_s``, is cut off: ``cutoff``
then close code 1013, queued behind every frame it was already sent, so a
client that reads again gets them all and then the ``cutoff``. A socket that
has not taken them ``ws_cutoff_linger_s`` after the cutoff is reset: the
client sees the connection drop with no close frame (1006) and no
``cutoff``, and resumes with ``since=<the last seq it received>`` as after
any drop (``tiffany.feed.wsdirect.DirectWriter.close_after``; under a server
without the direct writer the two frames are sent through ASGI, within
:data:`CUTOFF_SEND_TIMEOUT_S` or not at all).

Resume after any disconnect with ``since=<last seq received>``; events come
from this process's relay (:mod:`tiffany.feed.relay`), never from a
subscription of the engine per websocket. Messages the client sends are
read and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Final

import msgspec
import structlog
from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect

from tiffany.api.deps import get_state
from tiffany.feed.relay import READ_BATCH_ENTRIES, FeedSubscriber
from tiffany.feed.wsdirect import DirectWriter, direct_writer_of, text_frame

__all__ = ["router"]

log = structlog.get_logger("tiffany.api")

#: How long a cut-off websocket may take to accept its ``cutoff`` frame, in seconds.
CUTOFF_SEND_TIMEOUT_S: Final = 2.0
#: Close code for a cut-off subscriber ("try again later").
CLOSE_TRY_AGAIN: Final = 1013
#: The close reason of a cut-off websocket (code 1013).
CUTOFF_REASON: Final = "cut off: resume with since"
#: The close reason of a websocket refused at the subscriber cap (code 1013).
REFUSED_REASON: Final = "too many subscribers: try again later"
#: Close code of a refused request: 4000 + the HTTP status (4422: ``since`` beyond the feed).
CLOSE_SINCE_BEYOND: Final = 4422
#: Close code when the sender fails unexpectedly.
CLOSE_INTERNAL_ERROR: Final = 1011
#: Frames a sender sends one by one before it lets the loop run others.
FRAMES_PER_TURN: Final = 64
_PING: Final = '{"type":"ping"}'
#: What a websocket whose client went away raises on send.
_GONE_CLIENT: Final = (WebSocketDisconnect, OSError, RuntimeError)

router = APIRouter(tags=["activity"])


def _one(ws: WebSocket, batch: bool) -> Callable[[str], Awaitable[None]]:
    """Return how one frame is sent: as it is, or as a one-frame array in batch mode."""
    if not batch:
        return ws.send_text

    async def send(text: str) -> None:
        await ws.send_text(f"[{text}]")

    return send


async def _send_frames(
    ws: WebSocket, sub: FeedSubscriber, ping_s: float, batch: bool, direct: DirectWriter | None
) -> None:
    """A websocket's sender: catch up, then relay direct writes or send its frames here.

    A resume older than the relay's ring is caught up through ASGI; then the
    subscriber goes to the relay's direct writes (``direct``, see
    :mod:`tiffany.feed.wsdirect`), or, under a server without them, this task
    sends its frames.
    """
    relay = sub.relay
    send_one = _one(ws, batch)

    async def send_timed(text: str) -> None:
        await sub.send(send_one, text)

    try:
        if sub.catching_up:
            await relay.catch_up(sub, send_timed, idle_timeout=ping_s)
        if direct is not None:
            if not sub.cut.is_set():
                relay.go_direct(sub, direct, batch=batch, ping_s=ping_s)
            return
        limit = READ_BATCH_ENTRIES if batch else FRAMES_PER_TURN
        while not sub.cut.is_set():
            frames = await sub.next_frames(ping_s, limit)
            if not frames:
                if not sub.cut.is_set():
                    await send_timed(_PING)
                continue
            if batch:
                await sub.send(ws.send_text, "[" + ",".join([text for _, text in frames]) + "]")
                seqs = [seq for seq, _ in frames if seq is not None]
                if seqs:
                    sub.sent_event(seqs[-1])
                continue
            # One turn (sub.send waits for it) per round of frames; the sends
            # after the first do not block unless the socket does (deadline).
            await relay.turn()
            for seq, text in frames:
                sub.send_since = time.monotonic()
                await ws.send_text(text)
                sub.send_since = None
                if seq is not None:
                    sub.sent_event(seq)
    except _GONE_CLIENT:
        return  # the client went away: the receive loop sees it too
    except Exception:
        log.exception("websocket sender failed")
        with contextlib.suppress(*_GONE_CLIENT):
            await ws.close(code=CLOSE_INTERNAL_ERROR)


async def _cut_off(
    ws: WebSocket,
    sub: FeedSubscriber,
    sender: asyncio.Task[None],
    batch: bool,
    done: asyncio.Event,
    linger_s: float,
) -> None:
    """Stop the sender, then send ``cutoff`` and close (bounded in time), then end the handler.

    With the direct writer both frames are queued at once behind what the
    client was sent (module docstring); through ASGI a socket that does not
    drain within :data:`CUTOFF_SEND_TIMEOUT_S` gets neither frame, and the
    server closes the connection when the handler returns.
    """
    try:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        log.info("websocket cut off", last_seq=sub.last_seq, reason=sub.cut_reason)
        direct = direct_writer_of(ws.scope)
        if direct is not None:
            text = sub.cutoff_frame()
            direct.close_after(
                text_frame(f"[{text}]" if batch else text),
                CLOSE_TRY_AGAIN,
                CUTOFF_REASON,
                linger_s=linger_s,
            )
            return
        with contextlib.suppress(TimeoutError, *_GONE_CLIENT):
            await asyncio.wait_for(_one(ws, batch)(sub.cutoff_frame()), CUTOFF_SEND_TIMEOUT_S)
            await asyncio.wait_for(
                ws.close(code=CLOSE_TRY_AGAIN, reason=CUTOFF_REASON),
                CUTOFF_SEND_TIMEOUT_S,
            )
    finally:
        done.set()


async def _receive_until(ws: WebSocket, done: asyncio.Event) -> None:
    """Read (and ignore) the client's messages until it disconnects or ``done`` is set."""
    ended = asyncio.create_task(done.wait())
    try:
        while True:
            received = asyncio.ensure_future(ws.receive())
            await asyncio.wait({received, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not received.done():
                received.cancel()
                return
            message = received.result()
            if message["type"] == "websocket.disconnect":
                return
    finally:
        ended.cancel()


async def _refuse_since(ws: WebSocket, since: int, last: int, batch: bool) -> None:
    """Refuse a ``since`` beyond the feed: an ``error`` frame, then close 4422 (module doc)."""
    message = (
        f"since {since} is beyond the feed's last seq {last}: no event after it was sent; "
        "resume without since and reload state over HTTP"
    )
    log.info("websocket refused: since beyond the feed", since=since, last_seq=last)
    frame = msgspec.json.encode(
        {
            "type": "error",
            "code": "feed.since_beyond",
            "message": message,
            "detail": [{"loc": ["query", "since"], "msg": "beyond the feed"}],
            "status": 422,
            "since": since,
            "last_seq": last,
        }
    ).decode()
    with contextlib.suppress(TimeoutError, *_GONE_CLIENT):
        await asyncio.wait_for(_one(ws, batch)(frame), CUTOFF_SEND_TIMEOUT_S)
        await asyncio.wait_for(
            ws.close(code=CLOSE_SINCE_BEYOND, reason=f"since beyond the feed's last seq {last}"),
            CUTOFF_SEND_TIMEOUT_S,
        )


@router.websocket("/ws/activity")
async def activity(
    ws: WebSocket,
    run_id: Annotated[str | None, Query(description="Only this run's events.")] = None,
    since: Annotated[int | None, Query(ge=0, description="Resume after this seq.")] = None,
    batch: Annotated[
        bool, Query(description="Send JSON arrays of frames, many events a message.")
    ] = False,
    tail: Annotated[
        int,
        Query(ge=0, le=10_000, description="Without since: first the last N events held."),
    ] = 0,
) -> None:
    """Stream activity events (see the module docstring for the frames).

    The handler itself only reads the client (until it disconnects); a
    sender task writes the frames, and a cutoff stops that task from the
    relay's side, so a stalled client never holds anything but its own task.
    """
    state = get_state(ws)
    relay = state.relay
    await ws.accept()
    if relay.full():
        relay.refused += 1
        log.warning(
            "websocket refused: too many subscribers",
            subscribers=len(relay.subscribers),
            limit=relay.max_subscribers,
        )
        with contextlib.suppress(TimeoutError, *_GONE_CLIENT):
            await asyncio.wait_for(
                ws.close(code=CLOSE_TRY_AGAIN, reason=REFUSED_REASON), CUTOFF_SEND_TIMEOUT_S
            )
        return
    if since is not None:
        last = await relay.beyond(since)
        if last is not None:
            await _refuse_since(ws, since, last, batch)
            return
    sub = relay.subscribe(run_id=run_id or None, since=since, tail=tail)
    log.info("websocket subscribed", run_id=run_id, since=since, catch_up=sub.catching_up)
    ping_s = state.settings.ws_ping_interval_s
    direct = direct_writer_of(ws.scope)
    sender = asyncio.create_task(_send_frames(ws, sub, ping_s, batch, direct))
    done = asyncio.Event()
    linger_s = state.settings.ws_cutoff_linger_s
    sub.on_cut = lambda: asyncio.create_task(_cut_off(ws, sub, sender, batch, done, linger_s))
    try:
        await _receive_until(ws, done)
    finally:
        # Not awaited: the handler returns at once; the task ends at its next await.
        sender.cancel()
        relay.unsubscribe(sub)
        log.info("websocket closed", last_seq=sub.last_seq)
