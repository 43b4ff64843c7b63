"""``/api/memory``: the agents' memory, read (namespaces, items, search, an item) and deleted.

The memory is the :class:`~tiffany.memory.MemoryStore`'s (docs/memory.md):
runs write it through their ``memory.*`` steps, journaled; this API reads it
as it is now (``tiffany/api/memory.py``: one store, its calls in the
threadpool) and deletes an item on a person's request.

* ``GET /api/memory``: the namespaces that hold items;
* ``GET /api/memory/{namespace}?after=&limit=``: a page of its items, by key;
* ``GET /api/memory/{namespace}/search?q=&k=&mode=``: the ``k`` best hits,
  best first, with how they were found (mode, embedder, the store's seq);
* ``GET /api/memory/{namespace}/{key}``: the item, its links, its versions
  and its neighbours along links (``depth``); 404 naming it when absent;
* ``DELETE /api/memory/{namespace}/{key}``: deletes it, exactly once: the
  write's key (``op``) is ``api:<Idempotency-Key>`` when the request has
  one, so a retried DELETE answers the first one's result; otherwise a new
  ``api:<uuid>``. 404 when there was nothing to delete.

Bounds are the store's (a namespace's pattern, a key's length, ``k``) and
stated in the schema; what the schema cannot state (a key's characters must
be printable) the store refuses, 422 naming the field (``api/problems.py``).
A key is the rest of the path (it may hold ``/``); ``search`` is reserved.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Header, Path, Query
from starlette.convertors import Convertor, register_url_convertor

from tiffany.api.deps import State
from tiffany.api.memory import item_detail
from tiffany.api.schemas import (
    ErrorBody,
    MemoryDeleted,
    MemoryItemDetail,
    MemoryItems,
    MemoryNamespaces,
    MemorySearch,
)
from tiffany.errors import MemoryInvalid, MemoryNotFound, TiffanyError
from tiffany.memory import limits

__all__ = [
    "DEFAULT_PAGE",
    "KEY_PATTERN",
    "MAX_KEY_CHARS",
    "MAX_PAGE",
    "MAX_QUERY_CHARS",
    "NAMESPACE_PATTERN",
    "router",
]

router = APIRouter(prefix="/api/memory", tags=["memory"])

#: A namespace (docs/memory.md): dots for hierarchy (``users.alice``); the store's rule.
NAMESPACE_PATTERN: Final = f"^{limits.NAMESPACE_RE.pattern}$"
#: A key: no control character, no space at either end (the store also
#: refuses what is not printable, which no pattern states simply).
KEY_PATTERN: Final = r"^[^\s\x00-\x1f\x7f-\x9f]([^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$"
MAX_KEY_CHARS: Final = limits.KEY_MAX_CHARS
#: The longest search text, in characters: a question in a URL (the store
#: takes up to ``limits.QUERY_MAX_CHARS``, a tool's argument).
MAX_QUERY_CHARS: Final = 1_000
#: Items a page holds unless asked, and at most (the store's most is larger).
DEFAULT_PAGE: Final = 50
MAX_PAGE: Final = 500
#: Hits a search answers unless asked, and at most.
DEFAULT_K: Final = 10
MAX_K: Final = limits.K_MAX
#: How far an item's neighbours are followed along links, at most.
MAX_DEPTH: Final = limits.MAX_DEPTH


class ItemKey(Convertor[str]):
    """An item's key in a path: the rest of the path, ``/`` included, but not ``search``.

    ``search`` is the search route's (the store reserves the key), so the
    item routes do not match it: ``/api/memory/{namespace}/search`` takes
    GET only, and its 405 says so (``Allow`` lists what matches the path).
    Registered with Starlette's convertors under :data:`ITEM_KEY` (a
    registry of names: registering again replaces it with the same).
    """

    regex = "(?!search$).+"

    def convert(self, value: str) -> str:
        """The key, as it is."""
        return value

    def to_string(self, value: str) -> str:
        """The key, as it is."""
        return value


#: The name the item routes' paths give :class:`ItemKey` (``{key:memory_key}``).
ITEM_KEY: Final = "memory_key"
register_url_convertor(ITEM_KEY, ItemKey())


class MemoryKeyReused(TiffanyError):
    """An Idempotency-Key that named another write already (HTTP 409)."""

    code = "memory.idempotency_key_reused"
    http_status = 409


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
    422: {"model": ErrorBody, "description": "A bad namespace, key or parameter (named)."},
    503: {"model": ErrorBody, "description": "The store is not available."},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such item in the namespace."}
}

Namespace = Annotated[
    str,
    Path(
        min_length=1,
        max_length=128,
        pattern=NAMESPACE_PATTERN,
        description="The namespace (letters, digits, ``._:@-``; dots for hierarchy).",
    ),
]
Key = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_KEY_CHARS,
        pattern=KEY_PATTERN,
        description="The item's key (printable, no space at either end; may hold ``/``).",
    ),
]


def _not_found(namespace: str, key: str) -> TiffanyError:
    return MemoryNotFound(
        f"no item {key[:80]!r} in namespace {namespace!r}",
        field="key",
        detail={"namespace": namespace, "key": key[:80]},
    )


@router.get("", response_model=MemoryNamespaces, responses=_ERRORS)
async def list_namespaces(state: State) -> dict[str, Any]:
    """The namespaces that hold items: how many, their bytes, when each last changed."""
    return {"namespaces": await state.memory.call(lambda store: store.namespaces())}


@router.get("/{namespace}", response_model=MemoryItems, responses=_ERRORS)
async def list_items(
    namespace: Namespace,
    state: State,
    after: Annotated[
        str | None,
        Query(
            max_length=MAX_KEY_CHARS,
            description="The previous page's ``next`` (paging): items after this key.",
        ),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE, description="Items a page holds at most.")
    ] = DEFAULT_PAGE,
) -> dict[str, Any]:
    """A page of the namespace's items, by key; the next with ``after=<next>``.

    A namespace that holds nothing answers an empty page.
    """
    return await state.memory.call(
        lambda store: store.items(namespace, after=after or None, limit=limit)
    )


@router.get("/{namespace}/search", response_model=MemorySearch, responses=_ERRORS)
async def search(
    namespace: Namespace,
    state: State,
    q: Annotated[
        str,
        Query(
            min_length=1,
            max_length=MAX_QUERY_CHARS,
            # Not only blanks (the store strips what Python calls space: \x1c-\x1f too).
            pattern=r"[^\s\x1c-\x1f]",
            description="What to look for (words, a question).",
        ),
    ],
    k: Annotated[int, Query(ge=1, le=MAX_K, description="How many hits at most.")] = DEFAULT_K,
    mode: Annotated[
        Literal["hybrid", "text", "vector"],
        Query(description="Full-text and vector fused (``hybrid``), or one of them."),
    ] = "hybrid",
) -> dict[str, Any]:
    """The ``k`` items that best match ``q``, best first, each with its score.

    The answer says how they were found: the ``mode``, the ``embedder`` that
    made the vectors (an offline one says so in its ``kind``) and ``as_of``,
    the store's write sequence searched.
    """
    return await state.memory.call(lambda store: store.search(namespace, q, k, mode=mode))


@router.get(
    f"/{{namespace}}/{{key:{ITEM_KEY}}}",
    response_model=MemoryItemDetail,
    responses={**_NOT_FOUND, **_ERRORS},
)
async def get_item(
    namespace: Namespace,
    key: Key,
    state: State,
    depth: Annotated[
        int, Query(ge=1, le=MAX_DEPTH, description="How far to follow links for ``neighbors``.")
    ] = 1,
) -> dict[str, Any]:
    """An item, its links (both ways), its versions (oldest first) and its neighbours."""
    found = await state.memory.call(lambda store: item_detail(store, namespace, key, depth))
    if found is None:
        raise _not_found(namespace, key)
    return found


@router.delete(
    f"/{{namespace}}/{{key:{ITEM_KEY}}}",
    response_model=MemoryDeleted,
    responses={
        **_NOT_FOUND,
        409: {"model": ErrorBody, "description": "Idempotency-Key reused for another write."},
        **_ERRORS,
    },
)
async def delete_item(
    namespace: Namespace,
    key: Key,
    state: State,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=255,
            pattern=r"^[\x20-\x7e]+$",
            description="Makes a retried DELETE answer the first one's result (printable ASCII).",
        ),
    ] = None,
) -> dict[str, Any]:
    """Delete an item (its versions stay in its history); exactly once.

    With an ``Idempotency-Key``, the deletion's key is ``api:<key>``: the
    same request again answers the first one's result (200 even though the
    item is gone since). Without one, deleting what is not there is a 404.
    """
    op = f"api:{idempotency_key}" if idempotency_key else f"api:{uuid.uuid4()}"
    try:
        done = await state.memory.call(lambda store: store.delete(namespace, key, op=op))
    except MemoryInvalid as exc:
        if _field(exc) != "op":
            raise
        raise MemoryKeyReused(
            "this Idempotency-Key named another write already: send a new key",
            idempotency_key=idempotency_key,
        ) from None
    if not done.get("deleted"):
        raise _not_found(namespace, key)
    return dict(done)


def _field(exc: MemoryInvalid) -> str | None:
    return exc.field
