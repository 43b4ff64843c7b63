"""The status vocabulary: one list of values, the enum and the Literal agreeing on it."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

from tiffany.sdk import models as sdk_models
from tiffany.store import models as store_models
from tiffany.wire.status import TERMINAL, RunStatus, RunStatusName, StepStatus


def test_the_literal_lists_the_enum_values_in_order() -> None:
    assert get_args(RunStatusName) == tuple(s.value for s in RunStatus)


def test_terminal_is_the_statuses_a_run_ends_with() -> None:
    assert {s.value for s in TERMINAL} == {"succeeded", "failed", "cancelled"}
    assert "failed" in TERMINAL  # a plain string from a JSON answer is found
    assert "waiting" not in TERMINAL


def test_the_store_and_the_sdk_use_the_one_definition() -> None:
    assert store_models.RunStatus is RunStatus
    assert store_models.StepStatus is StepStatus
    assert sdk_models.FINISHED is TERMINAL


def test_importing_the_statuses_loads_no_pydantic() -> None:
    """The statuses are stdlib only: a reader of them pays for no model library."""
    code = (
        "import sys, tiffany.wire.status; "
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'tiffany.'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "['tiffany.wire', 'tiffany.wire.status']"
