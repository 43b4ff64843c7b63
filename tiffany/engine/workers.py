"""Worker processes for the engine's CPU work in Python that is not the loop's.

A replay (``verify``) and the checkpointer's fold of the WAL are Python
loops over thousands of records. On a thread of the engine they hold the
GIL against the scheduler thread in 5 ms slices: the loop then runs at half
speed for as long as they last. :class:`WorkerPool` runs them in a
``concurrent.futures.ProcessPoolExecutor`` instead.

Invariants:

* The workers come from the ``forkserver`` context: the engine has threads
  (control, hub, projector link), and a plain ``fork`` of a threaded process
  may copy a lock held by another thread. The fork server is started on the
  first call, with the listed modules preloaded, so later workers fork from a
  warm process; nothing is started for an engine that never needs one.
* A worker holds no secret it does not use: its settings come without the
  API token, the LLM key and, unless the journal is in the database
  (``journal=postgres``, which a replay reads), the database URL; its
  environment comes without the secret variables (``scrub_secrets``).
* A worker exits when the engine does, however the engine went (a pidfd).
* A ``background`` pool's workers run at the lowest CPU priority
  (``SCHED_IDLE``): on a machine whose cores the engine, the API and the
  projector keep busy, its work takes only what they leave idle. A process
  can be told that; a thread of the engine cannot (the GIL knows no
  priorities).
* A pool whose worker died is replaced at the next call.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import structlog

from tiffany.config import Settings

__all__ = ["WorkerPool", "worker_settings"]

log = structlog.get_logger(__name__)


def worker_settings(settings: Settings) -> Settings:
    """Return ``settings`` without the secrets a worker does not use."""
    reads_db = settings.journal == "postgres"
    return settings.model_copy(
        update={
            "api_token": None,
            "llm_api_key": None,
            "database_url": settings.database_url if reads_db else "",
        }
    )


def _init_worker(settings: Settings, engine_pid: int, background: bool = False) -> None:
    """Drop the secrets the environment holds; log like the engine; die with the engine.

    ``background``: run at the lowest CPU priority (``SCHED_IDLE``, else nice 19).
    """
    from tiffany.config import scrub_secrets
    from tiffany.log import configure_logging

    if background:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):  # not Linux, or not allowed: the next best thing
            with contextlib.suppress(OSError):
                os.nice(19)

    keep = scrub_secrets(dict(os.environ))
    for key in set(os.environ) - set(keep):
        del os.environ[key]
    configure_logging(settings)
    threading.Thread(
        target=_exit_with, args=(engine_pid,), name="tiffany-worker-watch", daemon=True
    ).start()


def _exit_with(pid: int) -> None:
    """Exit this worker when process ``pid`` (the engine) is gone, however it went.

    Discussion: a pool worker waits on its call queue, whose pipe it holds
    both ends of, and the fork server waits for its "alive" pipe, whose
    write end the worker inherited: after a kill -9 of the engine neither
    ever saw an end, and every crash left the two processes behind (found
    by counting processes after the kill -9 tests). The engine's pidfd
    becomes readable when it exits; the worker then exits, and with it
    the last holder of the fork server's pipe, so the fork server exits too.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already gone
        os._exit(0)
    except OSError:  # no pidfd here (an old kernel): look once a second
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:
                pass  # alive, another user's (a reused pid cannot be ours)
    select.select([fd], [], [])
    os._exit(0)


class WorkerPool:
    """A lazily started pool of ``workers`` forkserver processes (module docstring).

    Args:
        settings: The engine's settings; the workers get them without secrets.
        workers: Processes in the pool (calls beyond them queue).
        preload: Modules the fork server imports once.
        background: Run the workers at the lowest CPU priority (module docstring).
    """

    def __init__(
        self,
        settings: Settings,
        workers: int,
        preload: Sequence[str],
        *,
        background: bool = False,
    ) -> None:
        self.settings = worker_settings(settings)
        self.background = background
        self.workers = workers
        self.preload = list(preload)
        self._lock = threading.Lock()
        self._context = multiprocessing.get_context("forkserver")
        self._pool: ProcessPoolExecutor | None = None
        self.closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` in a worker (a fresh pool if a worker died since the last call).

        Raises:
            RuntimeError: The pool is closed.
        """
        with self._lock:
            if self.closed:
                raise RuntimeError("the worker pool is closed")
            if self._pool is None:
                self._context.set_forkserver_preload(self.preload)
                self._pool = self._new_pool()
            try:
                return self._pool.submit(fn, *args)
            except BrokenProcessPool:
                self._pool = self._new_pool()
                return self._pool.submit(fn, *args)

    def kill(self) -> int:
        """Drop the pool and kill its workers (a call may spin); return how many were killed."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return 0
        # Discussion: ProcessPoolExecutor cannot cancel a running call; its
        # ``terminate_workers()`` only comes with Python 3.14. Until then the
        # workers are killed by their processes, which the pool lists.
        workers = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers:
            proc.kill()
        return len(workers)

    def pids(self) -> list[int]:
        """The workers' process ids (none before the first call)."""
        with self._lock:
            pool = self._pool
        return list(getattr(pool, "_processes", {}).keys()) if pool is not None else []

    def close(self) -> None:
        """Stop the pool (a call under way is abandoned)."""
        with self._lock:
            self.closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.workers,
            mp_context=self._context,
            initializer=_init_worker,
            initargs=(self.settings, os.getpid(), self.background),
        )
