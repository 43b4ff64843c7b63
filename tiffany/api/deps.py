"""The API's per-app state and the route dependencies that hand it out.

One :class:`ApiState` per app (built by ``create_app``, kept on
``app.state.tiffany``): the settings, the store's engine and session
factory, the control-channel client, the activity relay and the metrics
registry. Nothing here exists at import time.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Final, TypeVar

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from tiffany.api.feed import FeedRelay
from tiffany.api.metrics import ApiMetrics
from tiffany.config import Settings
from tiffany.control import AsyncControlClient
from tiffany.errors import TiffanyError

__all__ = ["ApiState", "State", "StoreUnavailable", "get_state"]

#: Submissions remembered for the "just submitted, not projected yet" wait.
RECENT_SUBMISSIONS: Final = 10_000
#: How long after its submission a run is waited for in the store, in seconds.
RECENT_WINDOW_S: Final = 30.0

T = TypeVar("T")


class StoreUnavailable(TiffanyError):
    """The SQL store cannot be read (not created yet, or unreachable): HTTP 503."""

    code = "store.unavailable"


@dataclass
class ApiState:
    """Everything one app instance holds (see module docstring)."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    control: AsyncControlClient
    relay: FeedRelay
    metrics: ApiMetrics
    recent: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def remember(self, run_id: str) -> None:
        """Note a run this API just submitted (its row may lag behind)."""
        self.recent[run_id] = time.monotonic()
        self.recent.move_to_end(run_id)
        while len(self.recent) > RECENT_SUBMISSIONS:
            self.recent.popitem(last=False)

    def just_submitted(self, run_id: str) -> bool:
        """True if this API submitted ``run_id`` in the last :data:`RECENT_WINDOW_S`."""
        at = self.recent.get(run_id)
        return at is not None and time.monotonic() - at < RECENT_WINDOW_S

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
