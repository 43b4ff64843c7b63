"""Live output: a running command's lines as ``tool.output`` events.

The shell tool hands each chunk it reads from the child's stdout and stderr
to a :class:`LiveOutput` (only what the result keeps: bytes past
``max_output_bytes`` are not shown live either). It cuts the chunks into
lines and publishes each through ``ctx.emit`` while the command runs; the
dashboard's log viewer (``api/static/steplog.js``) tails them under the
step's running attempt. The step's result is built from the pipes as
before: this is a copy for the eyes, never journaled.

Event data (``tool.output``)::

    tool     "shell"
    stream   "stdout" | "stderr"
    text     one line without its newline (UTF-8, bad bytes replaced), or a
             piece of one
    partial  True when the line goes on in the stream's next event: a line
             longer than LIVE_TEXT_BYTES, or output that waited
             LIVE_FLUSH_S for its newline

and, when the rate cap held lines back, before the next line that gets
through (and at the end)::

    tool "shell", level "warning", message "...", dropped_lines n

Invariants:
    * What the tool returns does not depend on anything here. A failure in
      this module disables the live view (logged); the command goes on.
    * :meth:`LiveOutput.feed` never blocks and never yields: it runs inside
      the pipe readers' kernel tasks, on the scheduler's thread.
    * One command publishes at most ``LIVE_EVENTS_BURST`` lines at once and
      ``LIVE_EVENTS_PER_S`` a second on average (a token bucket), plus at
      most one drop notice per line that gets through, and one at the end.

Discussion:
    A line left without its newline is flushed by :meth:`LiveOutput.ticker`,
    a kernel task the shell tool runs beside the readers: it parks on a
    kernel :class:`~tiffany.kernel.Event` until such a line is pending, then
    sleeps ``LIVE_FLUSH_S`` and flushes. A command that prints nothing, or
    only whole lines, costs it no wakeup. Rejected: a ``Sleep`` loop every
    ``LIVE_FLUSH_S`` (five wakeups a second, each three activity events, for
    a command that prints nothing); publishing each read as it comes (a
    pipe splits lines wherever the child's buffer ended: the live view
    would break lines the result has whole); a thread per pipe.

    Pieces are at most ``LIVE_TEXT_BYTES``, so an event stays small (the
    PAL's ``data`` is for small details) and encodes to well under the
    PostgreSQL feed's 8,000-byte notification (``engine/pg_feed.py``) even if
    JSON escaped every byte as six.

    The cap reads the monotonic clock, not the scheduler's: it decides only
    what the live view shows, never what is journaled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog

from tiffany.kernel import Coroutine, Event, Sleep

__all__ = [
    "LIVE_EVENTS_BURST",
    "LIVE_EVENTS_PER_S",
    "LIVE_FLUSH_S",
    "LIVE_TEXT_BYTES",
    "LiveOutput",
]

log = structlog.get_logger(__name__)

#: A line without its newline is published after waiting this long, in seconds.
LIVE_FLUSH_S: Final = 0.2
#: Longest text of one event, in bytes (a longer line goes out in pieces).
LIVE_TEXT_BYTES: Final = 1024
#: Lines one command may publish per second, on average.
LIVE_EVENTS_PER_S: Final = 50.0
#: Lines one command may publish at once (the token bucket's size).
LIVE_EVENTS_BURST: Final = 100

Emit = Callable[[str, Mapping[str, Any]], None]


def char_boundary(data: bytes, limit: int) -> int:
    """Return where to cut ``data`` at most ``limit`` bytes in without splitting a UTF-8 character.

    When ``limit`` reaches the end, an incomplete last character is left
    out (its remaining bytes may come in the next read). Bytes that are not
    UTF-8 are cut anywhere (they decode as replacement characters).
    """
    if limit < len(data):
        cut = limit
        for _ in range(3):  # at most three continuation bytes follow a lead byte
            if data[cut] & 0xC0 != 0x80:
                return cut
            cut -= 1
        return cut if cut > 0 and data[cut] & 0xC0 != 0x80 else limit
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for its lead
        need = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
        return len(data) - back if need > back else len(data)
    return len(data)


class LiveOutput:
    """Cut a command's output into ``tool.output`` events (see the module docstring).

    Args:
        emit: ``ctx.emit`` of the tool's context (best effort, never blocks).
        tool: The ``tool`` field of the events.
        clock: Monotonic seconds (tests pass their own).
        rate: Lines per second, on average.
        burst: Lines at once.
    """

    def __init__(
        self,
        emit: Emit,
        *,
        tool: str = "shell",
        clock: Callable[[], float] = time.monotonic,
        rate: float = LIVE_EVENTS_PER_S,
        burst: int = LIVE_EVENTS_BURST,
    ) -> None:
        self._emit = emit
        self._tool = tool
        self._clock = clock
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._stamp = clock()
        self._pending: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        #: Set while a line waits for its newline (the ticker's cue).
        self.flush_due = Event(name="live-output")
        #: Lines held back since the last notice.
        self.dropped = 0
        #: Lines (and pieces) published, and held back, in all.
        self.published = 0
        self.dropped_total = 0
        #: Set when something here failed: nothing more is published.
        self.disabled = False

    # -- what the readers and the tool call -------------------------------------------

    def feed(self, stream: str, data: bytes) -> None:
        """Take a chunk the child wrote to ``stream``; publish its complete lines."""
        if self.disabled or not data:
            return
        try:
            self._feed(stream, data)
        except Exception:  # noqa: BLE001 - an observer fails soft: the command goes on
            self._disable()

    def flush(self, *, final: bool = False) -> None:
        """Publish what waits for a newline (``final``: the streams ended; notice any drops)."""
        if self.disabled:
            return
        try:
            for stream, rest in self._pending.items():
                if not rest:
                    continue
                cut = len(rest) if final else char_boundary(rest, len(rest))
                if cut:
                    self._publish(stream, rest[:cut], partial=not final)
                self._pending[stream] = rest[cut:]
            if final and self.dropped:
                self._notice()
        except Exception:  # noqa: BLE001 - an observer fails soft: the command goes on
            self._disable()

    def ticker(self) -> Coroutine:
        """A kernel task: flush a line left without its newline ``LIVE_FLUSH_S`` later.

        It runs until killed (the shell tool kills it once the command ended).
        """
        while True:
            yield self.flush_due.wait()
            yield Sleep(LIVE_FLUSH_S)
            self.flush_due.clear()
            self.flush()

    # -- inside --------------------------------------------------------------------------

    def _feed(self, stream: str, data: bytes) -> None:
        buf = self._pending[stream] + data if self._pending[stream] else data
        start = 0
        while True:
            if not self._has_token():
                # Over the cap: count the whole lines held back, keep the tail.
                last = buf.rfind(b"\n", start)
                if last >= 0:
                    self._drop(buf.count(b"\n", start, last + 1))
                    start = last + 1
                break
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            self._publish(stream, buf[start:nl], partial=False)
            start = nl + 1
        rest = buf[start:]
        while len(rest) >= LIVE_TEXT_BYTES:  # a very long line: its pieces now
            cut = char_boundary(rest, LIVE_TEXT_BYTES)
            self._publish(stream, rest[:cut], partial=True)
            rest = rest[cut:]
        self._pending[stream] = rest
        if rest and not self.flush_due.is_set():
            self.flush_due.set()

    def _has_token(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        return self._tokens >= 1

    def _publish(self, stream: str, line: bytes, *, partial: bool) -> None:
        """Publish ``line`` (in pieces if long), or count it held back."""
        while True:
            cut = char_boundary(line, LIVE_TEXT_BYTES) if len(line) > LIVE_TEXT_BYTES else len(line)
            piece, line = line[:cut], line[cut:]
            more = bool(line)
            if not self._has_token():
                self._drop(1)
            else:
                self._tokens -= 1
                if self.dropped:
                    self._notice()
                text = piece.decode("utf-8", errors="replace")
                data = {"tool": self._tool, "stream": stream, "text": text}
                self._emit("tool.output", {**data, "partial": partial or more})
                self.published += 1
            if not more:
                return

    def _drop(self, lines: int) -> None:
        self.dropped += lines
        self.dropped_total += lines

    def _notice(self) -> None:
        n, self.dropped = self.dropped, 0
        message = (
            f"{n} line{'s' if n != 1 else ''} not shown live (more than "
            f"{self._rate:g} a second); the step's result has them"
        )
        self._emit(
            "tool.output",
            {"tool": self._tool, "level": "warning", "message": message, "dropped_lines": n},
        )

    def _disable(self) -> None:
        self.disabled = True
        log.warning("tool.live_output.disabled", tool=self._tool, exc_info=True)
