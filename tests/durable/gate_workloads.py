"""Workloads for the step-gate tests (importable by name: replay re-imports them)."""

from __future__ import annotations

from tiffany.durable import Step
from tiffany.kernel import NewTask, Now, Sleep, WaitTask

CALLS: list[str] = []


def effect(what: str) -> str:
    CALLS.append(what)
    return what.upper()


def _gated() -> object:
    return (yield Step(effect, "gated", name="gated:effect"))


def _free() -> object:
    # Dispatches after the gated step's: their numbers must stay aligned on replay.
    got = yield Step(effect, "free", name="free:effect")
    yield Sleep(0.001)
    t = yield Now()
    return [got, t > 0]


def pair() -> object:
    """A held step in one task while another task of the run goes on."""
    a = yield NewTask(_gated(), name="gated")
    b = yield NewTask(_free(), name="free")
    b_out = yield WaitTask(b)
    after = yield Step(effect, "after-free", name="free:after")
    a_out = yield WaitTask(a)
    return [a_out, b_out, after]
