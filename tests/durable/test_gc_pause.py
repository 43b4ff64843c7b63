"""The collector pause around history decoding (``tiffany/durable/history.py``)."""

from __future__ import annotations

import gc

from tiffany.durable.history import _gc_paused


def test_a_pause_keeps_what_the_process_froze() -> None:
    """An engine froze its start-up heap; decoding history must not give it back.

    ``unfreeze`` after the pause moved every frozen object back to the
    collector: each full collection then walked the engine's start-up heap.
    """
    gc.collect()
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert before > 0
        with _gc_paused():
            records = [[i, {"n": i}] for i in range(1000)]
        # Not given back (``unfreeze`` would leave 0); other threads may free
        # a few frozen objects meanwhile, so no exact count.
        assert gc.get_freeze_count() > before // 2
        # The records frozen with it: out of the collector's generations.
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(r) in tracked or id(r[1]) in tracked for r in records)
        assert gc.isenabled()
        assert len(records) == 1000
    finally:
        gc.unfreeze()


def test_a_pause_leaves_nothing_frozen_where_nothing_was() -> None:
    """A process that froze nothing (``tiffany replay``): records go to the oldest generation."""
    gc.collect()
    assert gc.get_freeze_count() == 0
    with _gc_paused():
        records = [[i] for i in range(1000)]
    assert gc.get_freeze_count() == 0
    assert gc.get_count()[0] < 1000  # not left in the young generation either
    assert len(records) == 1000
