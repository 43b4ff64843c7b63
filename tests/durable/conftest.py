from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(autouse=True)
def _reset_workloads():
    import durable_workloads

    durable_workloads.CALLS.clear()
    durable_workloads.MODE["value"] = "a"
    yield
    durable_workloads.CALLS.clear()
