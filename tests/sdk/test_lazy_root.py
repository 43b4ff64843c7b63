"""``import tiffany`` stays instant; its public names come on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tiffany


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_import_tiffany_pulls_in_neither_the_sdk_nor_the_kernel() -> None:
    loaded = _run(
        "import sys, tiffany; print(sorted(m for m in sys.modules "
        "if m.startswith(('tiffany.', 'httpx', 'websockets', 'pydantic'))))"
    )
    assert loaded == "[]"


def test_public_names_resolve_to_the_sdk_and_the_python_tool_decorator() -> None:
    from tiffany.agents.tools.python import python_tool
    from tiffany.sdk import AsyncClient, Client

    assert tiffany.Client is Client
    assert tiffany.AsyncClient is AsyncClient
    assert tiffany.python_tool is python_tool
    assert {"Client", "AsyncClient", "python_tool"} <= set(dir(tiffany))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = tiffany.nope  # type: ignore[attr-defined]
