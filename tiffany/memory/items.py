"""An item's row and its answer: the columns read, the dict answered, the live filter.

Times are float seconds in the tables and ISO-8601 UTC strings (microseconds,
``Z``) in answers; an item is live while its ``expires_at`` is unset or
later than the reader's time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, bindparam, or_, select, tuple_

from tiffany.memory.tables import mem_items

__all__ = ["ITEM_COLUMNS", "answer", "by_key", "epoch", "iso", "live", "values"]

#: The columns an item's answer is made of.
ITEM_COLUMNS = (
    mem_items.c.namespace,
    mem_items.c.key,
    mem_items.c.value,
    mem_items.c.text,
    mem_items.c.version,
    mem_items.c.created_at,
    mem_items.c.updated_at,
    mem_items.c.run_id,
    mem_items.c.step_id,
    mem_items.c.expires_at,
)


def iso(at: float | None) -> str | None:
    """ISO-8601 UTC (microseconds, ``Z``) of epoch seconds, or None."""
    if at is None:
        return None
    # isoformat is C; strftime took a share of a search's time worth saving
    # (bench/README.md, "Figures behind design choices in the code").
    return datetime.fromtimestamp(at, UTC).replace(tzinfo=None).isoformat("T", "microseconds") + "Z"


def epoch(at: str | None) -> float | None:
    """The epoch seconds of an :func:`iso` time, or None."""
    if at is None:
        return None
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def live(now: float) -> Any:
    """The filter of items live at ``now``."""
    return or_(mem_items.c.expires_at.is_(None), mem_items.c.expires_at > now)


def answer(row: Any) -> dict[str, Any]:
    """The item dict a read answers, of a row of :data:`ITEM_COLUMNS`."""
    return {
        "namespace": row.namespace,
        "key": row.key,
        "value": json.loads(row.value),
        "text": row.text,
        "version": row.version,
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
        "run_id": row.run_id,
        "step_id": row.step_id,
        "expires_at": iso(row.expires_at),
    }


#: The live items of a namespace among some keys: built once (a search's hot path).
_BY_KEY = select(*ITEM_COLUMNS).where(
    mem_items.c.namespace == bindparam("ns"),
    mem_items.c.key.in_(bindparam("keys", expanding=True)),
    or_(mem_items.c.expires_at.is_(None), mem_items.c.expires_at > bindparam("now")),
)


def by_key(conn: Connection, ns: str, keys: Sequence[str], at: float) -> dict[str, dict[str, Any]]:
    """The live items of ``ns`` among ``keys``, by key."""
    if not keys:
        return {}
    rows = conn.execute(_BY_KEY, {"ns": ns, "keys": list(keys), "now": at}).all()
    return {r.key: answer(r) for r in rows}


def values(
    conn: Connection, nodes: Sequence[tuple[str, str]], at: float
) -> dict[tuple[str, str], Any]:
    """The values of the live items among ``nodes``, by ``(namespace, key)``."""
    out: dict[tuple[str, str], Any] = {}
    for start in range(0, len(nodes), 200):
        chunk = list(nodes[start : start + 200])
        rows = conn.execute(
            select(mem_items.c.namespace, mem_items.c.key, mem_items.c.value).where(
                tuple_(mem_items.c.namespace, mem_items.c.key).in_(chunk), live(at)
            )
        ).all()
        for r in rows:
            out[(r.namespace, r.key)] = json.loads(r.value)
    return out
