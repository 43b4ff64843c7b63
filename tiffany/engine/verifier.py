"""``verify`` for the engine: finished runs replayed in a small process pool.

The control op ``verify`` (and so ``POST /api/runs/{id}/verify``) replays a
finished run with :func:`tiffany.durable.verify`, the same function
``tiffany replay RUN --verify`` calls, and answers its report as a dict.
The replay runs in a ``concurrent.futures.ProcessPoolExecutor`` of
:data:`VERIFY_WORKERS` worker(s): a replay is CPU work in Python, and in
this process it would hold the GIL against the scheduler loop. The control
thread that asked waits on the future (with :data:`VERIFY_TIMEOUT_S`); the
scheduler thread never sees it.

Invariants:

* The workers come from the ``forkserver`` context: the engine has threads
  (control, hub, projector link), and a plain ``fork`` of a threaded process
  may copy a lock held by another thread. The fork server is started on the
  first verify, with the replay's modules preloaded, so later verifies fork
  a warm process; nothing is started for an engine that never verifies.
* A worker holds no secret it does not use: its settings come without the
  API token, the LLM key and, unless the journal is in the database
  (``journal=postgres``, which it reads), the database URL; its environment
  comes without the secret variables (``scrub_secrets``). A replay runs no
  tool and writes nothing.
* A replay past :data:`VERIFY_TIMEOUT_S` is refused
  (:class:`~tiffany.errors.VerifyTimedOut`) and its worker is killed (a
  pool whose worker died is replaced on the next verify).

Rejected: ``subprocess.run(tiffany replay --verify --json)`` and scraping its
stdout (the previous design): a Python start-up per verify, and a contract
(the last ``{``-line of stdout) that any stray print could break. A thread:
the GIL (above).
"""

from __future__ import annotations

import multiprocessing
import os
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final

import structlog

from tiffany.config import Settings
from tiffany.errors import EngineFault, EngineNotReady, RunNotFound, VerifyTimedOut, refusal
from tiffany.ports.journals import journals_for

__all__ = ["VERIFY_TIMEOUT_S", "VERIFY_WORKERS", "Verifier"]

log = structlog.get_logger(__name__)

#: Replays that run at once (more verifies queue for a worker).
VERIFY_WORKERS: Final = 1
#: Longest a ``verify`` replay may take, in seconds (queueing included).
VERIFY_TIMEOUT_S: Final = 600.0
#: Modules the fork server imports once, so that each worker starts warm.
_PRELOAD: Final = ["tiffany.durable", "tiffany.engine"]


def _init_worker(settings: Settings, engine_pid: int) -> None:
    """Drop the secrets the environment holds; log like the engine; die with the engine."""
    from tiffany.config import scrub_secrets
    from tiffany.log import configure_logging

    keep = scrub_secrets(dict(os.environ))
    for key in set(os.environ) - set(keep):
        del os.environ[key]
    configure_logging(settings)
    _import_user_modules(settings.tool_modules)
    threading.Thread(
        target=_exit_with, args=(engine_pid,), name="tiffany-verify-watch", daemon=True
    ).start()


def _import_user_modules(names: list[str]) -> None:
    """The operator's modules (``TIFFANY_TOOL_MODULES``), as the engine imported them.

    A workflow run replays only with its ``@workflow`` function registered;
    a module that fails here is logged, and the verify of a run that needs
    it answers why (an unknown workflow).
    """
    import importlib
    import sys

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - logged; the verify that needs it says so
            structlog.get_logger("tiffany.engine").error(
                "verify.import_failed", module=name, error=f"{type(exc).__name__}: {exc}"
            )


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


def _verify(settings: Settings, run_id: str) -> tuple[str, Any]:
    """Replay ``run_id`` (in a worker): ``("ok", report)`` or ``(refusal kind, message)``.

    Plain data goes back, not exceptions: an exception whose constructor
    takes other arguments than its ``args`` does not survive unpickling.
    """
    from tiffany.durable import UnknownRun, verify
    from tiffany.durable.retention import released_note
    from tiffany.engine import journal_source, replay_resolvers
    from tiffany.errors import TiffanyError
    from tiffany.wire.shards import seq_base

    try:
        report = verify(
            settings.data_dir,
            run_id,
            resolvers=replay_resolvers(settings),
            log=journal_source(settings),
        )
    except UnknownRun as exc:
        return (
            RunNotFound.kind,
            f"{exc}{released_note(journal_source(settings), seq_base(settings.engine) + 1)}",
        )
    except TiffanyError as exc:  # the run's code cannot be loaded, the WAL is damaged...
        return EngineFault.kind, f"verify failed: {exc}"
    return "ok", report.to_dict()


