"""The API's per-app state and the route dependencies that hand it out.

One :class:`ApiState` per app (built by ``create_app``, kept on
``app.state.tiffany``): the settings, the store's engine and session
factory, the control-channel client, the activity relay and the metrics
registry. Nothing here exists at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeVar

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from tiffany.api.feed import FeedRelay
from tiffany.config import Settings
from tiffany.control import AsyncControlClient, ControlUnavailable
from tiffany.errors import TiffanyError
from tiffany.store import queries

__all__ = ["MIN_SEQ_WAIT_S", "ApiState", "State", "StoreBehind", "StoreUnavailable", "get_state"]

#: How long a read with ``min_seq`` waits for the store to pass it, in seconds.
MIN_SEQ_WAIT_S: Final = 5.0
#: How much longer the control request may take than that (the engine answers
#: at its own deadline; this only covers the trip), in seconds.
CONTROL_MARGIN_S: Final = 2.0

T = TypeVar("T")


class StoreUnavailable(TiffanyError):
    """The SQL store cannot be read (not created yet, or unreachable): HTTP 503."""

    code = "store.unavailable"


class StoreBehind(StoreUnavailable):
    """The store has not reached the ``min_seq`` a reader asked for in time: HTTP 503.

    Fields: ``min_seq`` (what was asked) and ``store_seq`` (where the store is).
    """

    code = "store.behind"


@dataclass
class ApiState:
    """Everything one app instance holds (see module docstring)."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    control: AsyncControlClient
    relay: FeedRelay
    registry: Any
    collector: Any
    #: The highest store watermark this process has been told (it only grows).
    projected_seq: int = 0

    async def wait_projected(self, seq: int) -> int:
        """Return once the store holds WAL seq ``seq``; return the watermark learnt.

        The engine is asked (``wait_projected`` on the control channel) and
        answers when its projector reports the store past ``seq``: no poll,
        no sleep here. A seq at or below a watermark already learnt costs
        nothing. Without an engine, the store's own watermark is read once.

        Raises:
            StoreBehind: The store did not reach ``seq`` within :data:`MIN_SEQ_WAIT_S`.
            StoreUnavailable: Neither the engine nor the store could say.
        """
        if seq <= self.projected_seq:
            return self.projected_seq
        try:
            answer = await self.control.request(
                "wait_projected",
                timeout=MIN_SEQ_WAIT_S + CONTROL_MARGIN_S,
                seq=seq,
                wait_s=MIN_SEQ_WAIT_S,
            )
            last = int(answer.get("last_seq", 0))
        except ControlUnavailable:
            last = await self.read(queries.watermark)
        self.projected_seq = max(self.projected_seq, last)
        if last < seq:
            raise StoreBehind(
                f"the store is at seq {last} and did not reach seq {seq} "
                f"within {MIN_SEQ_WAIT_S:g} s; retry",
                min_seq=seq,
                store_seq=last,
            )
        return last

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)`` in the threadpool with a fresh session.

        Raises:
            StoreUnavailable: The store has no schema yet or cannot be reached.
        """

        def work() -> T:
            with self.sessions() as session:
                return fn(session)

        try:
            return await run_in_threadpool(work)
        except (OperationalError, ProgrammingError) as exc:
            raise StoreUnavailable(
                f"the store cannot be read: {exc.orig or exc}",
                hint="is the engine running (it creates and migrates the store)?",
            ) from exc


def get_state(conn: HTTPConnection) -> ApiState:
    """Return the app's :class:`ApiState` (requests and websockets)."""
    state: ApiState = conn.app.state.tiffany
    return state


def _state_of_request(request: Request) -> ApiState:
    return get_state(request)


#: The app state, as a route parameter: ``state: State``.
State = Annotated[ApiState, Depends(_state_of_request)]
