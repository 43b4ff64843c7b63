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

* The pool is a :class:`~tiffany.engine.workers.WorkerPool`: forkserver
  workers started on the first verify, without the secrets they do not use,
  that die with the engine. A replay runs no tool and writes nothing.
* A replay past :data:`VERIFY_TIMEOUT_S` answers 504 and its worker is
  killed (a pool whose worker died is replaced on the next verify).

Rejected: ``subprocess.run(tiffany replay --verify --json)`` and scraping its
stdout (the previous design): a Python start-up per verify, and a contract
(the last ``{``-line of stdout) that any stray print could break. A thread:
the GIL (above).
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final

import structlog

from tiffany.config import Settings
from tiffany.control import ControlError
from tiffany.engine.workers import WorkerPool

__all__ = ["VERIFY_TIMEOUT_S", "VERIFY_WORKERS", "Verifier"]

log = structlog.get_logger(__name__)

#: Replays that run at once (more verifies queue for a worker).
VERIFY_WORKERS: Final = 1
#: Longest a ``verify`` replay may take, in seconds (queueing included).
VERIFY_TIMEOUT_S: Final = 600.0
#: Modules the fork server imports once, so that each worker starts warm.
_PRELOAD: Final = ["tiffany.durable", "tiffany.engine"]


def _verify(settings: Settings, run_id: str) -> tuple[int, Any]:
    """Replay ``run_id`` (in a worker process): (200, report dict) or (status, message).

    Plain data goes back, not exceptions: an exception whose constructor
    takes other arguments than its ``args`` does not survive unpickling.
    """
    from tiffany.durable import UnknownRun, verify
    from tiffany.engine import journal_source, replay_resolvers
    from tiffany.errors import TiffanyError

    try:
        report = verify(
            settings.data_dir,
            run_id,
            resolvers=replay_resolvers(settings),
            log=journal_source(settings),
        )
    except UnknownRun as exc:
        return 404, str(exc)
    except TiffanyError as exc:  # the run's code cannot be loaded, the WAL is damaged...
        return 500, f"verify failed: {exc}"
    return 200, report.to_dict()


class Verifier:
    """Verify finished runs in a worker process (any thread may call :meth:`verify`).

    Args:
        settings: The engine's settings (data dir, tool settings); their
            secrets are left out of what the workers get.
        timeout_s: How long :meth:`verify` waits for a report.
    """

    def __init__(self, settings: Settings, *, timeout_s: float = VERIFY_TIMEOUT_S) -> None:
        self.pool = WorkerPool(settings, VERIFY_WORKERS, _PRELOAD)
        self.settings = self.pool.settings
        self.timeout_s = timeout_s

    def verify(self, run_id: str) -> dict[str, Any]:
        """Return ``run_id``'s replay report (``tiffany.durable.VerifyReport.to_dict()``).

        Raises:
            ControlError: 404 unknown run, 504 past the timeout, 503 when the
                engine is stopping, 500 when the worker died.
        """
        fut = self._submit(run_id)
        try:
            status, answer = fut.result(self.timeout_s)
        except FutureTimeout:
            self._kill(fut)
            raise ControlError(504, f"verify of {run_id} took over {self.timeout_s:g} s") from None
        except BrokenProcessPool as exc:
            self._kill(fut)
            raise ControlError(500, f"the verify worker died: {exc}") from None
        if status != 200:
            raise ControlError(status, str(answer))
        report: dict[str, Any] = answer
        return report

    def close(self) -> None:
        """Stop the pool (a replay under way is abandoned)."""
        self.pool.close()

    def _submit(self, run_id: str) -> Future[tuple[int, Any]]:
        try:
            return self.pool.submit(_verify, self.settings, run_id)
        except RuntimeError:  # closed
            raise ControlError(503, "the engine is stopping") from None

    def _kill(self, fut: Future[tuple[int, Any]]) -> None:
        """Drop the pool ``fut`` ran in and kill its workers (the replay may spin)."""
        killed = self.pool.kill()
        if killed:
            log.warning("engine.verify_pool_replaced", workers=killed, done=fut.done())