def _verify_fork(
    settings: Settings, head: dict[str, Any], records: list[tuple[int, int, bytes]]
) -> tuple[str, Any]:
    """Replay a fork's copy against the code as it is now (in a worker): the report, as dict.

    ``head``: the earlier run's ``run_id``, ``run_no``, ``name``, ``entry``,
    ``start_seq``, ``compat``; ``records``: the copy, ``(seq, type, body)``
    with the earlier run's seqs (a divergence names them). The copy is an
    unfinished run's journal: the code must reproduce every dispatch in it
    (``verify_loaded(unfinished=True)``).
    """
    from tiffany.durable.history import RunInfo, cursor_of
    from tiffany.durable.runtime import verify_loaded
    from tiffany.engine import replay_resolvers
    from tiffany.errors import TiffanyError

    spans = [(seq, rtype, b"\0\0\0\0" + body, 0, len(body) + 4, "") for seq, rtype, body in records]
    info = RunInfo(
        int(head["run_no"]),
        str(head["run_id"]),
        str(head["name"]),
        dict(head["entry"]),
        0.0,
        int(head["start_seq"]),
        compat=int(head["compat"]),
    )
    try:
        report = verify_loaded(info, cursor_of(spans), replay_resolvers(settings), unfinished=True)
    except TiffanyError as exc:
        return EngineFault.kind, f"verify failed: {exc}"
    return "ok", report.to_dict()


class Verifier:
    """Verify finished runs in a worker process (any thread may call :meth:`verify`).

    Args:
        settings: The engine's settings (data dir, tool settings); their
            secrets are left out of what the workers get.
        timeout_s: How long :meth:`verify` waits for a report.
    """

    def __init__(self, settings: Settings, *, timeout_s: float = VERIFY_TIMEOUT_S) -> None:
        reads_db = journals_for(settings).in_database
        self.settings = settings.model_copy(
            update={
                "api_token": None,
                "llm_api_key": None,
                "database_url": settings.database_url if reads_db else "",
            }
        )
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._context = multiprocessing.get_context("forkserver")
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def verify(self, run_id: str) -> dict[str, Any]:
        """Return ``run_id``'s replay report (``tiffany.durable.VerifyReport.to_dict()``).

        Raises:
            RunNotFound: The run is not in the journal.
            VerifyTimedOut: The replay took longer than ``timeout_s``.
            EngineNotReady: The engine is stopping.
            EngineFault: The worker died, or the replay failed.
        """
        fut = self._submit(run_id)
        return self._answer(fut, f"verify of {run_id} took over {self.timeout_s:g} s")

    def verify_fork(
        self, head: dict[str, Any], records: list[tuple[int, int, bytes]]
    ) -> dict[str, Any]:
        """Replay a workflow re-run's copy of the earlier run's journal (:func:`_verify_fork`).

        Raises as :meth:`verify` does.
        """
        fut = self._submit(head["run_id"], _verify_fork, head, records)
        return self._answer(fut, f"replaying run {head['run_id']}'s calls took too long")

    def _answer(self, fut: Future[tuple[str, Any]], too_long: str) -> dict[str, Any]:
        """The worker's report for ``fut``, waited for up to ``timeout_s``."""
        try:
            status, answer = fut.result(self.timeout_s)
        except FutureTimeout:
            self._kill(fut)
            raise VerifyTimedOut(too_long) from None
        except BrokenProcessPool as exc:
            self._kill(fut)
            raise EngineFault(f"the verify worker died: {exc}") from None
        if status != "ok":
            raise refusal(status, str(answer))
        report: dict[str, Any] = answer
        return report

    def close(self) -> None:
        """Stop the pool (a replay under way is abandoned)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _submit(
        self, run_id: str, fn: Callable[..., tuple[str, Any]] = _verify, *args: Any
    ) -> Future[tuple[str, Any]]:
        given = args or (run_id,)
        with self._lock:
            if self._closed:
                raise EngineNotReady("the engine is stopping")
            if self._pool is None:
                self._context.set_forkserver_preload(_PRELOAD)
                self._pool = self._new_pool()
            try:
                return self._pool.submit(fn, self.settings, *given)
            except BrokenProcessPool:  # a worker died since the last verify: a fresh pool
                self._pool = self._new_pool()
                return self._pool.submit(fn, self.settings, *given)

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            VERIFY_WORKERS,
            mp_context=self._context,
            initializer=_init_worker,
            initargs=(self.settings, os.getpid()),
        )

    def _kill(self, fut: Future[tuple[str, Any]]) -> None:
        """Drop the pool ``fut`` ran in and kill its workers (the replay may spin)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        # Discussion: ProcessPoolExecutor cannot cancel a running call; its
        # ``terminate_workers()`` only comes with Python 3.14. Until then the
        # workers are killed by their processes, which the pool lists.
        workers = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers:
            proc.kill()
        log.warning("engine.verify_pool_replaced", workers=len(workers), done=fut.done())
