"""``file.read`` and ``file.write``: text files inside the run's workspace.

Paths are relative to the workspace and confined to it (see
``workspace.py``: no absolute paths, ``..``, NUL bytes, symlinks, special
files or hard links). Content is text: UTF-8, read with ``errors="replace"``.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from pydantic import Field

from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolOutput
from tiffany.agents.tools.workspace import open_in_workspace

__all__ = [
    "FileReadArgs",
    "FileReadOutput",
    "FileReadTool",
    "FileWriteArgs",
    "FileWriteOutput",
    "FileWriteTool",
]

#: Bytes read per ``os.read``.
READ_CHUNK_BYTES = 1 << 16


class FileReadArgs(ToolArgs):
    """Arguments of ``file.read``.

    Attributes:
        path: Relative to the workspace.
        max_bytes: Read at most this many bytes (default and ceiling: the
            operator's ``max_output_bytes``); ``truncated`` says when the file
            was longer.
    """

    path: str = Field(min_length=1)
    max_bytes: int | None = Field(default=None, ge=1)


class FileReadOutput(ToolOutput):
    """What ``file.read`` returns."""

    content: str = Field(description="The text read (UTF-8, bad bytes replaced).")
    bytes: int = Field(description="Bytes read (at most the cap), before decoding.")
    truncated: bool = Field(description="The file was longer than the cap.")


class FileReadTool:
    """Read a text file from the workspace: ``{"content", "bytes", "truncated"}``.

    ``bytes`` counts the bytes read (at most the cap), before decoding.
    """

    name: ClassVar[str] = "file.read"
    Args: ClassVar[type[ToolArgs]] = FileReadArgs
    Output: ClassVar[type[ToolOutput]] = FileReadOutput
    durable: ClassVar[bool] = True

    def run(self, args: FileReadArgs, ctx: ToolContext) -> dict[str, Any]:
        """Read the file (in the thread pool)."""
        cap = min(args.max_bytes or ctx.settings.max_output_bytes, ctx.settings.max_output_bytes)
        fd = open_in_workspace(ctx.workspace, args.path, os.O_RDONLY)
        chunks: list[bytes] = []
        kept = 0
        try:
            while kept <= cap:  # read one byte past the cap to learn whether there is more
                chunk = os.read(fd, min(READ_CHUNK_BYTES, cap + 1 - kept))
                if not chunk:
                    break
                chunks.append(chunk)
                kept += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        truncated = len(data) > cap
        data = data[:cap]
        return {
            "content": data.decode("utf-8", errors="replace"),
            "bytes": len(data),
            "truncated": truncated,
        }


class FileWriteArgs(ToolArgs):
    """Arguments of ``file.write``.

    Attributes:
        path: Relative to the workspace; missing parent directories are created.
        content: The text to write (UTF-8).
        mode: ``"w"`` replaces the file, ``"a"`` appends to it.
    """

    path: str = Field(min_length=1)
    content: str
    mode: Literal["w", "a"] = "w"


class FileWriteOutput(ToolOutput):
    """What ``file.write`` returns."""

    path: str = Field(description="The path written, as given.")
    bytes: int = Field(description="Bytes written (UTF-8).")


class FileWriteTool:
    """Write a text file in the workspace: ``{"path", "bytes"}`` (bytes written)."""

    name: ClassVar[str] = "file.write"
    Args: ClassVar[type[ToolArgs]] = FileWriteArgs
    Output: ClassVar[type[ToolOutput]] = FileWriteOutput
    durable: ClassVar[bool] = True

    def run(self, args: FileWriteArgs, ctx: ToolContext) -> dict[str, Any]:
        """Write the file (in the thread pool)."""
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if args.mode == "a" else 0)
        fd = open_in_workspace(
            ctx.workspace, args.path, flags, make_parents=True, truncate=args.mode == "w"
        )
        data = args.content.encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return {"path": args.path, "bytes": len(data)}
