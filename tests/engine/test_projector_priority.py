"""The projector's CPU priority (``Priority``), in a process of its own: what the kernel says."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setscheduler"), reason="no scheduling policies on this platform"
)

_CHILD = """
import json, os
from tiffany.projector.process import Priority

def state():
    batch = os.sched_getscheduler(0) == os.SCHED_BATCH
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0), "batch": batch}

out = {"start": state()}
p = Priority(int(os.environ["NICE"]))
p.lower()
out["lowered"] = state()
p.readers(True)
out["reads_wait"] = state()
p.readers(True)  # no change, no call
out["still"] = state()
p.readers(False)
out["no_reads"] = state()
print(json.dumps(out))
"""


def _run(nice: int) -> dict[str, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env={**os.environ, "NICE": str(nice)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(proc.stdout)


def test_below_the_engine_a_batch_process_until_reads_wait():
    states = _run(7)
    base = states["start"]["nice"]
    assert states["start"]["batch"] is False
    lowered = min(19, int(str(base)) + 7)
    assert states["lowered"] == {"nice": lowered, "batch": True}
    # A read waits on the store: an ordinary process again, still niced.
    assert states["reads_wait"] == {"nice": lowered, "batch": False}
    assert states["still"] == {"nice": lowered, "batch": False}
    assert states["no_reads"] == {"nice": lowered, "batch": True}


def test_nice_zero_leaves_the_process_as_it_was():
    states = _run(0)
    assert states == dict.fromkeys(states, states["start"])
