"""The API's per-app state and the route dependencies that hand it out.

One :class:`ApiState` per app (built by ``create_app``, kept on
``app.state.tiffany``): the settings, the ports chosen for them (the store's
reads, the watermark, the activity relay's source), the engines' command
channels and the metrics registry. Nothing here exists at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, TypeVar

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from tiffany.api import timing
from tiffany.config import Settings
from tiffany.feed.relay import FeedRelay
from tiffany.observe.api_metrics import ApiMetrics
from tiffany.ports import watermark as marks
from tiffany.ports.reads import RunReads, StoreUnavailable
from tiffany.ports.watermark import MIN_SEQ_WAIT_S, BeyondJournal, EngineMark, StoreBehind
from tiffany.store import queries
from tiffany.wire import shards
from tiffany.wire.control import AsyncControlClient

if TYPE_CHECKING:
    from tiffany.api.engines import Engines
    from tiffany.api.memory import MemoryAccess

__all__ = [
    "MIN_SEQ_WAIT_S",
    "ApiState",
    "BeyondJournal",
    "State",
    "StoreBehind",
    "StoreUnavailable",
    "Watermark",
    "get_state",
]

T = TypeVar("T")


@dataclass
class ApiState:
    """Everything one app instance holds (see module docstring).

    Attributes:
        reads: The store's reads (:mod:`tiffany.ports.reads`).
        watermark: Where the store is, and the reads waiting for it
            (:mod:`tiffany.ports.watermark`).
        relay: The activity relay, filled by its source (:mod:`tiffany.ports.feed`).
    """

    settings: Settings
    reads: RunReads
    watermark: marks.Watermark
    relay: FeedRelay
    metrics: ApiMetrics
    #: The engines' control channels (``serve --engines N``).
    engines: Engines = field(init=False)
    #: The agents' memory (``tiffany/api/memory.py``): one store, opened at its first call.
    memory: MemoryAccess = field(init=False)

    def __post_init__(self) -> None:
        from tiffany.api.engines import Engines
        from tiffany.api.memory import MemoryAccess

        self.memory = MemoryAccess(self.settings)
        from tiffany.ports.commands import commands_for

        commands = commands_for(self.settings, self._owner)
        # Its marks are the watermark port's (``self.watermark``): not asked here.
        self.engines = Engines(commands)

    async def _owner(self, run_id: str) -> int | None:
        """The engine that started ``run_id``, as the store says (the commands port asks)."""
        start = await self.read(lambda s: queries.start_seq_of(s, run_id))
        return None if start is None else shards.engine_of(start)

    @property
    def control(self) -> AsyncControlClient:
        """Engine 0's control channel (the only one with a single engine)."""
        return self.engines.controls[0]

    async def wait_projected(self, seq: int) -> int:
        """Return once the store holds WAL seq ``seq``; return the watermark learnt.

        The watermark port is told where the store is (no poll, no sleep
        here). A seq at or below a watermark already learnt costs nothing.

        Raises:
            StoreBehind: The store did not reach ``seq`` within :data:`MIN_SEQ_WAIT_S`.
            BeyondJournal: ``seq`` is above every seq its engine has written.
        """
        with timing.timed("projected"):
            last = await self.watermark.wait(seq, MIN_SEQ_WAIT_S)
        if last < seq:
            raise StoreBehind(
                f"the store is at seq {last} and did not reach seq {seq} "
                f"within {MIN_SEQ_WAIT_S:g} s; retry",
                min_seq=seq,
                store_seq=last,
            )
        return last

    async def read(self, fn: Callable[..., T]) -> T:
        """Run ``fn(session)`` in the threadpool with a fresh session (:meth:`RunReads.read`).

        Raises:
            StoreUnavailable: The store has no schema yet or cannot be reached.
        """
        return await self.reads.read(fn)

    async def close(self) -> None:
        """Close the store's connections (the app stops)."""
        await self.reads.close()
        await self.memory.close()


#: ``api/engines.py``'s name for one engine's mark, until its own marks go
#: (the watermark port holds them): :class:`tiffany.ports.watermark.EngineMark`.
Watermark = EngineMark


def get_state(conn: HTTPConnection) -> ApiState:
    """Return the app's :class:`ApiState` (requests and websockets)."""
    state: ApiState = conn.app.state.tiffany
    return state


async def _state_of_request(request: Request) -> ApiState:
    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a
    # thread hop (and a GIL hand-off) on every request for one attribute read.
    return get_state(request)


#: The app state, as a route parameter: ``state: State``.
State = Annotated[ApiState, Depends(_state_of_request)]
