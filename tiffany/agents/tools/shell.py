"""``shell``: run a command (an argv, never a shell string) in the run's workspace.

To use a shell the plan says so: ``["sh", "-c", "ls | wc -l"]``. The child
gets the workspace (or a directory inside it) as its cwd, an environment
built from the operator's allowlist (``ToolSettings.env_allowlist``) plus
the step's ``env``, nothing else from the engine's environment, and its own
session, so killing its process group reaches everything it started.

Timeouts are the worker's: it kills the tool task, :class:`TaskCancelled`
lands at the ``yield`` in :meth:`Process.communicate`, which kills the
process group; :meth:`ShellTool.run` then reaps the child before it lets the
cancellation go on, so no process outlives its step (not even as a zombie).

While the command runs, its output is published line by line as
``tool.output`` events (``stream``, ``text``: ``live_output.py``), capped
per second; the dashboard tails them. The result is built from the pipes as
before, whatever the live view showed or held back.

Sandbox (``ToolSettings.shell_sandbox``, docs/security.md):

* ``"none"``: run the argv directly (the operator's explicit choice; a
  server says so in its log and ``status``).
* ``"bwrap"``: run it under bubblewrap or not at all (``tool.shell.sandbox``
  when ``bwrap`` or ``prlimit`` is missing, or cannot create its namespaces
  here, or the process limit cannot hold: fail closed).
* ``"auto"`` (default): as ``"bwrap"``; only when ``ToolSettings.shell_fallback``
  is set (``tiffany run``: a person running their own plan in their own
  terminal, never a server) does it fall back to a direct run, with a
  ``tool.output`` event of ``level: "warning"``.

Under bubblewrap the child sees a read-only ``/usr`` (and the ``/bin``,
``/lib*`` links or directories), a handful of ``/etc`` files, a fresh
``/proc``, ``/dev`` and ``/tmp``, and the workspace read-write at its own
path; it has no network (a new, empty network namespace), its own pid, IPC,
UTS and cgroup namespaces, no capabilities, and dies with its parent. Its
environment is the allowlisted one (the engine's own never reaches it, and
the engine's ``/proc/<pid>/environ`` is out of its sight: own pid namespace).
Resource limits are set by wrapping the argv in util-linux ``prlimit``
inside the sandbox (no ``preexec_fn``, which is unsafe with threads):
``SANDBOX_CPU_S`` of CPU time, ``SANDBOX_AS_BYTES`` of address space,
files of at most ``SANDBOX_FSIZE_BYTES``, ``SANDBOX_NPROC`` processes.

Discussion:
    Linux does not enforce ``RLIMIT_NPROC`` against uid 0 (nor a user
    namespace mapped to it). When the engine runs as root, each sandboxed
    command is therefore put in a fresh pids cgroup (``pids.max`` =
    ``SANDBOX_NPROC``) by a two-line ``sh`` trampoline that writes its own pid
    to ``cgroup.procs`` and execs bubblewrap, so every process of the step is
    counted from the first. No writable pids cgroup as root: fail closed.
    Rejected: dropping to an unprivileged uid before bubblewrap (setpriv).
    It makes RLIMIT_NPROC hold, but that uid cannot reach a workspace under
    a private directory (pytest's 0700 temporaries, a 0700 data dir), and
    chowning workspaces back and forth races with steps running in parallel.
    Whether bubblewrap works is probed once per process with ``true``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Final

from pydantic import Field, field_validator

from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolError, ToolOutput
from tiffany.agents.tools.live_output import LiveOutput
from tiffany.agents.tools.workspace import ensure_workspace, workspace_dir
from tiffany.io import spawn_process
from tiffany.kernel import Coroutine, KillTask, NewTask

__all__ = [
    "SANDBOX_AS_BYTES",
    "SANDBOX_CPU_S",
    "SANDBOX_FSIZE_BYTES",
    "SANDBOX_NPROC",
    "SandboxUnavailable",
    "ShellArgs",
    "ShellExit",
    "ShellOutput",
    "ShellTool",
    "bwrap_argv",
]

#: CPU seconds a sandboxed command may use (RLIMIT_CPU).
SANDBOX_CPU_S: int = 600
#: Largest file a sandboxed command may write, in bytes (RLIMIT_FSIZE).
SANDBOX_FSIZE_BYTES: int = 1 << 30
#: Processes the sandboxed command may have (RLIMIT_NPROC; as root: its pids cgroup).
SANDBOX_NPROC: int = 512
#: Address space of each sandboxed process, in bytes (RLIMIT_AS: holds for root too).
SANDBOX_AS_BYTES: int = 4 << 30
#: Where the per-step pids cgroups are made when the engine runs as root (v1, then v2).
PIDS_CGROUP_ROOTS: tuple[str, ...] = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")
_CGROUP_DIR: Final = "tiffany-shell"
#: Trampoline: join the cgroup ($0 is its cgroup.procs), then become bubblewrap.
_JOIN_CGROUP: Final = 'echo $$ > "$0" && exec "$@"'
#: Hard ceiling on ``max_output_bytes`` whatever the settings say.
MAX_OUTPUT_BYTES_CEILING: Final = 64 << 20

#: Top-level directories bound read-only (or re-created as the symlinks they are).
_SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: The only /etc entries a sandboxed command sees.
_ETC_ENTRIES: Final = (
    "/etc/alternatives",
    "/etc/group",
    "/etc/hosts",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
)
#: Environment of the probe command.
_PROBE_ENV: Final = {"PATH": "/usr/bin:/bin"}

# bwrap path -> None when it works here, else why not (probed once per process).
_PROBES: dict[str, str | None] = {}


class ShellExit(ToolError):
    """The command exited with a non-zero status (fields: the result)."""

    code = "tool.shell.exit"


class SandboxUnavailable(ToolError):
    """The sandbox is required but bubblewrap is missing or does not work here."""

    code = "tool.shell.sandbox"


class CommandNotFound(ToolError):
    """The command's executable does not exist (unsandboxed runs)."""

    code = "tool.shell.not_found"


