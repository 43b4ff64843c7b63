"""``tiffany memory ls|get|search|rm``: the agents' memory, read and deleted.

On this data dir they open the store's memory (``tiffany/memory``, on the
database of the settings: ``<data dir>/tiffany.db`` or PostgreSQL) directly,
so they work with or without a running server. With ``--url``
(``TIFFANY_URL``) they go through the Python SDK to that server's
``/api/memory`` instead, as the other remote commands do
(``tiffany/cli/remote.py``): the same output, the same exit codes.

Output: rich tables, or with ``--json`` the API's answer as JSON (one
document). Exit codes (``tiffany/cli/exits.py``): 2 a bad namespace, key,
query or ``-k`` (the message names it), 3 no such item, 5 the server at
``--url`` cannot be reached.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from tiffany.cli import DataDirOption, exits
from tiffany.cli.remote import TokenOption, UrlOption, printable, remote

if TYPE_CHECKING:
    from tiffany.memory import MemoryStore

__all__ = ["register"]

memory_app = typer.Typer(
    help="The agents' memory: namespaces, items, search, and deletion.",
    no_args_is_help=True,
)

#: Characters of a value shown in a table's cell (``get`` shows it whole).
PREVIEW_CHARS: Final = 80
#: Items ``ls NS`` lists unless asked.
DEFAULT_LIMIT: Final = 50

JsonOption = Annotated[bool, typer.Option("--json", help="The answer as JSON.")]


@contextlib.contextmanager
def _local(ctx: typer.Context) -> Iterator[MemoryStore]:
    """The data dir's memory store (its tables made first, as ``schedule`` makes its own).

    A refusal of the store is one line and its exit code.
    """
    from tiffany.cli import _settings
    from tiffany.errors import TiffanyError
    from tiffany.memory import MemoryStore, embedder_from_settings
    from tiffany.store.migrate import upgrade_url

    settings = _settings(ctx)
    upgrade_url(settings.database_url)
    store = MemoryStore.open(
        settings.database_url,
        embedder=embedder_from_settings(settings),
        max_items=settings.memory_max_items,
    )
    try:
        yield store
    except TiffanyError as exc:
        code = exits.for_memory(exc)
        if code is None:
            raise
        typer.echo(f"tiffany: {printable(_where(exc))}{printable(exc.message)}", err=True)
        raise typer.Exit(code) from None
    finally:
        store.close()


def _where(exc: Any) -> str:
    """``NAME: `` for a refusal naming a field the command's arguments filled."""
    field = getattr(exc, "field", None)
    names = {"namespace": "NS", "key": "KEY", "query": "QUERY", "q": "QUERY", "k": "-k"}
    name = names.get(field) if isinstance(field, str) else None
    return f"{name}: " if name and not str(exc.message).startswith(f"{field}") else ""


def _not_found(namespace: str, key: str) -> typer.Exit:
    typer.echo(f"tiffany: no item {printable(key)!r} in namespace {namespace!r}", err=True)
    return typer.Exit(exits.NOT_FOUND)


