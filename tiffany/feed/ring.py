"""The relay's ring: a fixed number of entries, addressed by ever-increasing positions.

The API's activity relay (:mod:`tiffany.feed.relay`) appends each event
once, as a ``(key, run_id, text)`` :data:`Entry`; a subscriber is a
position in it (a cursor), so an event costs the same however many
subscribers there are. A position below :attr:`Ring.start` is off the
tail: its entry was overwritten, and :attr:`Ring.dropped` keeps the key of
the last one that was, which tells whether a resume point is still covered.
The ring also counts the text's bytes, so a cursor's lag in bytes is one
subtraction (:meth:`Ring.bytes_after`).
"""

from __future__ import annotations

__all__ = ["Entry", "Ring"]

#: A ring entry: its key (the event's seq; halfway between two for a
#: relay's own ``gone``), the run it belongs to (``"*"``: everyone's), its JSON text.
Entry = tuple[float, str | None, str]


class Ring:
    """A fixed-capacity ring of entries addressed by ever-increasing positions."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buf: list[Entry | None] = [None] * capacity
        # Bytes of text appended before each entry (lag in bytes is a subtraction).
        self._before: list[int] = [0] * capacity
        self.end = 0  # position of the next entry
        self.total_bytes = 0
        #: The key of the last entry overwritten (None: none yet).
        self.dropped: float | None = None

    @property
    def start(self) -> int:
        """Position of the oldest entry still held."""
        return max(0, self.end - self.capacity)

    def __len__(self) -> int:
        return self.end - self.start

    def append(self, entry: Entry) -> None:
        """Add ``entry`` at :attr:`end`, overwriting the oldest once full."""
        i = self.end % self.capacity
        old = self._buf[i]
        if old is not None:
            self.dropped = old[0]
        self._buf[i] = entry
        self._before[i] = self.total_bytes
        self.total_bytes += len(entry[2])
        self.end += 1

    def bytes_after(self, pos: int) -> int:
        """Bytes of text from ``pos`` (a held position, or the end) to the end."""
        if pos >= self.end:
            return 0
        return self.total_bytes - self._before[max(pos, self.start) % self.capacity]

    def at(self, pos: int) -> Entry:
        """The entry at ``pos`` (which must be held)."""
        entry = self._buf[pos % self.capacity]
        assert entry is not None
        return entry

    def read(self, pos: int, limit: int) -> list[Entry]:
        """Return up to ``limit`` entries from ``pos`` (which must be held)."""
        n = min(self.end - pos, limit)
        if n <= 0:
            return []
        a = pos % self.capacity
        if a + n <= self.capacity:
            out = self._buf[a : a + n]
        else:
            out = self._buf[a:] + self._buf[: a + n - self.capacity]
        return out  # type: ignore[return-value]

    def position_after(self, key: float) -> int:
        """Return the first held position whose key is greater than ``key``."""
        lo, hi = self.start, self.end
        while lo < hi:
            mid = (lo + hi) // 2
            if self.at(mid)[0] <= key:
                lo = mid + 1
            else:
                hi = mid
        return lo