class ShellArgs(ToolArgs):
    """Arguments of ``shell``.

    Attributes:
        argv: The command and its arguments (non-empty; no shell involved).
        stdin: Text fed to the command's standard input (UTF-8).
        cwd: Working directory, relative to the workspace (confined like file paths).
        env: Variables set over the allowlisted ones.
        max_output_bytes: Keep at most this many bytes of stdout and of stderr
            each (default and ceiling: the operator's ``max_output_bytes``).
        check: Raise ``tool.shell.exit`` on a non-zero exit (else return it).
    """

    argv: list[str] = Field(min_length=1)
    stdin: str | None = None
    cwd: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    max_output_bytes: int | None = Field(default=None, ge=1, le=MAX_OUTPUT_BYTES_CEILING)
    check: bool = True

    @field_validator("argv")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise ValueError("argv[0] must name a command")
        if any("\x00" in a for a in argv):
            raise ValueError("argv holds a NUL byte")
        return argv

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not key or "=" in key or "\x00" in key or "\x00" in value:
                raise ValueError(f"invalid environment variable {key!r}")
        return env


class ShellOutput(ToolOutput):
    """What ``shell`` returns (also the fields of ``tool.shell.exit`` when ``check`` fails)."""

    exit_code: int = Field(
        description="The exit status; negative when a signal ended the command (-9: SIGKILL)."
    )
    stdout: str = Field(description="Standard output as UTF-8 text (bad bytes replaced).")
    stderr: str = Field(description="Standard error as UTF-8 text (bad bytes replaced).")
    stdout_truncated: bool = Field(description="stdout went past max_output_bytes and was cut.")
    stderr_truncated: bool = Field(description="stderr went past max_output_bytes and was cut.")


def bwrap_argv(bwrap: str, workspace: Path, cwd: Path, argv: list[str]) -> list[str]:
    """Return the argv that runs ``argv`` in the sandbox (see the module docstring).

    Args:
        bwrap: Path of the ``bwrap`` executable.
        workspace: The workspace (a real path: bound read-write at the same path).
        cwd: The command's directory inside the workspace.
        argv: The command.
    """
    out = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--cap-drop",
        "ALL",
    ]
    for top in _SYSTEM_DIRS:
        if os.path.islink(top):
            out += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            out += ["--ro-bind", top, top]
    out += ["--dir", "/etc"]
    for entry in _ETC_ENTRIES:
        out += ["--ro-bind-try", entry, entry]
    # /tmp first: the workspace may live under /tmp, and its bind must land on the tmpfs.
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    out += ["--bind", str(workspace), str(workspace), "--chdir", str(cwd), "--"]
    prlimit = shutil.which("prlimit")
    if prlimit is None:  # _sandbox refuses before; bwrap_argv alone stays usable
        raise SandboxUnavailable("prlimit (util-linux) is not installed: no resource limits")
    out += [
        prlimit,
        f"--cpu={SANDBOX_CPU_S}",
        f"--as={SANDBOX_AS_BYTES}",
        f"--fsize={SANDBOX_FSIZE_BYTES}",
        f"--nproc={SANDBOX_NPROC}",
        "--",
    ]
    return out + argv


