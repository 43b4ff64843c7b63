"""The engine's view of the projector: lag while progressing is fine, a stall is not.

Drives :class:`tiffany.projector.link.ProjectorLink` with commit notices
and progress reports as the projector process writes them, on a manual
clock (no process started).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tiffany.projector import link as projector_link
from tiffany.projector.link import STALL_AFTER_S, ProjectorLink


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(projector_link, "time", c)
    return c


def _report(link: ProjectorLink, **fields: Any) -> None:
    line = {"last_seq": link.last_seq, "errors": 0, "consecutive_errors": 0, **fields}
    link._read_reports(io.BytesIO(json.dumps(line).encode() + b"\n"))


def test_lag_while_applying_is_not_a_stall_no_progress_is(clock: Clock, tmp_path: Path) -> None:
    link = ProjectorLink(tmp_path, {})
    link.committed(10)
    assert link.health()["lag_records"] == 10
    assert link.health()["stalled"] is False
    clock.now += STALL_AFTER_S - 1
    _report(link, last_seq=5)  # progress
    clock.now += STALL_AFTER_S - 1
    assert link.health()["stalled"] is False
    clock.now += 2
    health = link.health()
    assert health["stalled"] is True
    assert "5 waiting" in health["stalled_reason"]
    _report(link, last_seq=10)  # caught up: no lag, no stall however long it stays idle
    clock.now += 100 * STALL_AFTER_S
    assert link.health()["stalled"] is False
    assert link.health()["lag_records"] == 0


def test_failures_in_a_row_and_dead_letters_are_reported(clock: Clock, tmp_path: Path) -> None:
    link = ProjectorLink(tmp_path, {})
    link.committed(3)
    _report(link, consecutive_errors=2, last_error="OperationalError: refused")
    assert link.health()["stalled"] is False
    _report(link, consecutive_errors=3, last_error="OperationalError: refused", errors=3)
    health = link.health()
    assert health["stalled"] is True
    assert "OperationalError: refused" in health["stalled_reason"]
    _report(link, last_seq=3, dead_letters=2, errors=3)
    health = link.health()
    assert (health["stalled"], health["dead_letters"], health["errors"]) == (False, 2, 3)


def test_readers_are_answered_by_progress_reports_or_their_deadline(
    clock: Clock, tmp_path: Path
) -> None:
    link = ProjectorLink(tmp_path, {})
    link.committed(10)
    assert link.reported is False
    early = link.when_projected(4, wait_s=5.0)
    late = link.when_projected(9, wait_s=5.0)
    never = link.when_projected(50, wait_s=2.0)
    assert [f.done() for f in (early, late, never)] == [False, False, False]
    _report(link, last_seq=5)
    assert link.reported is True
    assert early.result(0) == {"last_seq": 5, "reached": True}
    assert not late.done()
    clock.now += 2.5  # past the third reader's deadline, not the second's
    link._expire(clock.now)
    assert never.result(0) == {"last_seq": 5, "reached": False}
    assert not late.done()
    _report(link, last_seq=10)
    assert late.result(0) == {"last_seq": 10, "reached": True}
    # already there: answered at once, without waiting for a report
    assert link.when_projected(10, wait_s=0.0).result(0) == {"last_seq": 10, "reached": True}
