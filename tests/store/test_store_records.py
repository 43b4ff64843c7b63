"""How the store reads journal values: JSON conversion, errors, task kinds."""

from __future__ import annotations

import math

from tiffany.store.records import error_dict, jsonable, text
from tiffany.wire.values import Unencodable


def test_jsonable_turns_journal_values_into_json():
    value = {
        "t": (1, 2),
        "s": {3, 1},
        "b": b"caf\xc3\xa9",
        "nan": math.nan,
        "u": Unencodable("<object at 0x1>"),
        1: [None, True, 1.5],
    }
    assert jsonable(value) == {
        "t": [1, 2],
        "s": [1, 3],
        "b": "café",
        "nan": "nan",
        "u": "<object at 0x1>",
        "1": [None, True, 1.5],
    }


def test_error_dict():
    packed = ["mod:Err", ["bad thing", 3], "Err('bad thing', 3)", {"code": 7, "steps": {}}]
    assert error_dict(packed) == {
        "type": "mod:Err",
        "message": "bad thing",
        "args": ["bad thing", 3],
        "repr": "Err('bad thing', 3)",
        "fields": {"code": 7},
    }
    assert error_dict(["mod:Err", [], "Err()"])["message"] == "Err()"
    assert error_dict("odd") == {"message": "odd", "repr": "odd"}


def test_text_has_no_nul():
    assert text("a\x00b") == "a\\x00b"
    assert text(2.5) == "2.5"


# -- the fast path: a dict or list that is plain JSON comes back as itself --------------


def _walked(value: object) -> object:
    """jsonable by the walk alone (the fast path is taken at depth 0 only)."""
    return [jsonable(v, 1) for v in value] if isinstance(value, list) else None


def _nested(depth: int, leaf: object = 1) -> object:
    value = leaf
    for i in range(depth):
        value = [value, i] if i % 2 else {"k": value, "n": i}
    return value


def test_plain_json_comes_back_as_itself():
    plan = {
        "steps": [{"id": f"s{i}", "args": {"content": f"${{inputs.x}}\n[{i}]"}} for i in range(50)]
    }
    assert jsonable(plan) is plan
    summary = {
        f"s{i}": {"status": "ok", "error": None, "attempts": [{"at": 1.5}]} for i in range(50)
    }
    assert jsonable(summary) is summary


def test_fast_path_refuses_what_the_walk_would_change():
    """Each value holds one thing the walk rewrites, among plain JSON: the result is the walk's."""
    big = 2**63
    cases = {
        "nan": [math.nan, 1],
        "inf in a dict": [{"a": math.inf, "b": None}, 2],
        "int of 64 bits": [big, 1],
        "negative beyond 63 bits": [-big - 1, 1],
        "int of 100 bits": [2**100, 1],
        "NUL in a string": ["a\x00b", 1],
        "NUL in a key": [{"a\x00": 1}, 2],
        "lone surrogate": ["\ud800", 1],
        "tuple": [(1, 2), 3],
        "set": [{1, 2}, 3],
        "bytes": [b"x", 1],
        "int key": [{1: "a", "b": 2}, 3],
        "stand-in": [Unencodable("<x>"), 1],
        "65 deep": [_nested(65), 1],
    }
    for name, value in cases.items():
        out = jsonable(value)
        assert out is not value, name
        assert out == _walked(value), name


def test_fast_path_keeps_what_only_looks_suspicious():
    """19 digits in a string, brackets and escapes in strings, exactly 64 levels: all plain."""
    cases = {
        "digits in a string": ["1234567890123456789012", 1],
        "int just under 2**63": [2**63 - 1, -(2**63)],
        "brackets in strings": ["[[[[", "}}}}", {"k": "]"}],
        "escapes": ['a\\"b', "c\\\\", "\n\t\u0001", {'q"': "\\["}],
        "64 deep": [_nested(63), 1],
    }
    for name, value in cases.items():
        assert jsonable(value) == _walked(value), name
    assert _walked(cases["64 deep"]) == cases["64 deep"]
    assert "<nested deeper" in str(_walked([_nested(64), 1]))


def test_depth_boundary_matches_the_walk():
    for depth in (62, 63, 64, 65, 80):
        value = [_nested(depth), "x"]
        assert jsonable(value) == _walked(value), depth
