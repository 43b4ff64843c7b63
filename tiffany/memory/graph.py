"""Walking links: the items around one item, nearest first, in a deterministic order.

Breadth first, both directions (``out`` along a link, ``in`` against it),
each item once at its nearest depth; within a depth by relation, direction
(out first), namespace and key. Expired or deleted items are not reached,
nor reached through. One statement per direction per depth (the frontier
as a tuple ``IN``), so a walk of depth 3 is at most six.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Connection, select, tuple_

from tiffany.memory.items import by_key, values
from tiffany.memory.tables import mem_links

__all__ = ["edges", "walk"]

_MISSING: Final = object()


def walk(
    conn: Connection,
    start: tuple[str, str],
    relation: str | None,
    depth: int,
    limit: int,
    at: float,
) -> list[dict[str, Any]]:
    """The items up to ``depth`` links from ``start`` (at most ``limit``); none if it is gone."""
    found: list[dict[str, Any]] = []
    if not by_key(conn, start[0], [start[1]], at):
        return []
    seen = {start}
    frontier = [start]
    for level in range(1, depth + 1):
        if not frontier or len(found) >= limit:
            break
        touching = edges(conn, frontier, relation)
        fresh: list[tuple[str, str, str, str]] = []
        for relation_name, direction, other_ns, other_key in touching:
            if (other_ns, other_key) in seen:
                continue
            seen.add((other_ns, other_key))
            fresh.append((relation_name, direction, other_ns, other_key))
        held = values(conn, [(n, k) for _, _, n, k in fresh], at)
        frontier = []
        for relation_name, direction, other_ns, other_key in fresh:
            value = held.get((other_ns, other_key), _MISSING)
            if value is _MISSING:
                continue
            frontier.append((other_ns, other_key))
            found.append(
                {
                    "namespace": other_ns,
                    "key": other_key,
                    "relation": relation_name,
                    "direction": direction,
                    "depth": level,
                    "value": value,
                }
            )
            if len(found) >= limit:
                break
    return found


def edges(
    conn: Connection, frontier: Sequence[tuple[str, str]], relation: str | None
) -> list[tuple[str, str, str, str]]:
    """Links touching ``frontier``: ``(relation, direction, other ns, other key)``, sorted."""
    c = mem_links.c
    found: set[tuple[str, str, str, str]] = set()
    for start in range(0, len(frontier), 200):
        chunk = list(frontier[start : start + 200])
        out_q = select(c.relation, c.dst_ns, c.dst_key).where(
            tuple_(c.src_ns, c.src_key).in_(chunk)
        )
        in_q = select(c.relation, c.src_ns, c.src_key).where(tuple_(c.dst_ns, c.dst_key).in_(chunk))
        if relation is not None:
            out_q = out_q.where(c.relation == relation)
            in_q = in_q.where(c.relation == relation)
        found.update((r, "out", n, k) for r, n, k in conn.execute(out_q))
        found.update((r, "in", n, k) for r, n, k in conn.execute(in_q))
    return sorted(found, key=lambda e: (e[0], e[1] != "out", e[2], e[3]))
