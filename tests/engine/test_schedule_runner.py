"""The schedule runner's polls back off while the store is away, one log line a failure."""

from __future__ import annotations

import time

import structlog

from tiffany.engine.schedules import POLL_S, ScheduleRunner

#: Nothing listens on port 1 of loopback: every connection is refused at once.
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/test"


def test_a_store_that_refuses_connections_is_polled_less_and_less_often() -> None:
    submitted: list[dict] = []
    runner = ScheduleRunner(UNREACHABLE, lambda request: submitted.append(request) or {})
    seconds = 2.2
    with structlog.testing.capture_logs() as logs:
        runner.start()
        time.sleep(seconds)
        runner.stop()
    failed = [e for e in logs if e["event"] == "schedules.failed"]
    # Polled every POLL_S it failed seconds / POLL_S = 8 times; backing off
    # (0.25, 0.5, 1, 2 s) it fails at most 4 times in 2.2 s.
    assert 1 <= len(failed) <= 4 < seconds / POLL_S, failed
    assert runner.failures == len(failed)
    for event in failed:  # one line each: what failed and when it is tried again
        assert event["log_level"] == "warning"
        assert "exc_info" not in event
        assert "Connection refused" in event["error"] or "connection" in event["error"].lower()
        assert event["retry_in_s"] > 0
    assert [e["retry_in_s"] for e in failed] == sorted(e["retry_in_s"] for e in failed)
    assert submitted == []
