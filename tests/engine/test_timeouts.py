"""Timeouts that hold no thread (``tiffany/engine/timeouts.py``): real threads, real clocks."""

from __future__ import annotations

import threading
import time

from tiffany.engine.timeouts import Timeouts


def test_an_entry_expires_after_the_delay_and_in_order() -> None:
    timeouts = Timeouts(0.05)
    fired: list[tuple[int, float]] = []
    done = threading.Event()
    t0 = time.monotonic()
    try:
        for i in range(3):
            timeouts.start(lambda i=i: fired.append((i, time.monotonic() - t0)))
        timeouts.start(done.set)
        assert done.wait(5)
    finally:
        timeouts.close()
    assert [i for i, _ in fired] == [0, 1, 2]
    assert all(at >= 0.05 for _, at in fired)
    assert len(timeouts) == 0


def test_a_cancelled_entry_is_never_called_and_leaves_the_table() -> None:
    timeouts = Timeouts(0.05)
    called: list[str] = []
    done = threading.Event()
    try:
        token = timeouts.start(lambda: called.append("cancelled one"))
        timeouts.start(lambda: called.append("kept"))
        timeouts.start(done.set)
        timeouts.cancel(token)
        assert len(timeouts) == 2
        assert done.wait(5)
        timeouts.cancel(token)  # expired or cancelled already: nothing
    finally:
        timeouts.close()
    assert called == ["kept"]


def test_a_failing_handler_does_not_stop_the_others() -> None:
    timeouts = Timeouts(0.01)
    done = threading.Event()

    def boom() -> None:
        raise RuntimeError("boom")

    try:
        timeouts.start(boom)
        timeouts.start(done.set)
        assert done.wait(5)
    finally:
        timeouts.close()


def test_close_drops_what_is_left_and_stops_the_thread() -> None:
    timeouts = Timeouts(30.0)
    called: list[int] = []
    timeouts.start(lambda: called.append(1))
    thread = timeouts._thread
    timeouts.close()
    assert thread is not None
    assert not thread.is_alive()
    assert len(timeouts) == 0
    assert called == []
    timeouts.start(lambda: called.append(2))  # after close: dropped, no new thread
    assert len(timeouts) == 0
    assert timeouts._thread is thread


def _switches(thread: threading.Thread) -> int:
    """The times ``thread`` gave up the CPU to wait (Linux: its task's status)."""
    status = f"/proc/self/task/{thread.native_id}/status"
    with open(status) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary"))


def test_entries_answered_at_once_never_wake_the_thread() -> None:
    """Submissions answered within milliseconds (the usual case) cost the thread nothing."""
    timeouts = Timeouts(5.0)
    try:
        timeouts.cancel(timeouts.start(lambda: None))  # starts the thread
        time.sleep(0.05)  # it sleeps now, for the cancelled entry's deadline
        thread = timeouts._thread
        assert thread is not None
        before = _switches(thread)
        for _ in range(200):
            timeouts.cancel(timeouts.start(lambda: None))
            time.sleep(0.001)
        assert _switches(thread) - before < 5  # it was woken for each one before
    finally:
        timeouts.close()


def test_an_entry_that_comes_to_an_empty_table_still_expires_on_time() -> None:
    timeouts = Timeouts(1.0)
    fired = threading.Event()
    try:
        timeouts.cancel(timeouts.start(lambda: None))
        time.sleep(1.3)  # the cancelled entry's deadline passed: the table is empty
        t0 = time.monotonic()
        timeouts.start(fired.set)
        assert fired.wait(5)
        after = time.monotonic() - t0
    finally:
        timeouts.close()
    assert 1.0 <= after < 1.5  # a thread that missed it would call it a delay later
