"""The engine's one MemoryStore: opened off the loop, used from the thread pool, closed at stop.

The ``memory.*`` tools (``tiffany/agents/tools/memory.py``) run in the
scheduler's thread pool and reach the store as ``ToolContext.memory``:
this :class:`EngineMemory`, which stands for the store and forwards each
call to it. The scheduler thread never touches it: it runs no SQL, and
it never waits for the store to open.

Opening (the store's schema brought up to date with Alembic, then
``MemoryStore.open`` with the settings' embedder) happens on a thread of
its own: ``tiffany serve``'s engine starts it as it starts (after its own
migration), so the first memory step finds it open; an engine that never
starts it (``tiffany run``, tests) opens it on the first memory call, in
that call's thread. A call made while it opens waits for it, in its
thread. A store that could not be opened fails each memory step with
``memory.unavailable`` and why. The runtime closes it as it closes
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


class EngineMemory:
    """The engine's MemoryStore, opened once on a thread; stands for it (thread-safe).

    Args:
        settings: The engine's settings (``database_url``, the embeddings').
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._opened = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._error: BaseException | None = None
        self._closed = False

    def start(self) -> None:
        """Start opening the store on a thread of its own (once; returns at once)."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(
                target=self._open, name="tiffany-memory-open", daemon=True
            )
            self._thread.start()

    def store(self) -> Any:
        """The open store (blocking: a thread's; it may wait for the opening).

        Raises:
            MemoryUnavailable: The store could not be opened, or the engine is stopping.
        """
        from tiffany.agents.tools.memory import MemoryUnavailable

        if not self._opened.is_set():
            self.start()
            self._opened.wait()
        if self._error is not None:
            raise MemoryUnavailable(
                f"the memory store could not be opened: {self._error}",
                tool="memory",
            )
        if self._closed or self._store is None:
            raise MemoryUnavailable("the engine is stopping: its memory store is closed")
        return self._store

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
            thread = self._thread
        if thread is not None:
            thread.join(CLOSE_WAIT_S)
        store, self._store = self._store, None
        self._opened.set()  # a call that comes now is told the engine stops
        if store is not None:
            store.close()

    def _open(self) -> None:
        from tiffany.memory import MemoryStore, embedder_from_settings
        from tiffany.store.migrate import upgrade_url

        settings = self._settings
        try:
            upgrade_url(settings.database_url)  # the memory tables are Alembic's
            store = MemoryStore.open(
                settings.database_url, embedder=embedder_from_settings(settings)
            )
        except Exception as exc:  # noqa: BLE001 - each memory step says why (MemoryUnavailable)
            self._error = exc
            log.warning("memory.open_failed", error=repr(exc))
        else:
            with self._lock:
                closed = self._closed
                if not closed:
                    self._store = store
            if closed:
                store.close()
            else:
                log.debug("memory.opened")
        finally:
            self._opened.set()
