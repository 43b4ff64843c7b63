"""How the store reads journal values: JSON conversion, errors, task kinds."""

from __future__ import annotations

import math

from tiffany.records import Unencodable
from tiffany.store.records import error_dict, jsonable, text


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
