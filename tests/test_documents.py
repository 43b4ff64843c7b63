"""``tiffany/wire/documents.py``: YAML merge keys, chained, judged by their size and real depth."""

from __future__ import annotations

from typing import Any

import pytest

from tiffany.wire.documents import DEFAULT_LIMITS, DocumentError, Limits, load_text


def _depth(value: Any) -> int:
    """Levels of lists and mappings in ``value`` (the root is 1; a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _chain(n: int, *, as_list: bool = False) -> str:
    """``a1`` merges ``a0``, ``a2`` merges ``a1``... (``<<: *a`` or ``<<: [*a]``)."""
    lines = ["a0: &a0 {x0: 0}"]
    for i in range(1, n):
        merged = f"[*a{i - 1}]" if as_list else f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} {{<<: {merged}, x{i}: {i}}}")
    return "\n".join(lines)


@pytest.mark.parametrize("as_list", [False, True])
def test_a_chain_of_merge_keys_is_as_deep_as_what_it_builds(as_list: bool) -> None:
    """Each link was counted a level deeper: 64 links were refused as nesting."""
    text = _chain(200, as_list=as_list)
    value = load_text(text, True)
    assert value["a199"] == {f"x{i}": i for i in range(200)}
    assert _depth(value) == 2


def test_a_chain_of_merge_keys_is_judged_by_its_expanded_size() -> None:
    text = _chain(200)
    with pytest.raises(DocumentError) as refused:
        load_text(text, True, Limits(max_nodes=2_000))
    assert "values in the document (aliases and merges counted expanded)" in refused.value.msg
    assert refused.value.loc[-1] == "<<"  # the merge key, named as written


def test_an_error_under_a_merge_key_names_it_not_an_object() -> None:
    """The path said ``<object object at 0x...>`` for the ``<<`` key."""
    deep = "a: &a " + "{k: " * 70 + "1" + "}" * 70 + "\nb: {<<: *a}"
    with pytest.raises(DocumentError) as refused:
        load_text(deep, True)
    assert "object at" not in str(refused.value.loc)
    assert "nested deeper than 64" in refused.value.msg
    assert refused.value.loc[:1] == ["a"]
    with pytest.raises(DocumentError) as unknown:
        load_text("b: {<<: *nowhere}", True)
    assert unknown.value.loc == ["b", "<<"]


@pytest.mark.parametrize("merge", ["*a", "[*a]", "[*a, *a]"])
def test_depth_through_merges_is_the_depth_of_the_value_built(merge: str) -> None:
    """At the limit it loads, one level past it is refused, merged or not."""
    for inner in (1, 5, 20):
        for outer in (0, 3, 10):
            anchored = "{k: " * inner + "1" + "}" * inner
            text = f"a: &a {anchored}\nb: " + "{o: " * outer + f"{{<<: {merge}}}" + "}" * outer
            built = load_text(text, True, Limits(max_depth=1_000))
            depth = _depth(built)
            assert load_text(text, True, Limits(max_depth=depth)) == built
            with pytest.raises(DocumentError, match="nested deeper"):
                load_text(text, True, Limits(max_depth=depth - 1))


def test_the_defaults_still_refuse_a_merge_bomb() -> None:
    lines = ["a0: &a0 {x: 1}"]
    for i in range(1, 12):
        merges = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} {{<<: [{merges}], y{i}: [*a{i - 1}, *a{i - 1}]}}")
    with pytest.raises(DocumentError, match="counted expanded"):
        load_text("\n".join(lines), True, DEFAULT_LIMITS)
