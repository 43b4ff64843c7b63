"""``memory.*``: a run's reads and writes of the MemoryStore, as durable steps.

``memory.put``, ``memory.get``, ``memory.search``, ``memory.link``,
``memory.neighbors`` and ``memory.delete`` call the engine's one
MemoryStore (``tiffany/memory/``, docs/memory.md), which reaches a tool as
``ToolContext.memory``. Each is a plain ``run``: it runs in the scheduler's
thread pool (the store blocks on SQL; the loop never does) inside the
worker's durable ``Step``, so its answer is journaled:

* a **read** (get, search, neighbors) returns the store's answer, with
  ``as_of`` (the store's sequence number: every write up to it is in the
  answer). A replay or a
  ``--verify`` is given that answer from the journal, however memory
  changed since; a re-run (``tiffany rerun``: a new run) calls the store
  again and reads memory as it is now, its ``as_of`` saying when.
* a **write** (put, link, delete) passes the store an ``op``, its
  exactly-once key: ``RUN/STEP/CALL`` (:func:`write_op`). The step's
  attempt is not part of it: a retry, or the step run again after a crash
  before its result was journaled, gives the same op, and the store
  answers a write it already applied with that first application's result,
  writing nothing. Its result (with the item's version, the store's seq
  and the embedding computed at the write) is journaled, and
  ``tiffany db rebuild`` re-applies it from there.

The store's refusals (a namespace out of bounds, a value too large, a
namespace full) fail the step with the store's code and the field it
names; a store the engine could not open fails it with
``memory.unavailable``.

This module imports no part of ``tiffany.memory`` (the agents' room does
not depend on it): the store is reached through :class:`MemoryPort`, and
the bounds the arguments check here are the store's (docs/memory.md; a
test holds them equal), so a plan that breaks one is refused at
submission, naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final, Literal, Protocol, TypeVar

from pydantic import Field

from tiffany.agents.tools.base import ToolArgs, ToolContext, ToolError, ToolOutput
from tiffany.errors import TiffanyError

__all__ = [
    "MEMORY_TOOLS",
    "WRITE_TOOLS",
    "MemoryDeleteTool",
    "MemoryGetTool",
    "MemoryLinkTool",
    "MemoryNeighborsTool",
    "MemoryPort",
    "MemoryPutTool",
    "MemorySearchTool",
    "MemoryUnavailable",
    "memory_call",
    "write_op",
]

#: A namespace: dots for hierarchy (``users.alice``), the store's bound (docs/memory.md).
NAMESPACE_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
#: A link's relation: as a namespace, up to 64 characters.
RELATION_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$"
#: Longest key, in characters.
MAX_KEY_CHARS: Final = 256
#: Longest indexed text, in characters (the store bounds its UTF-8 bytes: 32 KiB).
MAX_TEXT_CHARS: Final = 32 * 1024
#: Longest search query, in characters.
MAX_QUERY_CHARS: Final = 4096
#: Longest time-to-live, in seconds (ten years).
MAX_TTL_S: Final = 10 * 365 * 86_400.0
#: Most items a search returns.
MAX_K: Final = 100
#: Deepest walk along links.
MAX_DEPTH: Final = 3
#: Most neighbours one call returns.
MAX_NEIGHBORS: Final = 1000

T = TypeVar("T")


class MemoryUnavailable(ToolError):
    """This engine has no MemoryStore (none configured, or it could not be opened)."""

    code = "memory.unavailable"


class MemoryPort(Protocol):
    """What the tools call on the store (``tiffany.memory.MemoryStore``; blocking)."""

    def put(
        self,
        namespace: str,
        key: str | None,
        value: Any,
        text: str | None = None,
        *,
        op: str,
        ttl_s: float | None = None,
        run_id: str | None = None,
        step_id: str | None = None,
    ) -> dict[str, Any]:
        """Write an item (a no-op returning the first result for an op applied already)."""
        ...

    def get(self, namespace: str, key: str) -> dict[str, Any] | None:
        """The item, or None."""
        ...

    def search(
        self, namespace: str, query: str, k: int = 10, *, mode: str = "hybrid"
    ) -> dict[str, Any]:
        """The best ``k`` items for ``query``."""
        ...

    def link(
        self,
        subject: tuple[str, str],
        relation: str,
        obj: tuple[str, str],
        *,
        op: str,
        props: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Link two items."""
        ...

    def neighbors(
        self,
        namespace: str,
        key: str,
        *,
        relation: str | None = None,
        depth: int = 1,
        limit: int = 50,
    ) -> dict[str, Any]:
        """The items linked to an item."""
        ...

    def delete(self, namespace: str, key: str, *, op: str) -> dict[str, Any]:
        """Delete an item."""
        ...