# cgroups of finished steps that were still busy when we tried to remove them
_STALE_CGROUPS: list[str] = []


def pids_cgroup() -> str:
    """Make a fresh pids cgroup limited to ``SANDBOX_NPROC``; return its directory.

    Raises:
        SandboxUnavailable: No writable pids cgroup here (fail closed).
    """
    _release_stale()
    errors: list[str] = []
    for root in PIDS_CGROUP_ROOTS:
        if not os.path.exists(os.path.join(root, "pids.max")) and not os.path.exists(
            os.path.join(root, "cgroup.procs")
        ):
            errors.append(f"{root}: no cgroup here")
            continue
        path = os.path.join(root, _CGROUP_DIR, uuid.uuid4().hex[:16])
        try:
            os.makedirs(path, exist_ok=False)
        except OSError as exc:
            errors.append(f"{root}: {exc.strerror or exc}")
            continue
        try:
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(SANDBOX_NPROC))
        except OSError as exc:
            errors.append(f"{root}: pids.max: {exc.strerror or exc}")
            with contextlib.suppress(OSError):
                os.rmdir(path)
            continue
        return path
    raise SandboxUnavailable(
        "the engine runs as root and no writable pids cgroup limits a sandboxed "
        f"command's processes ({'; '.join(errors)}): run the engine as an "
        "unprivileged user, give it a pids cgroup, or set TIFFANY_SHELL_SANDBOX=none",
        mode="bwrap",
    )


def release_cgroup(path: str) -> None:
    """Remove a step's cgroup (later, if its processes are not all released yet)."""
    for _ in range(50):  # the kernel frees the last exited tasks within microseconds
        try:
            os.rmdir(path)
            return
        except OSError:
            os.sched_yield()
    if not _STALE_CGROUPS:
        atexit.register(_release_stale)
    _STALE_CGROUPS.append(path)


def _release_stale() -> None:
    for stale in list(_STALE_CGROUPS):
        with contextlib.suppress(OSError):
            os.rmdir(stale)
            _STALE_CGROUPS.remove(stale)


def _cgroup_argv(cgroup: str, argv: list[str]) -> list[str]:
    return ["/bin/sh", "-c", _JOIN_CGROUP, os.path.join(cgroup, "cgroup.procs"), *argv]


def _probe(bwrap: str) -> Coroutine:
    """Return None if bubblewrap can create its sandbox here, else the reason."""
    if bwrap in _PROBES:
        return _PROBES[bwrap]
    here = Path("/tmp")
    try:
        argv = bwrap_argv(bwrap, here, here, ["true"])
        proc = spawn_process(argv, cwd="/", env=_PROBE_ENV, stdin=False)
        done = yield proc.communicate(max_output_bytes=4096)
    except SandboxUnavailable as exc:
        reason: str | None = exc.message
    except OSError as exc:
        reason = f"cannot start {bwrap}: {exc}"
    else:
        err = done.stderr.decode("utf-8", "replace").strip()
        reason = None if done.returncode == 0 else f"exit {done.returncode}: {err}"
    _PROBES[bwrap] = reason
    return reason


def _sandbox(ctx: ToolContext) -> Coroutine:
    """Return the bwrap path to use, or None to run directly (or raise: fail closed)."""
    mode = ctx.settings.shell_sandbox
    if mode == "none":
        return None
    if mode not in ("auto", "bwrap"):
        raise SandboxUnavailable(f"unknown shell_sandbox mode {mode!r}", mode=mode)
    bwrap = shutil.which("bwrap")
    reason = "bubblewrap (bwrap) is not installed" if bwrap is None else (yield _probe(bwrap))
    if reason is None:
        return bwrap
    if mode == "bwrap" or not ctx.settings.shell_fallback:
        raise SandboxUnavailable(
            f"shell sandbox required but unavailable: {reason}; install bubblewrap (bwrap) "
            "or set TIFFANY_SHELL_SANDBOX=none to run shell steps unsandboxed on purpose",
            mode=mode,
        )
    ctx.emit(
        "tool.output",
        {"tool": "shell", "level": "warning", "message": f"running unsandboxed: {reason}"},
    )
    return None


