"""``Watermark``: read-your-writes, "wait until the store holds seq N".

A client that wrote (a 201's ``seq``, an event's ``wal_seq``) may read with
``min_seq``: the read waits until the store has projected that seq. Each
engine's projector moves its own mark (the seq names its engine:
:func:`tiffany.wire.shards.engine_of`), and a read waits on that engine's
:class:`EngineMark`. How the API learns that a mark moved is the port,
chosen once from the settings by :func:`watermark_for`:

- :class:`SocketWatermark` (the embedded store): the engine tells, over its
  control socket (``wait_projected``: one request out however many reads
  wait, answered at the projector's next report);
- :class:`PgWatermark` (a PostgreSQL store): the same, and the projector's
  own notification (``tiffany_projected``, sent in the statement that moves
  the mark) wakes the reads straight from the database. On the PostgreSQL
  journal the engines may be on other hosts, any number of them: a mark is
  made for each engine that speaks, and a read waits for the notifications
  even when no engine answers here.

Discussion: with a PostgreSQL store both paths stay. The notification comes
at the projector's commit with no process in between, so it is the faster;
the engine's answer covers the notifications lost while the listener
reconnects, and the notification covers a busy engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from tiffany.config import Settings, conninfo
from tiffany.errors import TiffanyError
from tiffany.ports.reads import StoreUnavailable
from tiffany.store.models import PROJECTED_CHANNEL
from tiffany.wire import shards
from tiffany.wire.control import AsyncControlClient, ControlUnavailable

__all__ = [
    "CONTROL_MARGIN_S",
    "MIN_SEQ_WAIT_S",
    "BeyondJournal",
    "EngineMark",
    "PgWatermark",
    "ReadMark",
    "SocketWatermark",
    "StoreBehind",
    "Watermark",
    "watermark_for",
]

#: How long a read with ``min_seq`` waits for the store to pass it, in seconds.
MIN_SEQ_WAIT_S: Final = 5.0
#: How much longer the control request may take than that (the engine answers
#: at its own deadline; this only covers the trip), in seconds.
CONTROL_MARGIN_S: Final = 2.0

#: Reads engine ``i``'s mark from the store itself (when no engine answers).
ReadMark = Callable[[int], Awaitable[int]]


class StoreBehind(StoreUnavailable):
    """The store has not reached the ``min_seq`` a reader asked for in time: HTTP 503.

    Fields: ``min_seq`` (what was asked) and ``store_seq`` (where the store is).
    """

    code = "store.behind"


class BeyondJournal(TiffanyError):
    """A ``min_seq`` above every seq the journal has written: no wait could meet it (HTTP 422).

    Fields: ``min_seq`` (what was asked) and ``written_seq`` (the journal's last seq).
    """

    code = "request.invalid"
    http_status = 422


@runtime_checkable
class Watermark(Protocol):
    """Where the store is, per engine, and the reads waiting for it (module docstring)."""

    def start(self) -> None:
        """Start listening for the marks' moves, if this port is told of them (in the loop)."""

    async def wait(self, seq: int, timeout: float) -> int:
        """Return the mark of ``seq``'s engine once it is at least ``seq``, or at ``timeout``.

        Raises:
            BeyondJournal: ``seq`` is above every seq its engine has written.
        """

    async def close(self) -> None:
        """Stop listening; the reads still waiting end at their deadlines."""


class EngineMark:
    """One engine's mark as this API process has been told it, and the reads waiting on it.

    While any read waits, one ``wait_projected(last + 1)`` request is out on
    the control channel: the engine answers it when the projector next
    reports progress, this resolves every read the new mark covers and, if
    reads still wait, asks again. So the engine answers one request per
    projector report however many reads wait (a subscription that exists
    only while someone listens), and a read waits for the first report that
    covers it, never for a timer.

    Args:
        control: The engine's control-channel client.
        read_mark: Reads the store's own mark of this engine (when it is away).
    """

    def __init__(
        self, control: AsyncControlClient, read_mark: Callable[[], Awaitable[int]]
    ) -> None:
        self.control = control
        self.read_mark = read_mark
        #: The highest mark learnt (it only grows).
        self.seq = 0
        self._waiters: list[tuple[int, int, asyncio.Future[int]]] = []  # a heap by seq
        #: The journal's last written seq as of the newest answer (it only grows).
        self.written = 0
        #: Moves of the mark are pushed to :meth:`push` (the database's
        #: notifications), so a read waits for them even with no engine to ask.
        self.pushed = False
        self._order = itertools.count()
        self._task: asyncio.Task[None] | None = None

    async def wait(self, seq: int, timeout: float) -> int:
        """Return the mark once it is at least ``seq``, or when ``timeout`` ran out."""
        if seq <= self.seq:
            return self.seq
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._order), fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._follow())
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return self.seq

    async def _follow(self) -> None:
        while True:
            self._waiters = [w for w in self._waiters if not w[2].done()]
            heapq.heapify(self._waiters)
            if not self._waiters:
                return
            # Waiters registered before this request are judged by its answer.
            sent = next(self._order)
            top = max(w[0] for w in self._waiters)
            try:
                answer = await self.control.request(
                    "wait_projected",
                    timeout=MIN_SEQ_WAIT_S + CONTROL_MARGIN_S,
                    seq=self.seq + 1,
                    wait_s=MIN_SEQ_WAIT_S,
                    max_seq=top,
                )
                self._advance(int(answer.get("last_seq", 0)))
                written = answer.get("written_seq")
                if isinstance(written, int) and written < top:
                    self._refuse_beyond(written, sent)
            except ControlUnavailable:
                with contextlib.suppress(StoreUnavailable):
                    self._advance(await self.read_mark())  # once: no engine, no news after
                if not self.pushed:
                    self._settle()
                # Pushed (the database notifies every move of the mark): the
                # reads wait for those notifications, each to its deadline.
                return
            except TiffanyError:
                self._settle()
                return

    def push(self, seen: int) -> None:
        """The store's mark moved to ``seen`` (a notification): wake the reads it covers."""
        self._advance(seen)

    def _advance(self, seen: int) -> None:
        self.seq = max(self.seq, seen)
        while self._waiters and self._waiters[0][0] <= self.seq:
            fut = heapq.heappop(self._waiters)[2]
            if not fut.done():
                fut.set_result(self.seq)

    def _refuse_beyond(self, written: int, sent: int) -> None:
        """Fail the reads (registered before ``sent``) that ask for more than was ever written.

        Discussion: a seq a client holds (a 201's, an event's ``wal_seq``)
        was written before the client could send it, so it is at most the
        ``written_seq`` of any answer to a request sent after the read
        arrived; only such reads are judged, so a fresh seq never races
        into a refusal.
        """
        self.written = max(self.written, written)
        keep = []
        for seq, order, fut in self._waiters:
            if seq > written and order < sent and not fut.done():
                fut.set_exception(
                    BeyondJournal(
                        f"min_seq {seq} is beyond the journal's last seq {written}",
                        min_seq=seq,
                        written_seq=written,
                        detail=[
                            {
                                "loc": ["query", "min_seq"],
                                "msg": "beyond the journal",
                                "type": "value_error",
                            }
                        ],
                    )
                )
            else:
                keep.append((seq, order, fut))
        heapq.heapify(keep)
        self._waiters = keep

    def _settle(self) -> None:
        """Answer every waiting read with what is known (they fail as behind)."""
        waiters, self._waiters = self._waiters, []
        for _seq, _order, fut in waiters:
            if not fut.done():
                fut.set_result(self.seq)


