"""The API's handle on the agents' memory: one :class:`~tiffany.memory.MemoryStore` per app.

The memory lives in the store's database (docs/memory.md): the API reads it
there directly, as it reads runs, through one store built from the settings
(its database URL and its embedder, which a search embeds its query with).
The store's calls block: each runs in the threadpool, at most
:data:`MEMORY_CALLS` at a time (the store's own connection pool bounds the
rest), never on the event loop.

The store is made at the first call, in the threadpool, and kept for the
app's life: the API's start imports no numpy and opens no connection for
it (serve's start-up is measured), the API may start before the engine has
created the memory's tables (``tiffany db upgrade`` runs in the engine),
and a database that cannot be read is a 503
(:class:`~tiffany.ports.reads.StoreUnavailable`) like any other read. Like
the engine's store, this one keeps the vectors of the namespaces it has
searched in memory (``tiffany/memory/search.py``), brought up to date from
the rows at each search (another process writes them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.to_thread
from sqlalchemy.exc import OperationalError, ProgrammingError

from tiffany.config import Settings
from tiffany.ports.reads import StoreUnavailable

if TYPE_CHECKING:
    from tiffany.memory import MemoryStore

__all__ = [
    "HISTORY_SHOWN",
    "LINKS_SHOWN",
    "MEMORY_CALLS",
    "NEIGHBOURS",
    "MemoryAccess",
    "item_detail",
]

T = TypeVar("T")

#: Memory calls in flight at once (each holds a thread and a connection).
MEMORY_CALLS: Final = 8
#: Neighbours an item's detail lists at most.
NEIGHBOURS: Final = 50
#: Versions and links an item's detail lists at most (the newest versions,
#: the oldest links); ``versions`` and ``link_count`` say how many there are.
HISTORY_SHOWN: Final = 100
LINKS_SHOWN: Final = 200


def item_detail(
    store: MemoryStore, namespace: str, key: str, depth: int = 1
) -> dict[str, Any] | None:
    """An item with its ``links``, its ``history`` and its ``neighbors``; None if absent.

    At most :data:`LINKS_SHOWN` links (oldest first) and the newest
    :data:`HISTORY_SHOWN` versions; ``link_count`` and ``versions`` count
    them all.

    What ``GET /api/memory/{namespace}/{key}`` answers and ``tiffany memory
    get`` shows (the CLI's local reads call this too). Blocking.
    """
    item = store.get(namespace, key)
    if item is None:
        return None
    near = store.neighbors(namespace, key, depth=depth, limit=NEIGHBOURS)
    links = store.links(namespace, key)
    history = store.history(namespace, key)
    return {
        **item,
        "links": links[:LINKS_SHOWN],
        "link_count": len(links),
        "history": history[-HISTORY_SHOWN:],
        "versions": len(history),
        "neighbors": near["items"],
    }


class MemoryAccess:
    """The app's memory store, opened once at its first call; calls in the threadpool.

    Args:
        settings: The API's settings (the database URL, the embedder's).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store: MemoryStore | None = None
        self._opening = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None  # made in the event loop

    def _opened(self) -> MemoryStore:
        with self._opening:
            if self._store is None:
                from tiffany.memory import MemoryStore, embedder_from_settings

                self._store = MemoryStore.open(
                    self.settings.database_url,
                    embedder=embedder_from_settings(self.settings),
                    max_items=self.settings.memory_max_items,
                )
            return self._store

    async def call(self, fn: Callable[[MemoryStore], T]) -> T:
        """Run ``fn(store)`` in the threadpool; the store's refusals pass as they are.

        Raises:
            StoreUnavailable: The database cannot be read (no schema yet, unreachable).
        """
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(MEMORY_CALLS)
        try:
            return await anyio.to_thread.run_sync(lambda: fn(self._opened()), limiter=self._limiter)
        except (OperationalError, ProgrammingError) as exc:
            raise StoreUnavailable(
                f"the memory cannot be read: {exc.orig or exc}",
                hint="is the engine running (it creates and migrates the store)?",
            ) from exc

    async def close(self) -> None:
        """Close the store's connections (the app stops)."""
        store, self._store = self._store, None
        if store is not None:
            await anyio.to_thread.run_sync(store.close)
