"""Subprocesses as kernel coroutines.

Pipes are non-blocking and read through ``ReadWait``; the exit is observed
through a pidfd (Linux 5.3+), which becomes readable when the child exits,
so waiting for a process parks the task in the selector like any socket.

``communicate`` feeds stdin and drains stdout and stderr at once with child
tasks, so a chatty child never deadlocks on a full pipe. Output is capped:
bytes past ``max_output_bytes`` are counted and dropped, never buffered.
An ``on_output`` callback sees each chunk kept as it is read (the shell
tool's live view); it runs in the reader task, so it must not block.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import IO, Any

from tiffany.kernel import KillTask, NewTask, ReadWait, WaitTask, WriteWait

__all__ = ["CompletedRun", "Process", "spawn_process"]

Co = Generator[Any, Any, Any]

#: Bytes read from a pipe per ``os.read``.
READ_CHUNK_BYTES = 65536


@dataclass(slots=True)
class CompletedRun:
    """What ``communicate`` returns."""

    returncode: int
    stdout: bytes
    stderr: bytes
    stdout_dropped: int = 0
    stderr_dropped: int = 0


def spawn_process(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bool = True,
    start_new_session: bool = True,
) -> Process:
    """Start ``argv`` with piped stdin/stdout/stderr; return a :class:`Process`.

    A plain call (``fork``/``exec`` take about a millisecond). The child gets
    its own session so a kill reaches its whole process group.
    """
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=start_new_session,
    )
    return Process(popen)


class Process:
    """A running child process driven by kernel coroutines."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None:
                os.set_blocking(pipe.fileno(), False)
        self._pidfd: int | None = os.pidfd_open(self.pid) if hasattr(os, "pidfd_open") else None

    @property
    def returncode(self) -> int | None:
        """The exit status once waited for (negative: killed by that signal)."""
        return self.popen.returncode

    def read(self, pipe: IO[bytes], nbytes: int = READ_CHUNK_BYTES) -> Co:
        """Read up to ``nbytes`` from ``pipe``; ``b""`` at end of file."""
        fd = pipe.fileno()
        while True:
            try:
                return os.read(fd, nbytes)
            except BlockingIOError:
                yield ReadWait(fd)

    def write_all(self, pipe: IO[bytes], data: bytes) -> Co:
        """Write all of ``data`` to ``pipe`` (a broken pipe ends it quietly)."""
        fd = pipe.fileno()
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                yield WriteWait(fd)
            except BrokenPipeError:
                return len(data) - len(view)
            else:
                view = view[n:]
        return len(data)

    def read_all(
        self, pipe: IO[bytes], max_bytes: int, on_chunk: Callable[[bytes], None] | None = None
    ) -> Co:
        """Read ``pipe`` to its end; keep at most ``max_bytes``. Returns (data, dropped).

        ``on_chunk`` is called with each piece kept, as it is read.
        """
        chunks: list[bytes] = []
        kept = dropped = 0
        while True:
            chunk = yield self.read(pipe)
            if not chunk:
                return b"".join(chunks), dropped
            room = max_bytes - kept
            if room > 0:
                piece = chunk[:room] if room < len(chunk) else chunk
                chunks.append(piece)
                kept += len(piece)
                if on_chunk is not None:
                    on_chunk(piece)
            dropped += max(0, len(chunk) - max(room, 0))

    def wait(self) -> Co:
        """Wait for the child to exit; return its exit status."""
        if self.popen.returncode is not None:
            return self.popen.returncode
        if self._pidfd is not None:
            yield ReadWait(self._pidfd)
        else:  # pragma: no cover - kernels without pidfd: poll
            from tiffany.kernel import Sleep

            while self.popen.poll() is None:
                yield Sleep(0.01)
        code = self.popen.wait()
        self._close_pidfd()
        return code

    def communicate(
        self,
        stdin: bytes = b"",
        max_output_bytes: int = 1 << 20,
        on_output: Callable[[str, bytes], None] | None = None,
    ) -> Co:
        """Feed ``stdin``, collect stdout/stderr (capped), wait; return CompletedRun.

        ``on_output(stream, chunk)`` (``"stdout"`` or ``"stderr"``) sees each
        chunk kept as it is read; it must not block (it runs in the reader task).
        If the calling task is killed (or anything fails) meanwhile, the child's
        process group is killed too: a process never outlives its task.
        """
        p = self.popen
        assert p.stdout is not None
        assert p.stderr is not None
        on_out = on_err = None
        if on_output is not None:
            on_out, on_err = partial(on_output, "stdout"), partial(on_output, "stderr")
        out_tid = yield NewTask(
            self.read_all(p.stdout, max_output_bytes, on_out), name=f"pid{self.pid}.stdout"
        )
        err_tid = yield NewTask(
            self.read_all(p.stderr, max_output_bytes, on_err), name=f"pid{self.pid}.stderr"
        )
        try:
            if p.stdin is not None:
                if stdin:
                    yield self.write_all(p.stdin, stdin)
                p.stdin.close()
            out, out_dropped = yield WaitTask(out_tid)
            err, err_dropped = yield WaitTask(err_tid)
            code = yield self.wait()
        except BaseException as exc:
            # Cancelled or failed: the child must not outlive the task that owns it.
            self.kill()
            if not isinstance(exc, GeneratorExit):  # a closing generator cannot yield
                # Stop the readers before their pipes close under them: epoll
                # forgets a closed descriptor, so a reader parked on it would
                # never wake and would keep the loop alive for ever.
                yield KillTask(out_tid)
                yield KillTask(err_tid)
            raise
        finally:
            self.close_pipes()
        return CompletedRun(code, out, err, out_dropped, err_dropped)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the child's process group (default SIGKILL)."""
        if self.popen.returncode is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def close_pipes(self) -> None:
        """Close whichever pipes are still open."""
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        self._close_pidfd()
