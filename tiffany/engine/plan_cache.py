"""Validated plans by content: a plan submitted again is not validated again.

The same plan document comes back again and again: a schedule submits it
at every tick, an agent plan runs with other inputs, and a re-run's plan
is the store's copy of the first submission's. Validating a large plan
(its models, references and graph) costs some thirty times what hashing its
JSON bytes does.

The key is the document's bytes (msgspec's encoding: two documents that
encode alike are alike) together with the tools this engine has, because
a tool enabled or disabled since then changes the answer. The cache holds
the newest :data:`MAX_PLANS`. Only valid plans are kept: a refused one is
checked again, and refused again, each time. A :class:`~tiffany.agents.plan.Plan`
is never changed once made (the planner and workers only read it), so one
serves every run of it. The control threads share the cache under a lock.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

if TYPE_CHECKING:
    from tiffany.agents.plan import Plan

__all__ = ["MAX_PLANS", "PlanCache"]

#: Validated plans kept (the newest used).
MAX_PLANS: Final = 64

_encode: Final = msgspec.json.Encoder().encode


class PlanCache:
    """Validated plans by (document bytes, tools); thread-safe."""

    def __init__(self, size: int = MAX_PLANS) -> None:
        self.size = size
        self.hits = 0
        self._plans: OrderedDict[tuple[bytes, Hashable], Plan] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, doc: Mapping[str, Any], tools: Hashable, validate: Callable[[], Plan]) -> Plan:
        """The plan of ``doc`` under ``tools``: kept, or ``validate()`` now (and kept).

        Raises whatever ``validate`` raises (a PlanError), and keeps nothing then.
        """
        try:
            digest = hashlib.blake2b(_encode(doc), digest_size=16).digest()
        except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
            return validate()  # not JSON: validation says what is wrong
        key = (digest, tools)
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self.hits += 1
                return plan
        plan = validate()
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)
        return plan
