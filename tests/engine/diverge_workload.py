"""Workloads for the divergence test: code that changes under its journal."""

from __future__ import annotations

import os

from tiffany.kernel import Sleep


def changing():
    """Sleeps 30 s; with DIVERGE=1 it first sleeps 0.01 s (a different first call)."""
    if os.environ.get("DIVERGE") == "1":
        yield Sleep(0.01)
    yield Sleep(30)
    return "never"


def steady(seconds: float = 0.3):
    """Sleeps, then returns 42, whatever the environment."""
    yield Sleep(seconds)
    return 42
