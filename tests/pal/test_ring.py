"""The relay's ring (``feed/ring.py``): positions, wrap-around, bytes of lag, keys."""

from __future__ import annotations

from tiffany.feed.ring import Ring


def _entry(key: float, text: str = "x") -> tuple[float, str | None, str]:
    return (key, None, text)


def test_positions_grow_and_the_oldest_entries_fall_off_the_tail() -> None:
    ring = Ring(3)
    assert (ring.start, ring.end, len(ring), ring.dropped) == (0, 0, 0, None)
    for key in (1, 2, 3):
        ring.append(_entry(key))
    assert (ring.start, ring.end, ring.dropped) == (0, 3, None)
    ring.append(_entry(4))
    ring.append(_entry(5))
    assert (ring.start, ring.end, len(ring)) == (2, 5, 3)
    assert ring.dropped == 2  # the key of the last entry overwritten
    assert [ring.at(p)[0] for p in range(ring.start, ring.end)] == [3, 4, 5]


def test_a_read_across_the_wrap_keeps_the_order_and_its_limit() -> None:
    ring = Ring(4)
    for key in range(1, 7):  # positions 2..5 held, stored at slots 2, 3, 0, 1
        ring.append(_entry(key))
    assert [e[0] for e in ring.read(2, 10)] == [3, 4, 5, 6]
    assert [e[0] for e in ring.read(3, 2)] == [4, 5]
    assert ring.read(ring.end, 10) == []


def test_bytes_after_a_position_is_the_text_from_it_to_the_end() -> None:
    ring = Ring(3)
    for key, text in ((1, "a"), (2, "bb"), (3, "ccc"), (4, "dddd")):
        ring.append(_entry(key, text))
    assert ring.bytes_after(ring.end) == 0
    assert ring.bytes_after(3) == 4
    assert ring.bytes_after(1) == 2 + 3 + 4
    assert ring.bytes_after(0) == 2 + 3 + 4  # off the tail: counted from the oldest held


def test_position_after_finds_the_first_key_above() -> None:
    ring = Ring(8)
    for key in (10, 20, 20.5, 30):  # 20.5: a relay's own entry between two seqs
        ring.append(_entry(key))
    assert ring.position_after(5) == 0
    assert ring.position_after(20) == 2
    assert ring.position_after(20.5) == 3
    assert ring.position_after(30) == ring.end