def memory_of(ctx: ToolContext) -> MemoryPort:
    """The engine's store, or :class:`MemoryUnavailable`."""
    store = ctx.memory
    if store is None:
        raise MemoryUnavailable(
            "this engine has no memory store: memory tools run on an engine (tiffany serve, "
            "tiffany run) whose store (TIFFANY_DATABASE_URL, or the data dir's SQLite file) "
            "holds the memory tables",
            tool="memory",
        )
    return store  # type: ignore[no-any-return]


def write_op(ctx: ToolContext) -> str:
    """The exactly-once key of the write ``ctx``'s step makes: ``RUN/STEP/CALL``.

    ``CALL`` is 0 for a plan step or a workflow's call (one write per step),
    or the ordinal of an ``agent`` step's tool call. No attempt: a retry or
    a re-run after a crash is the same write, applied once. An agent's
    *later* attempts are new conversations whose model decides anew, so
    their calls are their own writes: ``RUN/STEP/CALL@ATTEMPT``.
    """
    if ctx.call is None:
        return f"{ctx.run_id}/{ctx.step_id}/0"
    if ctx.attempt <= 1:
        return f"{ctx.run_id}/{ctx.step_id}/{ctx.call}"
    return f"{ctx.run_id}/{ctx.step_id}/{ctx.call}@{ctx.attempt}"


def memory_call(fn: Callable[[], T]) -> T:
    """Call the store; its refusals become the step's error (its code, the field it names).

    A refusal (``MemoryInvalid``, ``MemoryFull``...) is a ``TiffanyError``
    with a code and fields; it is raised again as a :class:`ToolError`
    carrying both, so the step's error says ``memory.invalid`` and
    ``field: namespace`` and the kernel logs it as an outcome, not a crash.
    """
    try:
        return fn()
    except ToolError:
        raise
    except TiffanyError as exc:
        fields = dict(exc.fields)
        field = getattr(exc, "field", None)  # MemoryRefused's: the argument it is about
        if isinstance(field, str):
            fields["field"] = field
        refused = ToolError(exc.message, **fields)
        refused.code = exc.code
        raise refused from exc


def _seq(store: Any) -> int | None:
    """The store's newest write's seq, read before a read that does not give its own.

    Every write up to it is in the read's answer (a lower bound: a write
    committed between the two reads may be in it too). None: a store that
    cannot say (the engine's can: ``tiffany/engine/memory.py``).
    """
    seq = getattr(store, "seq", None)
    return seq() if callable(seq) else None


# -- shared shapes ----------------------------------------------------------------------


class MemoryRef(ToolArgs):
    """An item's address."""

    namespace: str = Field(
        pattern=NAMESPACE_PATTERN, description="The item's namespace (``users.alice``)."
    )
    key: str = Field(min_length=1, max_length=MAX_KEY_CHARS, description="The item's key.")


class MemoryRefOut(ToolOutput):
    """An item's address."""

    namespace: str
    key: str


class EmbedderInfo(ToolOutput):
    """The embedder that computed an item's (or a query's) vector."""

    id: str = Field(description="Its identity (model and dimensions).")
    dims: int = Field(description="Dimensions of its vectors.")
    kind: str = Field(description="What it is (``offline feature hashing``, an endpoint's model).")


class MemoryItem(ToolOutput):
    """One item as the store holds it."""

    namespace: str
    key: str
    value: Any = Field(description="Its JSON value.")
    text: str | None = Field(
        description="The text that is indexed (derived from the value if not given)."
    )
    version: int = Field(description="1 for the first write, then one more per write.")
    created_at: str = Field(description="ISO-8601 UTC.")
    updated_at: str = Field(description="ISO-8601 UTC.")
    run_id: str | None = Field(description="The run whose step wrote it (None: the HTTP API).")
    step_id: str | None = Field(description="That step.")
    expires_at: str | None = Field(
        description="When its time-to-live ends (ISO-8601 UTC), or None."
    )


