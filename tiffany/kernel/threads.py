"""The thread pool behind ``RunInThread``.

Blocking libraries run here so the scheduler thread never blocks. Workers
take jobs from a ``SimpleQueue``, append their outcome to a deque and bump an
eventfd (a self-pipe where there is no eventfd) that the scheduler watches
in its selector: a completion wakes the loop without polling.

Invariants: the scheduler is the only consumer of completions (``drain``);
outcomes come back in completion order, which is external nondeterminism
the journal records. Workers are daemon threads started on demand up to
``max_workers``; ``close`` stops them. Once :meth:`ThreadPool.halt` has
returned, no job starts (until :meth:`ThreadPool.resume`): a job a worker
took from the queue already (it is in flight) finishes, every other one
stays unstarted, set aside, and ``close`` discards them.

Discussion: a stop, a fail-stop or a fence must start nothing new. The jobs
queued here are steps whose STEP_START is durable and whose completion is
not: left unstarted, recovery (or the engine that takes the stream over)
runs each once, marked as a re-run; run here after the stop, each ran
twice. ``close`` used to queue its stop markers behind the pending jobs,
so a stopping engine ran every queued job first (issue 38: 24 of 30 runs'
steps ran twice after a SIGTERM). The gate is a flag each worker reads
after taking a job and before running it: no lock per job, and ``halt``
is safe in a signal handler (it only sets the flag).

Discussion: a halt comes from someone who knows (SIGTERM, a failed log, a
heartbeat that found the lease taken). An engine paused past its lease
(SIGSTOP, a long GC pause, a VM frozen) does not know yet when it wakes:
its workers and its heartbeat resume together, and a worker could start a
job the new owner of the stream is already running. So a worker also asks
the ``gate`` (the lease's deadline, by the local monotonic clock, which
keeps counting through a pause) right before it starts a job: when the
gate is shut the job is set aside as if halted, until :meth:`reopen` (the
lease renewed) or :meth:`close` (it was lost).

Rejected: ``concurrent.futures.ThreadPoolExecutor`` costs a Future, a lock
and a callback per job and its shutdown joins at interpreter exit; the
dozen lines here do what the loop needs.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Completion", "ThreadPool"]

#: (job token, result, exception): exactly one of result/exception is meaningful.
Completion = tuple[Any, Any, BaseException | None]


class ThreadPool:
    """A small pool of worker threads that report back through a descriptor.

    Args:
        max_workers: The most threads to start.
    """

    def __init__(self, max_workers: int = 8) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self.max_workers = max_workers
        self._jobs: queue.SimpleQueue[tuple[Any, Any, tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._done: deque[Completion] = deque()
        self._threads: list[threading.Thread] = []
        # One flag per worker: True from taking a job until its completion is
        # in ``_done`` (or it set the job aside). A list store each way, no lock.
        self._busy: list[bool] = []
        # One permit per worker that finished a job and is back at ``get``;
        # ``submit`` takes one to hand its job to that worker, or else starts
        # a thread (the scheme of ``concurrent.futures.thread``). A queue of
        # tokens, not a ``threading.Semaphore``: its put and get are one C
        # call each where the semaphore's are a Python ``Condition`` (a
        # measurable share of a step's trip through the pool).
        self._idle: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._closed = False
        # Set by ``halt``: workers set the jobs they take aside, unstarted.
        self._halted = False
        self._unstarted: deque[tuple[Any, Any, tuple[Any, ...]]] = deque()
        #: ``gate()``: False while a job may not start (a lease not known to
        #: be held); called by a worker before each job. None: always open.
        self.gate: Callable[[], bool] | None = None
        if hasattr(os, "eventfd"):
            self._rfd = self._wfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - non-Linux fallback
            self._rfd, self._wfd = os.pipe()
            os.set_blocking(self._rfd, False)

    def fileno(self) -> int:
        """Return the descriptor that becomes readable when a job completes."""
        return self._rfd

    def submit(self, token: Any, fn: Any, args: tuple[Any, ...]) -> None:
        """Run ``fn(*args)`` on a worker; its outcome comes back with ``token``."""
        if self._closed:
            raise RuntimeError("thread pool is closed")
        self._jobs.put((token, fn, args))
        try:
            self._idle.get_nowait()  # an idle worker takes the job
        except queue.Empty:
            if len(self._threads) >= self.max_workers:
                return
            self._busy.append(False)
            t = threading.Thread(
                target=self._work,
                args=(len(self._threads),),
                name=f"tiffany-pool-{len(self._threads)}",
                daemon=True,
            )
            self._threads.append(t)
            t.start()

    def complete(self, outcome: Completion) -> None:
        """Hand in the outcome of a job run elsewhere (a helped step): it arrives as a worker's."""
        self._done.append(outcome)
        self.nudge()

    def nudge(self) -> None:
        """Make the descriptor readable with no completion (any thread): a waiter looks again."""
        if not self._closed:
            self._signal(self._wfd, self._rfd == self._wfd)

    def drain(self) -> list[Completion]:
        """Return the completions that arrived, oldest first (scheduler only)."""
        try:
            if self._rfd == self._wfd:
                os.eventfd_read(self._rfd)
            else:  # pragma: no cover
                os.read(self._rfd, 4096)
        except BlockingIOError:
            pass
        done = self._done
        out = []
        while done:
            out.append(done.popleft())
        return out

    @property
    def in_flight(self) -> int:
        """Jobs a worker took and has not finished or set aside, plus completions not drained.

        Read by the scheduler while halted (``Scheduler.drain``). A worker
        marks itself busy before it asks whether it may start the job, so a
        job read as not in flight after a halt never starts. A worker that
        sets a job aside while halted signals the descriptor: a drain
        waiting on it looks again.
        """
        return sum(self._busy) + len(self._done)

    def halt(self) -> None:
        """Start no job from now on; jobs in flight finish, the others stay unstarted.

        Any thread, a signal handler included (it only sets a flag). The
        jobs stay queued until :meth:`resume` or :meth:`close`.
        """
        self._halted = True

    @property
    def halted(self) -> bool:
        """True from :meth:`halt` until :meth:`resume`."""
        return self._halted

    def resume(self) -> None:
        """Start jobs again: the ones set aside go back to the queue (scheduler only)."""
        if self._closed or not self._halted:
            return
        self._halted = False
        self._requeue()

    def reopen(self) -> None:
        """The gate opened again (any thread): the jobs it set aside go back to the queue.

        A halt is not undone here: halted jobs wait for :meth:`resume`.
        """
        if not self._halted and not self._closed:
            self._requeue()

    def _requeue(self) -> None:
        """Put the jobs set aside back on the queue (the workers that took them serve it)."""
        unstarted, jobs = self._unstarted, self._jobs
        while True:
            try:
                job = unstarted.popleft()
            except IndexError:
                return
            jobs.put(job)

    def close(self) -> int:
        """Stop the workers and close the descriptor; return how many jobs were discarded.

        The jobs that had not started never start (see :meth:`halt`); those
        in flight finish (each worker is given a second to).
        """
        if self._closed:
            return 0
        self._halted = True  # first: a job taken from now on is set aside
        self._closed = True
        jobs, unstarted = self._jobs, self._unstarted
        with contextlib.suppress(queue.Empty):
            while True:
                job = jobs.get_nowait()
                if job is not None:
                    unstarted.append(job)
        for _ in self._threads:
            jobs.put(None)
        for t in self._threads:
            t.join(timeout=1.0)
        discarded = len(unstarted)
        unstarted.clear()
        os.close(self._rfd)
        if self._wfd != self._rfd:  # pragma: no cover
            os.close(self._wfd)
        return discarded

    def _work(self, me: int) -> None:
        jobs, done, wfd, busy = self._jobs, self._done, self._wfd, self._busy
        eventfd = self._rfd == self._wfd
        while True:
            job = jobs.get()
            if job is None:
                return
            busy[me] = True  # before the halt is read: see ``in_flight``
            gate = self.gate
            if self._halted or (gate is not None and not gate()):
                # Not started: kept for resume or reopen, or discarded by close.
                self._unstarted.append(job)
                busy[me] = False
                del job
                if not self._halted and not self._closed and (gate is None or gate()):
                    self._requeue()  # resumed or reopened meanwhile: not stranded
                self._idle.put(None)
                if self._halted and not self._closed:
                    self._signal(wfd, eventfd)  # a drain counts in-flight jobs: look again
                continue
            token, fn, args = job
            try:
                outcome: Completion = (token, fn(*args), None)
            except BaseException as exc:  # noqa: BLE001 - delivered to the task
                outcome = (token, None, exc)
            done.append(outcome)
            busy[me] = False
            del job, token, fn, args, outcome
            self._idle.put(None)
            try:  # inline, not ``_signal``: a call less on every step's way back
                if eventfd:
                    os.eventfd_write(wfd, 1)
                else:  # pragma: no cover
                    os.write(wfd, b"\0")
            except OSError:  # closed during shutdown
                return

    @staticmethod
    def _signal(wfd: int, eventfd: bool) -> None:
        """Make the descriptor readable (nothing once it was closed)."""
        with contextlib.suppress(OSError):
            if eventfd:
                os.eventfd_write(wfd, 1)
            else:  # pragma: no cover
                os.write(wfd, b"\0")
