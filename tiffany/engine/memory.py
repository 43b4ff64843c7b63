"""The engine's one MemoryStore: opened off the loop, used from the thread pool, closed at stop.

The ``memory.*`` tools (``tiffany/agents/tools/memory.py``) run in the
scheduler's thread pool and reach the store as ``ToolContext.memory``:
this :class:`EngineMemory`, which stands for the store and forwards each
call to it. The scheduler thread never touches it: it runs no SQL, and
it never waits for the store to open.

Opening (the store's schema brought up to date with Alembic, then
``MemoryStore.open`` with the settings' embedder) happens on a thread of
its own at the first memory call, which waits for it in its thread (a
pool thread, never the loop's); so does every call made while it opens.
An engine whose runs use no memory never opens it: opening it as
``serve``'s engine started made every start pay for numpy and an
SQLAlchemy engine (bench/README.md, "The house, before and after") for
the first memory step's sake. An opening that failed (the database down,
a bad URL) fails the calls that waited for it with ``memory.unavailable`` and why; the next
call tries again (a step's retry, after its back-off, may find the
database back). The runtime closes the store as it closes
(:meth:`~tiffany.durable.Runtime.on_close`), after the thread pool's jobs.

Discussion: rejected, opening the store in :func:`tiffany.engine.build`.
Every engine would pay for it at start (a migration, an SQLAlchemy engine,
an index the store may build from its rows) whether or not a run uses
memory, and on the loop's thread before the loop runs, delaying the
first dispatch.
"""

from __future__ import annotations

import threading
from typing import Any, Final

import structlog

from tiffany.config import Settings

__all__ = ["EngineMemory"]

log = structlog.get_logger(__name__)

#: How long the close waits for an opening still under way, in seconds.
CLOSE_WAIT_S: Final = 10.0


class _Opening:
    """One attempt at opening the store: its thread's outcome."""

    __slots__ = ("done", "error", "store", "thread")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.store: Any = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None


class EngineMemory:
    """The engine's MemoryStore, opened on a thread of its own; stands for it (thread-safe).

    Args:
        settings: The engine's settings (``database_url``, the embeddings').
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._opening: _Opening | None = None
        self._closed = False

    def store(self) -> Any:
        """The open store (blocking: a thread's; it may wait for the opening).

        Raises:
            MemoryUnavailable: The store could not be opened (the next call
                tries again), or the engine is stopping.
        """
        from tiffany.agents.tools.memory import MemoryUnavailable

        opening = self._attempt()
        if opening is not None:
            opening.done.wait()
        if opening is None or self._closed:
            raise MemoryUnavailable("the engine is stopping: its memory store is closed")
        if opening.error is not None:
            raise MemoryUnavailable(
                f"the memory store could not be opened: {opening.error}", tool="memory"
            )
        return opening.store

    def seq(self) -> int:
        """The store's newest write's seq (``mem_seq``): a read's ``as_of`` (blocking)."""
        from sqlalchemy import select

        from tiffany.memory.tables import mem_seq

        store = self.store()
        own = getattr(store, "seq", None)
        if callable(own):
            return int(own())
        with store.engine.connect() as conn:
            return int(conn.execute(select(mem_seq.c.seq).where(mem_seq.c.id == 1)).scalar() or 0)

    def __getattr__(self, name: str) -> Any:
        """The store's method ``name`` (``put``, ``search``...): the tools' calls."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.store(), name)

    def close(self) -> None:
        """Close the store (the runtime's close, after its threads' jobs); idempotent."""
        with self._lock:
            self._closed = True
            opening = self._opening
        if opening is None:
            return
        if opening.thread is not None:
            opening.thread.join(CLOSE_WAIT_S)
        store, opening.store = opening.store, None
        if store is not None:
            store.close()

    def _attempt(self) -> _Opening | None:
        """The opening under way or done, or a new one if none was or the last one failed."""
        with self._lock:
            if self._closed:
                return None
            opening = self._opening
            if opening is None or (opening.done.is_set() and opening.error is not None):
                opening = self._opening = _Opening()
                opening.thread = threading.Thread(
                    target=self._open, args=(opening,), name="tiffany-memory-open", daemon=True
                )
                opening.thread.start()
            return opening

    def _open(self, opening: _Opening) -> None:
        from tiffany.memory import MemoryStore
        from tiffany.store.migrate import upgrade_url

        settings = self._settings
        try:
            upgrade_url(settings.database_url)  # the memory tables are Alembic's
            store = MemoryStore.from_settings(settings)  # database, embedder, size limit
        except Exception as exc:  # noqa: BLE001 - each memory call says why (MemoryUnavailable)
            opening.error = exc
            log.warning("memory.open_failed", error=repr(exc))
        else:
            with self._lock:
                closed = self._closed
                if not closed:
                    opening.store = store
            if closed:
                store.close()
            else:
                log.debug("memory.opened")
        finally:
            opening.done.set()
