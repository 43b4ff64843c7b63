"""Workflows the memory tests run (importable by name: ``--import memory_flows``)."""

from __future__ import annotations

from typing import Any

from tiffany.kernel import Sleep
from tiffany.workflows import memory, workflow


@workflow("memory-tests.puts")
def puts(n: int = 8, nap_s: float = 0.05) -> Any:
    """``n`` puts in turn, a nap between them (a crash lands between two or inside one)."""
    versions = []
    for i in range(n):
        done = yield memory.put("crash.flow", f"k{i}", {"i": i})
        versions.append(done["version"])
        yield Sleep(nap_s)
    return {"versions": versions}


@workflow("memory-tests.notes")
def notes(user: str = "ann") -> Any:
    """Every memory call from a workflow, reading back what it wrote."""
    ns = f"users.{user}"
    yield memory.put(ns, "city", {"city": "Lyon"}, text="lives in Lyon, France")
    yield memory.put(ns, "food", "likes buckwheat crepes")
    made = yield memory.put(ns, value="a fact filed under a key made for it")
    item = yield memory.get(ns, "city")
    found = yield memory.search(ns, "where does the user live", k=2)
    yield memory.link((ns, "city"), "near", (ns, "food"), props={"km": 0})
    near = yield memory.neighbors(ns, "city")
    gone = yield memory.delete(ns, made["key"])
    return {
        "city": item["item"]["value"]["city"],
        "as_of": item["as_of"],
        "top": found["items"][0]["key"],
        "near": [n["key"] for n in near["items"]],
        "deleted": gone["deleted"],
        "made": made["key"],
    }


@workflow("memory-tests.refused")
def refused() -> Any:
    """A refusal raised at the yield, naming the field; the workflow may catch it."""
    from tiffany.workflows import ToolFailed

    try:
        yield memory.put("ok.ns", "search", 1)  # a reserved key
    except ToolFailed as exc:
        return {"error_code": exc.fields["error_code"], "message": exc.message}
    return {"error_code": None}