class ScoredItem(MemoryItem):
    """An item a search found, with its score (higher is better)."""

    score: float


# -- memory.put -------------------------------------------------------------------------


class MemoryPutArgs(ToolArgs):
    """Arguments of ``memory.put``."""

    namespace: str = Field(
        pattern=NAMESPACE_PATTERN,
        description="Where the item lives: letters, digits and ``._:@-``, at most 128 "
        "characters, dots for hierarchy (``users.alice``).",
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_KEY_CHARS,
        description="The item's key (a write to an existing key makes a new version); "
        "unset: a new key, the same one if the step runs again.",
    )
    value: Any = Field(description="Any JSON value, at most 64 KiB.")
    text: str | None = Field(
        default=None,
        max_length=MAX_TEXT_CHARS,
        description="The text search indexes (default: the value if a string, else its "
        "strings' leaves joined by newlines).",
    )
    ttl_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TTL_S,
        description="Seconds until the item expires (default: never; at most ten years).",
    )


class MemoryPutOutput(ToolOutput):
    """What ``memory.put`` returns: the write, as ``tiffany db rebuild`` re-applies it.

    The whole write is journaled with it (its value, text, time and the
    embedding computed at the write), so a rebuild writes it again without
    calling the embedder.
    """

    write: Literal["put"]
    namespace: str
    key: str = Field(description="The item's key (the one made for it when none was given).")
    version: int = Field(description="The item's version after this write.")
    created: bool = Field(description="True if this write created the item.")
    embedder: EmbedderInfo
    op: str = Field(description="The write's exactly-once key (``RUN/STEP/CALL``).")
    store_seq: int = Field(description="The store's sequence number of this write.")
    vector: str = Field(description="The embedding (base64 of float32 little-endian).")
    value: Any = Field(description="The value written.")
    text: str = Field(description="The text indexed.")
    ttl_s: float | None = Field(description="Its time-to-live, in seconds, or None.")
    run_id: str | None = Field(description="The run that wrote it.")
    step_id: str | None = Field(description="The step that wrote it.")
    at: str = Field(description="When it was written (ISO-8601 UTC).")
    expires_at: str | None = Field(description="When it expires (ISO-8601 UTC), or None.")


class MemoryPutTool:
    """Write an item to memory (exactly once per step, however often the step runs)."""

    name: ClassVar[str] = "memory.put"
    Args: ClassVar[type[ToolArgs]] = MemoryPutArgs
    Output: ClassVar[type[ToolOutput]] = MemoryPutOutput
    durable: ClassVar[bool] = True

    def run(self, args: MemoryPutArgs, ctx: ToolContext) -> dict[str, Any]:
        """Put (in the thread pool)."""
        store = memory_of(ctx)
        return memory_call(
            lambda: store.put(
                args.namespace,
                args.key,
                args.value,
                args.text,
                op=write_op(ctx),
                ttl_s=args.ttl_s,
                run_id=ctx.run_id,
                step_id=ctx.step_id,
            )
        )


# -- memory.get -------------------------------------------------------------------------


class MemoryGetArgs(ToolArgs):
    """Arguments of ``memory.get``."""

    namespace: str = Field(pattern=NAMESPACE_PATTERN, description="The item's namespace.")
    key: str = Field(min_length=1, max_length=MAX_KEY_CHARS, description="The item's key.")


class MemoryGetOutput(ToolOutput):
    """What ``memory.get`` returns (journaled: a replay reads what the run read)."""

    found: bool = Field(description="False when no such item (or it expired).")
    item: MemoryItem | None = Field(description="The item, or None.")
    as_of: int | None = Field(
        description="The store's sequence number: every write up to it is in the answer."
    )


