"""Memory from a workflow: the ``memory.*`` tools as calls to yield.

::

    from tiffany.workflows import memory, workflow

    @workflow("learn")
    def learn(city: str):
        yield memory.put("facts.geo", "capital", {"city": city})
        item = yield memory.get("facts.geo", "capital")
        found = yield memory.search("facts.geo", "capital city", k=3)
        return {"city": item["item"]["value"]["city"], "hits": len(found["items"])}

Each call is :func:`~tiffany.workflows.tool` of the tool of its name
(``memory.get`` ...), so it is journaled as any tool call: a replay is
given the answer the run read (``as_of`` says when the store gave it), and
a write passes the store its exactly-once key, ``RUN/tool_N/0``: a crash
and a resume, or a retry, apply it once. A failure (a refusal naming the
field, no store) raises :class:`~tiffany.workflows.ToolFailed` at the yield.
What each returns is the tool's output (docs/tools.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tiffany.kernel import Coroutine
from tiffany.workflows.calls import tool

__all__ = ["delete", "get", "link", "neighbors", "put", "search"]


def _given(**args: Any) -> dict[str, Any]:
    """The arguments given: None is "not given" (the tool's default), not a value sent."""
    return {k: v for k, v in args.items() if v is not None}


def put(
    namespace: str,
    key: str | None = None,
    value: Any = None,
    *,
    text: str | None = None,
    ttl_s: float | None = None,
) -> Coroutine:
    """Write ``value`` under ``namespace``/``key`` (a new key if None); yield it for the result."""
    return tool(
        "memory.put", namespace=namespace, value=value, **_given(key=key, text=text, ttl_s=ttl_s)
    )


def get(namespace: str, key: str) -> Coroutine:
    """Read one item; yield it for ``{"found", "item", "as_of"}``."""
    return tool("memory.get", namespace=namespace, key=key)


def search(namespace: str, query: str, k: int = 10, *, mode: str = "hybrid") -> Coroutine:
    """Search ``namespace``; yield it for ``{"items"`` (best first), ``"mode", "as_of"...}``."""
    return tool("memory.search", namespace=namespace, query=query, k=k, mode=mode)


def link(
    subject: tuple[str, str],
    relation: str,
    obj: tuple[str, str],
    *,
    props: Mapping[str, Any] | None = None,
) -> Coroutine:
    """Link item ``subject`` (namespace, key) to ``obj`` by ``relation``; yield it."""
    return tool(
        "memory.link",
        subject={"namespace": subject[0], "key": subject[1]},
        relation=relation,
        object={"namespace": obj[0], "key": obj[1]},
        **_given(props=dict(props) if props is not None else None),
    )


def neighbors(
    namespace: str, key: str, *, relation: str | None = None, depth: int = 1, limit: int = 50
) -> Coroutine:
    """The items linked to an item; yield it for ``{"items", "as_of"}``."""
    return tool(
        "memory.neighbors",
        namespace=namespace,
        key=key,
        depth=depth,
        limit=limit,
        **_given(relation=relation),
    )


def delete(namespace: str, key: str) -> Coroutine:
    """Delete an item; yield it for ``{"namespace", "key", "deleted", "op", "store_seq"}``."""
    return tool("memory.delete", namespace=namespace, key=key)
