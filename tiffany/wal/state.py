"""The sequence numbers and fail-stop state every log keeps (the file WAL, a PostgreSQL stream)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn, Self

from tiffany.errors import WalFailedError

__all__ = ["LogState"]


_LEASE_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def lease_clock() -> float:
    """Seconds on a clock that counts on while the process is stopped or the host suspended.

    Leases are judged by it (``LogState.lease_deadline``): ``time.monotonic``
    stops while a Linux host is suspended, ``CLOCK_BOOTTIME`` does not.
    """
    return time.clock_gettime(_LEASE_CLOCK)


class LogState:
    """``next_seq``, ``durable_seq`` and ``failed``, as a log's writer keeps them.

    Invariants: ``durable_seq < next_seq``; once ``_failed`` is set it stays,
    and :meth:`_refuse` raises a copy of it (with the same cause) at every
    later ``append`` or ``commit``.
    """

    _next_seq: int
    _durable_seq: int
    _failed: WalFailedError | None
    _closed: bool
    #: Called once (on another thread) when the writer learns it may no longer
    #: write: a PostgreSQL stream's lease taken over. The file WAL's lock is
    #: held until the process dies, so it never calls it.
    on_lost: Callable[[], None] | None = None
    #: Called first thing when the log learns it can write no more (a write,
    #: a sync or a commit failed; the commit was fenced, or the heartbeat
    #: found the lease taken over), before the failure is logged or raised:
    #: the runtime stops starting effects there (``Scheduler.stop``), not
    #: once the error has unwound its loop. Any thread; maybe more than once
    #: (the heartbeat, then the fenced commit); must not raise.
    on_failed: Callable[[], None] | None = None
    #: Called (on another thread) each time the lease is renewed: the file
    #: WAL has no lease and never calls it.
    on_renewed: Callable[[], None] | None = None

    @property
    def lease_deadline(self) -> float | None:
        """Until when (:func:`lease_clock`) this writer surely holds its stream; None: no lease.

        The file WAL's lock is held until the process dies: None.
        """
        return None

    def close(self) -> None:
        """Commit what is buffered (unless failed) and let the log go."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        """Return self; ``with Log.open(...) as log:`` closes on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close (which commits)."""
        self.close()

    def _repr(self, head: str) -> str:
        state = "failed" if self.failed else "closed" if self._closed else "open"
        return f"{head} next_seq={self._next_seq} durable_seq={self._durable_seq} {state}>"

    @property
    def next_seq(self) -> int:
        """The sequence number the next ``append`` returns."""
        return self._next_seq

    @property
    def durable_seq(self) -> int:
        """The last sequence number made durable; 0 if none."""
        return self._durable_seq

    @property
    def failed(self) -> bool:
        """True once a write, a sync or a commit failed, or the log was fenced (fail-stop)."""
        return self._failed is not None

    def _failing(self) -> None:
        """Tell ``on_failed`` (the writers' ``_fail`` calls it once ``_failed`` is set)."""
        if self.on_failed is not None:
            self.on_failed()

    def _refuse(self) -> NoReturn:
        failed = self._failed
        assert failed is not None
        raise WalFailedError(failed.message, **failed.fields) from failed.__cause__
