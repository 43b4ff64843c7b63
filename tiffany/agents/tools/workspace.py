"""Confinement to a run's workspace: how file tools open paths, and shell picks its cwd.

A plan names files by paths *relative to the workspace*. A path is refused
(:class:`FileDenied`, ``tool.file.denied``) when it is absolute, holds a NUL
byte or a ``..`` component, or when any component on disk is a symbolic
link; a file that is not a regular file (a FIFO, a device) or has more than
one hard link is refused too (a hard link is how a file outside the
workspace could appear inside it).

The walk is ``openat``-style: the workspace is opened once, then every
directory component is opened relative to the previous directory's
descriptor with ``O_NOFOLLOW | O_DIRECTORY`` (``os.open(name, ...,
dir_fd=fd)``), and the last component with ``O_NOFOLLOW``. No path string is
ever resolved by the kernel from the root, so there is no window between a
check and the use of the checked path.

Discussion (TOCTOU stance): the file tools are race-free in this sense: a
symlink swapped in under a directory while a call runs is either seen (and
refused) or not reached at all. Rejected alternative: ``os.path.realpath``
plus a containment check, then ``open``: a rename between the two lets the
open escape. Linux's ``openat2(RESOLVE_BENEATH)`` would do the walk in one
call but Python has no binding for it. The shell tool's ``cwd`` is checked
with the same walk but handed to the child as a path (``chdir`` takes a
path), so a process racing the check from inside the workspace could
redirect it; such a process can already run commands, so the boundary
there is the sandbox (``shell.py``), not this module.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath

from tiffany.agents.tools.base import ToolError

__all__ = [
    "FileDenied",
    "FileNotFound",
    "ensure_workspace",
    "open_in_workspace",
    "split_relative",
    "workspace_dir",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Permissions of directories and files the tools create (before the umask).
DIR_MODE = 0o755
FILE_MODE = 0o644


class FileDenied(ToolError):
    """The path leaves the workspace, or names something the tools do not touch."""

    code = "tool.file.denied"


class FileNotFound(ToolError):
    """The path is inside the workspace but nothing is there."""

    code = "tool.file.not_found"


def split_relative(path: str) -> list[str]:
    """Return the components of a workspace-relative ``path`` (``[]`` for ``"."``).

    Raises:
        FileDenied: The path is absolute or holds a NUL byte or a ``..`` component.
    """
    if "\x00" in path:
        raise FileDenied("path holds a NUL byte", path=path.replace("\x00", "\\0"))
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("~"):
        raise FileDenied(
            f"path {path!r} is absolute; paths are relative to the workspace", path=path
        )
    parts = [p for p in pure.parts if p != "."]
    if ".." in parts:
        raise FileDenied(f"path {path!r} has a '..' component", path=path)
    return parts


def _open_dir(name: str, dir_fd: int, path: str, *, create: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise FileNotFound(f"no directory {name!r} on the way to {path!r}", path=path) from None
        # Created meanwhile (or a dangling symlink): the reopen decides.
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
        return _open_dir(name, dir_fd, path, create=False)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise FileDenied(
                f"{name!r} in {path!r} is a symbolic link or not a directory", path=path
            ) from None
        raise


def ensure_workspace(workspace: Path) -> Path:
    """Make the run's workspace directory if it is missing (and its parents); return it.

    Blocking: a tool's thread calls it (the worker hands a step the path
    alone, ``agents/worker.py``).
    """
    try:  # one mkdir in the usual case (the workspaces' root is there)
        os.mkdir(workspace, DIR_MODE)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(workspace, DIR_MODE, exist_ok=True)
    return workspace


def _walk(workspace: Path, parts: list[str], path: str, *, create: bool) -> int:
    """Open the directory ``parts`` names under ``workspace``; return its descriptor.

    A workspace not made yet (no step wrote there) holds nothing: with
    ``create`` it is made, else the path is not found.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        fd = os.open(workspace, flags)
    except FileNotFoundError:
        if not create:
            raise FileNotFound(f"no file {path!r} in the workspace", path=path) from None
        fd = os.open(ensure_workspace(workspace), flags)
    try:
        for name in parts:
            child = _open_dir(name, fd, path, create=create)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def workspace_dir(workspace: Path, path: str) -> Path:
    """Return the directory ``path`` names inside ``workspace`` (checked, not created).

    Raises:
        FileDenied: The path leaves the workspace or crosses a symlink.
        FileNotFound: A component does not exist.
    """
    parts = split_relative(path)
    os.close(_walk(workspace, parts, path, create=False))
    return workspace.joinpath(*parts)


def open_in_workspace(
    workspace: Path, path: str, flags: int, *, make_parents: bool = False, truncate: bool = False
) -> int:
    """Open the regular file ``path`` inside ``workspace``; return its descriptor.

    Args:
        workspace: The workspace directory (trusted).
        path: The plan's relative path.
        flags: ``os.open`` flags (``O_NOFOLLOW``, ``O_NONBLOCK`` and
            ``O_CLOEXEC`` are added).
        make_parents: Create missing parent directories (inside the workspace).
        truncate: Empty the file, once it passed the checks (``O_TRUNC`` at
            open would empty a hard-linked file before it could be refused).

    The descriptor is left in ``O_NONBLOCK`` mode: it only kept the open of a
    FIFO from hanging, and Linux ignores it for the regular files returned.
    A tool runs in a pool thread that gives up the GIL at every system call
    (and waits to get it back), so the path here makes as few as it can.

    Raises:
        FileDenied: See the module docstring.
        FileNotFound: Nothing at ``path`` and ``flags`` has no ``O_CREAT``.
    """
    parts = split_relative(path)
    if not parts:
        raise FileDenied(f"path {path!r} names the workspace itself, not a file", path=path)
    dir_fd = _walk(workspace, parts[:-1], path, create=make_parents)
    try:
        try:
            # O_NONBLOCK: opening a FIFO must not hang the tool; regular files ignore it.
            fd = os.open(
                parts[-1],
                flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                FILE_MODE,
                dir_fd=dir_fd,
            )
        except FileNotFoundError:
            raise FileNotFound(f"no file {path!r} in the workspace", path=path) from None
        except IsADirectoryError:
            raise FileDenied(f"{path!r} is a directory", path=path) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOTDIR):
                raise FileDenied(
                    f"{path!r} is a symbolic link or not a regular file", path=path
                ) from None
            raise
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        what = "has several hard links" if stat.S_ISREG(st.st_mode) else "is not a regular file"
        raise FileDenied(f"{path!r} {what}", path=path)
    if truncate and st.st_size:
        try:
            os.ftruncate(fd, 0)
        except BaseException:
            os.close(fd)
            raise
    return fd
