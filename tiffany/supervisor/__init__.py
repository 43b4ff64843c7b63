"""One supervisor for every child process Tiffany starts.

``tiffany serve`` starts engine and API processes; each engine starts its
projector process. Both start, watch, restart and stop their children the
same way, through :class:`Child`:

* **Restart backoff** (:class:`RestartPolicy`): a child that died is started
  again after tenacity's exponential wait (``first_s`` doubling up to
  ``max_s``), counted over the deaths in a row; a child that ran
  ``stable_s`` before it died starts the count over, so a crash loop backs
  off and a child that served for an hour is back at once.
* **Exit codes**: a code in :attr:`RestartPolicy.no_restart` (a bad setting,
  a damaged WAL: no restart mends it) is raised as :class:`NoRestart` for
  the owner to stop on; any other death, at any moment (while starting
  too), is a restart.
* **Never blocking**: :meth:`Child.tend` looks once and returns; the wait
  before a restart is a deadline (:attr:`Child.due`) the owner's own loop
  keeps (serve's poll of all its children, the projector link's notifier
  thread), so one child's backoff never holds up the care of another.
* **Logging**: each death is told once, with its code and the wait before
  the restart (``child.died``, or the owner's ``on_died``: serve tells the
  operator on stderr).
* **Stopping** (:meth:`Child.stop`): SIGTERM (or the owner's own request,
  an EOF on the child's stdin), a bounded wait, SIGKILL at the deadline.
* **Dying with the parent** (:mod:`tiffany.supervisor.lifeline`): a child
  started with ``--supervisor PID`` holds the parent-death signal
  (``PR_SET_PDEATHSIG``), so a ``kill -9`` of ``serve`` takes its children
  along. A child fed through a pipe (the projector) needs none: the pipe's
  EOF is its lifeline, and it is the safer one, since the parent-death
  signal follows the *thread* that forked the child (the link's notifier
  thread ends at a clean stop while the projector still drains the WAL).

Rejected: tenacity's ``Retrying`` as the restart loop itself. It sleeps
between attempts and supervises one thing at a time; serve tends several
children from one loop on deadlines, so only the wait strategy is taken
from tenacity.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import tenacity

__all__ = ["Child", "NoRestart", "RestartPolicy", "stop_all"]


def _log() -> Any:
    """This module's logger.

    structlog and tenacity are imported on first use, not with the module:
    every CLI process imports it (``serve``'s children hold their lifeline
    from here), and a client command needs neither.
    """
    import structlog

    return structlog.get_logger(__name__)


#: How long a child gets to stop before SIGKILL, unless told, in seconds.
STOP_TIMEOUT_S: Final = 20.0


class NoRestart(Exception):
    """A child exited with a code no restart mends (:attr:`RestartPolicy.no_restart`)."""

    def __init__(self, child: Child, code: int) -> None:
        super().__init__(f"the {child.name} exited with code {code}")
        self.child = child
        self.code = code


class RestartPolicy:
    """When a child that died is started again: tenacity's exponential wait, reset once stable.

    Args:
        first_s: The wait after the first death in a row, in seconds.
        max_s: The longest wait (the backoff's cap), in seconds.
        stable_s: A child that ran this long before it died starts the
            count over (None: never; the owner calls :meth:`reset`).
        no_restart: Exit codes that stop the owner instead (:class:`NoRestart`).
    """

    def __init__(
        self,
        first_s: float,
        max_s: float,
        *,
        stable_s: float | None = None,
        no_restart: Iterable[int] = (),
    ) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.stable_s = stable_s
        self.no_restart = frozenset(no_restart)
        import tenacity  # on first use (_log)

        self._wait: tenacity.wait.wait_base = tenacity.wait_exponential(
            multiplier=first_s, max=max_s
        )
        self._deaths = 0  # in a row

    def delay(self, ran_s: float) -> float:
        """The wait before restarting a child that ran ``ran_s`` seconds and died."""
        if self.stable_s is not None and ran_s >= self.stable_s:
            self._deaths = 0
        self._deaths += 1
        import tenacity

        state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = self._deaths
        return float(self._wait(state))

    def reset(self) -> None:
        """The child is well: the next death waits ``first_s`` again."""
        self._deaths = 0


def _log_death(child: Child, code: int, delay: float) -> None:
    _log().warning("child.died", child=child.name, code=code, restart_in_s=delay)


class Child:
    """One supervised child process: started, watched, restarted after backoff, stopped.

    Args:
        name: How messages name it (``engine``, ``api``, ``projector``).
        argv: Its command line.
        env: Its environment (only the secrets it uses: cli/serve.py).
        policy: When to start it again after it died.
        pass_fds: File descriptors each of its processes inherits.
        pipes: Give it a stdin and a stdout pipe (unbuffered).
        on_start: Called with each new process (the owner attaches to its pipes).
        on_died: Called with the child, its exit code and the wait before
            the restart, once a death (default: a ``child.died`` log line).
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        policy: RestartPolicy,
        *,
        pass_fds: tuple[int, ...] = (),
        pipes: bool = False,
        on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
        on_died: Callable[[Child, int, float], None] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.policy = policy
        self.pass_fds = pass_fds
        self.pipes = pipes
        self.on_start = on_start
        self.on_died = on_died or _log_death
        self.proc: subprocess.Popen[bytes] | None = None
        #: Restarts so far (not counting the first start).
        self.restarts = 0
        #: When its latest process started (monotonic seconds).
        self.started_at = 0.0
        #: When :meth:`tend` starts it (monotonic): 0 before its first start,
        #: a deadline once it died, None while it runs (or after :meth:`stop`).
        self.due: float | None = 0.0
        self._stopped = False  # by stop(): its end is no death

    def start(self) -> subprocess.Popen[bytes]:
        """Start a process of it now (``OSError`` if it cannot be)."""
        self.due = None
        self._stopped = False
        self.started_at = time.monotonic()
        pipe = subprocess.PIPE if self.pipes else None
        self.proc = subprocess.Popen(
            self.argv, env=self.env, pass_fds=self.pass_fds, stdin=pipe, stdout=pipe, bufsize=0
        )
        _log().debug("child.started", child=self.name, pid=self.proc.pid)
        if self.on_start is not None:
            self.on_start(self.proc)
        return self.proc

    def alive(self) -> bool:
        """Whether its latest process runs."""
        return self.proc is not None and self.proc.poll() is None

    def tend(self, now: float | None = None, *, may_start: bool = True) -> bool:
        """Look at it once, never waiting; return whether a process of it runs.

        A process that died is told (``on_died``) and given its restart
        deadline (:attr:`due`); once that has come (and ``may_start``), a
        new process starts. Raises :class:`NoRestart` for an exit code the
        policy says no restart mends, and ``OSError`` from a start that
        failed (the restart is due again after the policy's next wait).
        A child :meth:`stop` stopped is left alone.
        """
        now = time.monotonic() if now is None else now
        proc = self.proc
        if self._stopped:
            return False
        if self.due is not None:
            if now < self.due or not may_start:
                return False
            if proc is not None:
                self.restarts += 1
            try:
                self.start()
            except OSError:
                self.due = now + self.policy.delay(0.0)
                raise
            return True
        if proc is None:
            return False
        code = proc.poll()
        if code is None:
            return True
        if code in self.policy.no_restart:
            raise NoRestart(self, code)
        delay = self.policy.delay(now - self.started_at)
        self.due = now + delay
        self.on_died(self, code, delay)
        return False

    def stop(self, timeout: float = STOP_TIMEOUT_S, *, term: bool = True) -> int | None:
        """Stop its process: SIGTERM (unless ``term`` is false: asked already), wait, SIGKILL.

        Returns its exit code, or None if it never started. A stopped
        child is not restarted (:meth:`tend`) until :meth:`start`.
        """
        self.due = None
        self._stopped = True
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        if term:  # a second SIGTERM could land after its handler is gone
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.killing(timeout)
            proc.kill()
            return proc.wait()

    def killing(self, timeout: float) -> None:
        """Tell that its process did not stop within ``timeout`` seconds and is killed."""
        pid = self.proc.pid if self.proc is not None else None
        _log().warning("child.kill", child=self.name, pid=pid, after_s=timeout)


def stop_all(children: Sequence[Child], timeout: float = STOP_TIMEOUT_S) -> list[int | None]:
    """Stop children together (SIGTERM to all, then wait for each); return their codes."""
    for child in children:
        proc = child.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return [child.stop(timeout, term=False) for child in children]