class MemoryGetTool:
    """Read one item of memory (the answer is journaled)."""

    name: ClassVar[str] = "memory.get"
    Args: ClassVar[type[ToolArgs]] = MemoryGetArgs
    Output: ClassVar[type[ToolOutput]] = MemoryGetOutput
    durable: ClassVar[bool] = True

    def run(self, args: MemoryGetArgs, ctx: ToolContext) -> dict[str, Any]:
        """Get (in the thread pool)."""
        store = memory_of(ctx)
        as_of = memory_call(lambda: _seq(store))
        item = memory_call(lambda: store.get(args.namespace, args.key))
        return {"found": item is not None, "item": item, "as_of": as_of}


# -- memory.search ----------------------------------------------------------------------


class MemorySearchArgs(ToolArgs):
    """Arguments of ``memory.search``."""

    namespace: str = Field(pattern=NAMESPACE_PATTERN, description="The namespace searched.")
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What to look for.")
    k: int = Field(default=10, ge=1, le=MAX_K, description="Most items returned (1..100).")
    mode: Literal["hybrid", "text", "vector"] = Field(
        default="hybrid",
        description="``hybrid``: full-text and vector similarity fused by rank; ``text``: "
        "full-text only; ``vector``: embeddings only.",
    )


class MemorySearchOutput(ToolOutput):
    """What ``memory.search`` returns (journaled: a replay reads what the run read)."""

    items: list[ScoredItem] = Field(description="The items found, best first.")
    mode: str = Field(description="The mode searched.")
    embedder: EmbedderInfo
    as_of: int | None = Field(
        description="The store's sequence number: every write up to it is in the answer."
    )
    vector_index: str | None = Field(
        default=None,
        description="What ranked the vectors: ``pgvector`` (exact, in PostgreSQL) or ``exact`` "
        "(in the process); null for a text search.",
    )


class MemorySearchTool:
    """Search a namespace of memory by text and meaning (the answer is journaled)."""

    name: ClassVar[str] = "memory.search"
    Args: ClassVar[type[ToolArgs]] = MemorySearchArgs
    Output: ClassVar[type[ToolOutput]] = MemorySearchOutput
    durable: ClassVar[bool] = True

    def run(self, args: MemorySearchArgs, ctx: ToolContext) -> dict[str, Any]:
        """Search (in the thread pool)."""
        store = memory_of(ctx)
        return memory_call(lambda: store.search(args.namespace, args.query, args.k, mode=args.mode))


# -- memory.link ------------------------------------------------------------------------


class MemoryLinkArgs(ToolArgs):
    """Arguments of ``memory.link``."""

    subject: MemoryRef = Field(description="The item the link goes from.")
    relation: str = Field(
        pattern=RELATION_PATTERN,
        description="What the link says (``knows``, ``cites``): as a namespace, at most 64 "
        "characters.",
    )
    object: MemoryRef = Field(description="The item the link goes to.")
    props: dict[str, Any] | None = Field(default=None, description="The link's own JSON fields.")


class MemoryLinkOutput(ToolOutput):
    """What ``memory.link`` returns (journaled: ``tiffany db rebuild`` re-applies it)."""

    write: Literal["link"]
    subject: MemoryRefOut
    relation: str
    object: MemoryRefOut
    props: dict[str, Any] | None = Field(description="The link's fields.")
    created: bool = Field(description="False when the link existed already (its props replaced).")
    op: str = Field(description="The write's exactly-once key (``RUN/STEP/CALL``).")
    store_seq: int = Field(description="The store's sequence number of this write.")
    at: str = Field(description="When it was written (ISO-8601 UTC).")


class MemoryLinkTool:
    """Link two items of memory (subject, relation, object: the graph)."""

    name: ClassVar[str] = "memory.link"
    Args: ClassVar[type[ToolArgs]] = MemoryLinkArgs
    Output: ClassVar[type[ToolOutput]] = MemoryLinkOutput
    durable: ClassVar[bool] = True

    def run(self, args: MemoryLinkArgs, ctx: ToolContext) -> dict[str, Any]:
        """Link (in the thread pool)."""
        store = memory_of(ctx)
        s, o = args.subject, args.object
        return memory_call(
            lambda: store.link(
                (s.namespace, s.key),
                args.relation,
                (o.namespace, o.key),
                op=write_op(ctx),
                props=args.props,
            )
        )


