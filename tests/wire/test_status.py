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


def test_the_kernel_s_task_states_are_the_wire_s() -> None:
    """The kernel names its own states; the journal's are the same words.

    All but ``created``: a task not yet scheduled, which no record shows.
    """
    from tiffany.kernel.task import TaskState as KernelTaskState
    from tiffany.wire.status import TaskState

    kernel = [s.value for s in KernelTaskState]
    assert [s for s in kernel if s != "created"] == [s.value for s in TaskState]


def test_every_task_state_says_a_run_status() -> None:
    from tiffany.wire.status import TASK_STATUS, TERMINAL_TASK, TaskState, status_of

    assert set(TASK_STATUS) == set(TaskState)
    assert {TASK_STATUS[s] for s in TERMINAL_TASK} == set(TERMINAL)
    assert status_of("crashed") == "failed"
    assert status_of("cancelling") == "cancelled"
    assert status_of("skipped") == "skipped"  # a step's own word says itself
