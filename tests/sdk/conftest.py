"""Fixtures of the SDK tests: a real ``tiffany serve`` (loopback, a fresh data dir).

* ``server``: serve with ``--import usertools`` (a user's module in its
  working directory), shared by a module's tests.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from sdk_support import USER_TOOLS, Served, free_port, serve, short_dir  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    cwd = short_dir("tfk-")
    (cwd / "usertools.py").write_text(USER_TOOLS)
    # A port of its own: a test restarts the API process, which must come back on it.
    served = serve(cwd, "--import", "usertools", port=free_port())
    yield served
    served.stop()