class SocketWatermark:
    """The engines of this host tell their marks over their control sockets (module docstring).

    Args:
        homes: Each engine's home (its control socket), engine 0 first.
        read_mark: Reads an engine's mark from the store (when it is away).
    """

    def __init__(self, homes: list[Path], read_mark: ReadMark) -> None:
        self.homes = list(homes)
        self._read_mark = read_mark
        #: Each engine's mark, engine 0 first.
        self.marks = [self._made(i, home) for i, home in enumerate(self.homes)]

    def _made(self, engine: int, home: Path) -> EngineMark:
        return EngineMark(AsyncControlClient(home), lambda: self._read_mark(engine))

    def start(self) -> None:
        """Nothing to start: a mark asks its engine when a read waits."""

    def mark(self, seq: int) -> EngineMark:
        """The mark of the engine that wrote ``seq`` (engine 0 for one out of range)."""
        engine = shards.engine_of(seq)
        return self.marks[engine if engine < len(self.marks) else 0]

    async def wait(self, seq: int, timeout: float) -> int:
        """Wait for the store to hold ``seq`` of its engine (:meth:`EngineMark.wait`)."""
        return await self.mark(seq).wait(seq, timeout)

    async def close(self) -> None:
        """Close the marks' control channels."""
        for mark in self.marks:
            await mark.control.close()