def _preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = printable(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cell(value: Any) -> Any:
    """A table cell of user data: plain text (no rich markup read in it), control chars shown."""
    from rich.text import Text

    return Text(printable("" if value is None else value))


def _console() -> Any:
    from rich.console import Console

    return Console()


def _dump(doc: Any) -> None:
    typer.echo(json.dumps(doc, indent=2, ensure_ascii=False))


@memory_app.command("ls")
def ls(
    ctx: typer.Context,
    namespace: Annotated[
        str | None, typer.Argument(metavar="[NS]", help="List this namespace's items.")
    ] = None,
    after: Annotated[
        str | None, typer.Option("--after", metavar="KEY", help="Items after this key (paging).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = DEFAULT_LIMIT,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """List the namespaces (items, bytes, last change), or a namespace's items by key.

    A namespace's items come a page at a time (``--limit``); the next page's
    ``--after KEY`` is said on stderr.
    """
    doc: dict[str, Any]
    if url:
        with remote(url, token, ctx) as client:
            if namespace is None:
                doc = client.memory_namespaces().model_dump(mode="json")
            else:
                page = client.memory_items(namespace, after=after, limit=limit)
                doc = page.model_dump(mode="json")
    else:
        with _local(ctx) as store:
            if namespace is None:
                doc = {"namespaces": store.namespaces()}
            else:
                doc = store.items(namespace, after=after, limit=limit)
    if as_json:
        _dump(doc)
        return
    from rich.table import Table

    if namespace is None and not doc["namespaces"]:
        typer.echo("(no memory yet)", err=True)
        return
    if namespace is not None and not doc["items"]:
        typer.echo(f"(nothing in {printable(namespace)})", err=True)
        return
    if namespace is None:
        table = Table(title="memory namespaces", title_justify="left")
        for column in ("namespace", "items", "bytes", "updated"):
            table.add_column(column, justify="right" if column in ("items", "bytes") else "left")
        for row in doc["namespaces"]:
            table.add_row(
                _cell(row["namespace"]),
                str(row["items"]),
                str(row.get("bytes", "")),
                _cell(row.get("updated_at") or "-"),
            )
        _console().print(table)
        return
    table = Table(title=f"memory {printable(namespace)}", title_justify="left")
    for column in ("key", "version", "updated", "run", "value"):
        table.add_column(column, overflow="fold" if column == "value" else "ellipsis")
    for item in doc["items"]:
        table.add_row(
            _cell(item["key"]),
            str(item.get("version", "")),
            _cell(item.get("updated_at") or "-"),
            _cell(_run_of(item)),
            _cell(_preview(item.get("value"))),
        )
    _console().print(table)
    if doc.get("next"):
        typer.echo(f"more: --after {printable(json.dumps(doc['next']))}", err=True)


def _run_of(item: dict[str, Any]) -> str:
    run, step = item.get("run_id"), item.get("step_id")
    return f"{run}/{step}" if run and step else run or "-"


@memory_app.command("get")
def get(
    ctx: typer.Context,
    namespace: Annotated[str, typer.Argument(metavar="NS")],
    key: Annotated[str, typer.Argument(metavar="KEY")],
    depth: Annotated[int, typer.Option("--depth", min=1, max=3, help="Neighbours this far.")] = 1,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Show an item: its value, its versions, its links and its neighbours."""
    doc: dict[str, Any] | None
    if url:
        with remote(url, token, ctx) as client:
            doc = client.memory_get(namespace, key, depth=depth).model_dump(mode="json")
    else:
        from tiffany.api.memory import item_detail

        with _local(ctx) as store:
            doc = item_detail(store, namespace, key, depth)
    if doc is None:
        raise _not_found(namespace, key)
    if as_json:
        _dump(doc)
        return
    from rich.table import Table

    console = _console()
    console.print(
        _cell(f"{doc['namespace']} / {doc['key']}  version {doc.get('version')}"), style="bold"
    )
    meta = [
        ("written by", _run_of(doc)),
        ("created", doc.get("created_at") or "-"),
        ("updated", doc.get("updated_at") or "-"),
    ]
    if doc.get("expires_at"):
        meta.append(("expires", doc["expires_at"]))
    for label, value in meta:
        console.print(_cell(f"{label:>11}: {value}"))
    console.print(_cell(json.dumps(doc.get("value"), indent=2, ensure_ascii=False)))
    history = Table(title="versions", title_justify="left")
    for column in ("version", "at", "op", "written by", "value"):
        history.add_column(column, overflow="fold" if column == "value" else "ellipsis")
    for v in doc.get("history", []):
        history.add_row(
            str(v.get("version")),
            _cell(v.get("at") or "-"),
            _cell(v.get("op") or "-"),
            _cell(_run_of(v)),
            _cell("(deleted)" if v.get("deleted") else _preview(v.get("value"))),
        )
    console.print(history)
    near = doc.get("neighbors", [])
    if near:
        table = Table(title="neighbours", title_justify="left")
        for column in ("relation", "item", "depth", "value"):
            table.add_column(column, overflow="fold" if column == "value" else "ellipsis")
        for n in near:
            arrow = f"{n['relation']} →" if n.get("direction") == "out" else f"← {n['relation']}"
            table.add_row(
                _cell(arrow),
                _cell(f"{n['namespace']} / {n['key']}"),
                str(n.get("depth", 1)),
                _cell(_preview(n.get("value"))),
            )
        console.print(table)
    else:
        console.print("no links")


@memory_app.command("search")
def search(
    ctx: typer.Context,
    namespace: Annotated[str, typer.Argument(metavar="NS")],
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to look for.")],
    k: Annotated[
        int, typer.Option("-k", "--k", min=1, max=100, help="How many hits at most (1..100).")
    ] = 10,
    mode: Annotated[
        str, typer.Option("--mode", help="hybrid (full-text and vectors), text or vector.")
    ] = "hybrid",
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Search a namespace: the ``-k`` best hits, best first, with their scores."""
    if mode not in ("hybrid", "text", "vector"):
        typer.echo(f"tiffany: --mode: {mode!r} is not hybrid, text or vector", err=True)
        raise typer.Exit(exits.USAGE)
    doc: dict[str, Any]
    if url:
        with remote(url, token, ctx) as client:
            doc = client.memory_search(namespace, query, k, mode=mode).model_dump(mode="json")
    else:
        with _local(ctx) as store:
            doc = store.search(namespace, query, k, mode=mode)
    if as_json:
        _dump(doc)
        return
    from rich.table import Table

    embedder = doc.get("embedder") or {}
    title = f"{len(doc['items'])} hits in {printable(namespace)} ({doc.get('mode')}"
    if embedder:
        title += f"; vectors: {printable(embedder.get('id'))}, {printable(embedder.get('kind'))}"
    table = Table(title=title + ")", title_justify="left")
    for column in ("#", "score", "key", "value"):
        table.add_column(column, overflow="fold" if column == "value" else "ellipsis")
    for rank, hit in enumerate(doc["items"], 1):
        table.add_row(
            str(rank), f"{hit['score']:.4f}", _cell(hit["key"]), _cell(_preview(hit.get("value")))
        )
    _console().print(table)


@memory_app.command("rm")
def rm(
    ctx: typer.Context,
    namespace: Annotated[str, typer.Argument(metavar="NS")],
    key: Annotated[str, typer.Argument(metavar="KEY")],
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Delete an item (its versions stay in its history); exit 3 if there is none."""
    done: dict[str, Any]
    if url:
        with remote(url, token, ctx) as client:
            done = client.memory_delete(namespace, key).model_dump(mode="json")
    else:
        with _local(ctx) as store:
            done = store.delete(namespace, key, op=f"cli:{uuid.uuid4()}")
        if not done.get("deleted"):
            raise _not_found(namespace, key)
    if as_json:
        _dump(done)
        return
    typer.echo(f"{printable(namespace)} / {printable(key)}: deleted")


def register(app: typer.Typer) -> None:
    """Add ``memory`` to the root app."""
    app.add_typer(memory_app, name="memory")
