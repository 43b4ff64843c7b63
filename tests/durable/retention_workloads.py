"""Workloads for the checkpoint and retention tests (importable by name: replay re-imports them)."""

from __future__ import annotations

from tiffany.kernel import Now, Random, Sleep


def quick(i: int) -> object:
    """A short run: a clock read, a random draw, a result."""
    yield Now()
    yield Random()
    return i


def dozer(seconds: float) -> object:
    """A run that stays unfinished while a test stops its runtime."""
    yield Sleep(seconds)
    return "woke"