# -- memory.neighbors -------------------------------------------------------------------


class MemoryNeighborsArgs(ToolArgs):
    """Arguments of ``memory.neighbors``."""

    namespace: str = Field(pattern=NAMESPACE_PATTERN, description="The item's namespace.")
    key: str = Field(min_length=1, max_length=MAX_KEY_CHARS, description="The item's key.")
    relation: str | None = Field(
        default=None, pattern=RELATION_PATTERN, description="Follow only links of this relation."
    )
    depth: int = Field(default=1, ge=1, le=MAX_DEPTH, description="How many links away (1..3).")
    limit: int = Field(default=50, ge=1, le=MAX_NEIGHBORS, description="Most neighbours returned.")


class Neighbor(ToolOutput):
    """An item reached along links."""

    namespace: str
    key: str
    relation: str = Field(description="The relation of the link that reached it.")
    direction: Literal["out", "in"] = Field(description="``out``: the item links to it.")
    depth: int = Field(description="Links away from the item.")
    value: Any = Field(description="Its value (None if the item is gone).")


class MemoryNeighborsOutput(ToolOutput):
    """What ``memory.neighbors`` returns (journaled: a replay reads what the run read)."""

    items: list[Neighbor]
    as_of: int | None = Field(
        description="The store's sequence number: every write up to it is in the answer."
    )


class MemoryNeighborsTool:
    """The items linked to an item, up to three links away (the answer is journaled)."""

    name: ClassVar[str] = "memory.neighbors"
    Args: ClassVar[type[ToolArgs]] = MemoryNeighborsArgs
    Output: ClassVar[type[ToolOutput]] = MemoryNeighborsOutput
    durable: ClassVar[bool] = True

    def run(self, args: MemoryNeighborsArgs, ctx: ToolContext) -> dict[str, Any]:
        """Walk the links (in the thread pool)."""
        store = memory_of(ctx)
        as_of = memory_call(lambda: _seq(store))
        answer = memory_call(
            lambda: store.neighbors(
                args.namespace, args.key, relation=args.relation, depth=args.depth, limit=args.limit
            )
        )
        return {**answer, "as_of": as_of}


# -- memory.delete ----------------------------------------------------------------------


class MemoryDeleteArgs(ToolArgs):
    """Arguments of ``memory.delete``."""

    namespace: str = Field(pattern=NAMESPACE_PATTERN, description="The item's namespace.")
    key: str = Field(min_length=1, max_length=MAX_KEY_CHARS, description="The item's key.")


class MemoryDeleteOutput(ToolOutput):
    """What ``memory.delete`` returns (journaled: ``tiffany db rebuild`` re-applies it)."""

    write: Literal["delete"]
    namespace: str
    key: str
    deleted: bool = Field(description="False when there was no such item.")
    version: int | None = Field(description="The version the delete made (None: nothing deleted).")
    op: str = Field(description="The write's exactly-once key (``RUN/STEP/CALL``).")
    store_seq: int = Field(description="The store's sequence number of this write.")
    at: str = Field(description="When it was written (ISO-8601 UTC).")


class MemoryDeleteTool:
    """Delete an item of memory (exactly once per step)."""

    name: ClassVar[str] = "memory.delete"
    Args: ClassVar[type[ToolArgs]] = MemoryDeleteArgs
    Output: ClassVar[type[ToolOutput]] = MemoryDeleteOutput
    durable: ClassVar[bool] = True

    def run(self, args: MemoryDeleteArgs, ctx: ToolContext) -> dict[str, Any]:
        """Delete (in the thread pool)."""
        store = memory_of(ctx)
        return memory_call(lambda: store.delete(args.namespace, args.key, op=write_op(ctx)))


#: The memory tools, in the order listings show them.
MEMORY_TOOLS: tuple[type, ...] = (
    MemoryPutTool,
    MemoryGetTool,
    MemorySearchTool,
    MemoryLinkTool,
    MemoryNeighborsTool,
    MemoryDeleteTool,
)
#: The tools whose journaled results are writes (``tiffany db rebuild`` re-applies them).
WRITE_TOOLS: frozenset[str] = frozenset({"memory.put", "memory.link", "memory.delete"})
