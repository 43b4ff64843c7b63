"""Randomness: the only module of Tiffany allowed to import ``random``.

Each scheduler owns one seeded generator; task code gets random numbers only
through the ``Random()`` system call, so a replay can return the recorded
values and two runs with the same seed and the same external events make the
same choices.
"""

from __future__ import annotations

import random  # noqa: TID251 - this module is the one allowed place

__all__ = ["Entropy"]


class Entropy:
    """A per-scheduler source of random numbers.

    Args:
        seed: The seed; the same seed gives the same sequence.
    """

    __slots__ = ("_rng", "seed")

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def random(self) -> float:
        """Return the next float in [0, 1)."""
        return self._rng.random()