class PgWatermark(SocketWatermark):
    """A PostgreSQL store: its projectors' notifications move the marks too (module docstring).

    Args:
        homes: Each engine's home on this host, engine 0 first.
        read_mark: Reads an engine's mark from the store (when it is away).
        dsn: The store's libpq connection string (its schema names the channel).
        engines_anywhere: The PostgreSQL journal: engines on any host, any
            number of them, each learnt when a read names it; a read waits
            for the notifications even when no engine here answers.
    """

    def __init__(
        self, homes: list[Path], read_mark: ReadMark, dsn: str, *, engines_anywhere: bool
    ) -> None:
        super().__init__(homes, read_mark)
        self.engines_anywhere = engines_anywhere
        for mark in self.marks:
            mark.pushed = engines_anywhere
        from tiffany.ports.pg import Listener  # the postgres extra: imported only here

        self.listener = Listener(
            dsn, {PROJECTED_CHANNEL: self._projected}, "tiffany-api-store-marks"
        )

    def start(self) -> None:
        """Start listening to the projectors' notifications (in the running loop)."""
        self.listener.start()

    def engine_mark(self, engine: int) -> EngineMark | None:
        """Engine ``engine``'s mark (made on first use when engines may be anywhere)."""
        while self.engines_anywhere and len(self.marks) <= engine:
            i = len(self.marks)
            mark = self._made(i, shards.engine_home(self.homes[0], i))
            mark.pushed = True
            self.marks.append(mark)
        return self.marks[engine] if engine < len(self.marks) else None

    def mark(self, seq: int) -> EngineMark:
        """The mark of the engine that wrote ``seq``."""
        mark = self.engine_mark(shards.engine_of(seq))
        return mark if mark is not None else self.marks[0]

    def _projected(self, payload: str) -> None:
        """A projector notified its new mark: wake the reads it covers."""
        from tiffany.ports.pg import projected_mark

        moved = projected_mark(payload)
        if moved is None:
            return
        mark = self.engine_mark(moved[0])
        if mark is not None:
            mark.push(moved[1])

    async def close(self) -> None:
        """Stop listening and close the marks' control channels."""
        await self.listener.close()
        await super().close()


def watermark_for(settings: Settings, read_mark: ReadMark) -> Watermark:
    """The watermark port for ``settings``' store: notified by PostgreSQL, or asked of sockets.

    Args:
        settings: The process settings (data dir, engines, store, journal).
        read_mark: Reads engine ``i``'s mark from the store.
    """
    homes = shards.homes(settings.data_dir, settings.engines)
    url = settings.database_url
    if url.startswith("postgresql"):
        return PgWatermark(
            homes, read_mark, conninfo(url), engines_anywhere=settings.journal == "postgres"
        )
    return SocketWatermark(homes, read_mark)