def _environment(allowlist: tuple[str, ...], extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in allowlist if k in os.environ}
    env.update(extra)
    return env


class ShellTool:
    """Run a command: ``{"exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated"}``.

    ``exit_code`` is negative when a signal ended the command (``-9``: SIGKILL).
    """

    name: ClassVar[str] = "shell"
    Args: ClassVar[type[ToolArgs]] = ShellArgs
    Output: ClassVar[type[ToolOutput]] = ShellOutput
    durable: ClassVar[bool] = True

    def run(self, args: ShellArgs, ctx: ToolContext) -> Coroutine:
        """Run the command as a kernel task (pipes and exit wait through the selector)."""
        # On the loop, as spawning the command is: a mkdir once a run, next to a fork.
        workspace = Path(os.path.realpath(ensure_workspace(ctx.workspace)))
        cwd = workspace_dir(workspace, args.cwd)
        cap = min(args.max_output_bytes or ctx.settings.max_output_bytes, MAX_OUTPUT_BYTES_CEILING)
        cap = min(cap, ctx.settings.max_output_bytes)
        env = _environment(ctx.settings.env_allowlist, args.env)
        bwrap = yield _sandbox(ctx)
        argv = list(args.argv)
        cgroup: str | None = None
        if bwrap is not None:
            argv = bwrap_argv(bwrap, workspace, cwd, argv)
            if os.geteuid() == 0:  # RLIMIT_NPROC does not hold for root: a pids cgroup does
                cgroup = pids_cgroup()
                argv = _cgroup_argv(cgroup, argv)
        try:
            result = yield self._run(args, ctx, argv, cwd, env, cap, bwrap is not None)
        finally:
            if cgroup is not None:
                release_cgroup(cgroup)
        return result

    def _run(
        self,
        args: ShellArgs,
        ctx: ToolContext,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        cap: int,
        sandboxed: bool,
    ) -> Coroutine:
        try:
            proc = spawn_process(argv, cwd=cwd, env=env, stdin=args.stdin is not None)
        except FileNotFoundError as exc:
            raise CommandNotFound(
                f"command not found: {args.argv[0]}", command=args.argv[0]
            ) from exc
        except PermissionError as exc:
            raise CommandNotFound(
                f"cannot execute {args.argv[0]}: {exc}", command=args.argv[0]
            ) from exc
        ctx.emit(
            "tool.output",
            {
                "tool": "shell",
                "level": "info",
                "message": f"started pid {proc.pid}" + (" in the sandbox" if sandboxed else ""),
                "pid": proc.pid,
                "sandbox": sandboxed,
            },
        )
        live = LiveOutput(ctx.emit)
        ticker: int | None = None
        try:
            ticker = yield NewTask(live.ticker(), name=f"pid{proc.pid}.live")
            done = yield proc.communicate(
                (args.stdin or "").encode("utf-8"), max_output_bytes=cap, on_output=live.feed
            )
        except GeneratorExit:
            proc.kill()  # the scheduler is closing: no yield allowed, kill only
            raise
        except BaseException:
            proc.kill()  # communicate already did; a kill before it started needs this
            if ticker is not None:
                yield KillTask(ticker)
            yield proc.wait()  # reap: the child must not outlive the step, even as a zombie
            raise
        yield KillTask(ticker)
        live.flush(final=True)
        result: dict[str, Any] = {
            "exit_code": done.returncode,
            "stdout": done.stdout.decode("utf-8", errors="replace"),
            "stderr": done.stderr.decode("utf-8", errors="replace"),
            "stdout_truncated": done.stdout_dropped > 0,
            "stderr_truncated": done.stderr_dropped > 0,
        }
        if args.check and done.returncode != 0:
            raise ShellExit(f"{args.argv[0]} exited with status {done.returncode}", **result)
        return result
