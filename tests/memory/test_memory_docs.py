"""docs/memory.md states the bounds and constants the code has (tiffany/memory/limits.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tiffany.config import Settings
from tiffany.memory import limits
from tiffany.memory.fulltext import COMMON_MATCHES, RANKED_FIRST_PER_RESULT, SCORED_MATCHES
from tiffany.memory.search import PIECE_ROWS, RRF_K, SPLIT_ROWS
from tiffany.memory.tables import metadata

DOC = Path(__file__).resolve().parents[2] / "docs" / "memory.md"


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _bounds() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in _section("Bounds").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            for name in re.findall(r"`(\w+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_the_bounds_table_is_the_code() -> None:
    rows = _bounds()
    assert f"`^{limits.NAMESPACE_RE.pattern}$`" in rows["namespace"]
    assert f"`^{limits.RELATION_RE.pattern}$`" in rows["relation"]
    assert f"1..{limits.KEY_MAX_CHARS} characters" in rows["key"]
    assert all(f"`{k}`" in rows["key"] for k in limits.RESERVED_KEYS)
    assert f"{limits.VALUE_MAX_BYTES} bytes" in rows["value"]
    assert f"{limits.TEXT_MAX_BYTES} bytes" in rows["text"]
    assert f"1..{limits.OP_MAX_CHARS} characters" in rows["op"]
    assert f"1..{limits.ID_MAX_CHARS} characters" in rows["run_id"] == rows["step_id"]
    assert f"(0, {limits.TTL_MAX_S:.0f}]" in rows["ttl_s"]
    assert f"{limits.PROPS_MAX_BYTES} bytes" in rows["props"]
    assert f"at most {limits.QUERY_MAX_CHARS} characters" in rows["query"]
    assert rows["k"] == f"1..{limits.K_MAX}"
    assert rows["depth"] == f"1..{limits.MAX_DEPTH}"
    assert rows["limit"] == f"1..{limits.LIMIT_MAX}"
    assert (
        rows["mode"] == ", ".join(f"`{m}`" for m in limits.MODES[:-1]) + f" or `{limits.MODES[-1]}`"
    )


def test_the_size_limit_and_search_constants_are_the_code() -> None:
    bounds = _section("Bounds")
    default = Settings.model_fields["memory_max_items"].default
    assert default == limits.DEFAULT_MAX_ITEMS
    assert f"`TIFFANY_MEMORY_MAX_ITEMS` ({default} by" in bounds.replace("\n", " ")
    search = " ".join(_section("Search").split())
    assert f"1 / ({RRF_K} + rank)" in search
    assert f"counted up to {COMMON_MATCHES:,}" in search
    assert f"stay under {SCORED_MATCHES:,}" in search
    assert f"the best `{RANKED_FIRST_PER_RESULT}n` matches only" in search
    assert f"From {SPLIT_ROWS:,} rows the product is cut in pieces of {PIECE_ROWS:,} rows" in search


def test_every_table_is_documented() -> None:
    storage = _section("Storage")
    for table in [*metadata.tables, "mem_fts"]:
        assert f"| `{table}` |" in storage, table
