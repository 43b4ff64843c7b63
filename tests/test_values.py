"""Values from outside a run as the journal packs them (``tiffany/wire/values.py``).

What a replay compares (``durable/dispatch.py``: ``same``) is the journaled
form of a value, so the packing must give the same bytes in every process
and for what a replay rebuilds from the journal: stand-ins packed in place,
sets sorted (inside dataclasses and Structs too), and the bytes earlier
versions wrote still recognised.
"""

from __future__ import annotations

import collections
import enum
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from tiffany.wire.records import Outcome, RecordType, RunEnd, TaskExit, decode, encode
from tiffany.wire.values import Unencodable, canonical, legacy_canonical, pack_value, unpack_value

PREFIX = (7).to_bytes(4, "little")


@dataclass
class _Box:
    value: Any


def test_a_value_rebuilt_around_a_stand_in_packs_as_the_original():
    """What a replay compares: the journaled form of what it rebuilt from the journal."""
    from tiffany.durable.dispatch import same

    thing = object()
    for live in ({"x": thing, "n": 1}, [1, thing], thing, _Box({"x": thing, "t": (1, 2)})):
        rec = decode(RecordType.OUTCOME, encode(PREFIX, Outcome(1, 1, "x", pack_value(live))))
        rebuilt = unpack_value(rec.value)
        assert same(rec.value, live), live
        assert same(rec.value, rebuilt), live  # the replay's value holds the stand-in
        assert same(rec.value, _Box(rebuilt)) is False
    # A whole dataclass kept as one repr (journals written before stand-ins in place).
    whole = Unencodable(repr(_Box({"x": thing})))
    assert same(whole, _Box({"x": Unencodable(repr(thing))}))


# -- sets inside objects ------------------------------------------------------


@dataclass
class _Pair:
    value: Any
    extra: Any = None


class _Tagged(msgspec.Struct, rename="camel", tag="Tagged"):
    some_field: Any
    other: Any = 0


class _Row(msgspec.Struct, array_like=True):
    a: Any
    b: Any


class _Color(enum.Enum):
    RED = "red"


_Named = collections.namedtuple("_Named", "left right")


def _values_with_sets() -> dict[str, Any]:
    """Sets where ``msgspec.to_builtins`` packs them: inside dataclasses and Structs."""
    return {
        "words": _Pair({f"w{i}" for i in range(20)}),
        "in_dict": _Pair({"k": frozenset({("a", 1), ("b", 2), ("c", 3)})}),
        "struct": _Tagged({f"s{i}" for i in range(9)}, other=[{"x", "y", "z"}]),
        "array_like": _Row({b"a", b"b", b"c"}, _Named({"p", "q", "r"}, 1)),
        "nested": _Pair(frozenset({frozenset({"a", "b"}), frozenset({"c"}), frozenset({"d"})})),
    }


def _packed_under(seed: int, values: str = "_values_with_sets") -> list[str]:
    code = (
        f"from test_values import {values}\n"
        "from tiffany.wire.values import canonical\n"
        f"for v in {values}().values(): print(canonical(v).hex())\n"
    )
    tests = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": tests}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return proc.stdout.split()


def test_sets_inside_objects_pack_the_same_under_every_hash_seed():
    """``to_builtins`` listed them in hash order: a replay in another process diverged."""
    packed = {seed: _packed_under(seed) for seed in (1, 2, 3)}
    assert packed[1] == packed[2] == packed[3]
    assert len(packed[1]) == len(_values_with_sets())
    words, in_dict, struct, array_like, nested = (
        msgspec.msgpack.decode(bytes.fromhex(h)) for h in packed[1]
    )
    assert words["value"] == sorted((f"w{i}" for i in range(20)), key=repr)
    assert in_dict["value"] == {"k": [["a", 1], ["b", 2], ["c", 3]]}
    assert struct == {
        "type": "Tagged",
        "someField": [f"s{i}" for i in range(9)],
        "other": [["x", "y", "z"]],
    }
    assert array_like == [["YQ==", "Yg==", "Yw=="], [["p", "q", "r"], 1]]  # bytes: base64
    assert nested["value"] == [["a", "b"], ["c"], ["d"]]


def _values_without_sets() -> dict[str, Any]:
    return {
        "tuples": _Pair((1, (2, "x")), ("a",)),
        "dict_order": _Pair({"zeta": 1, "alpha": (2, 3), "mid": {"b": 1, "a": 2}}),
        "nested": _Pair(_Pair([{"k": (1, 2)}, None, b"\x00"]), {3: "three", 1: "one"}),
        "struct": _Tagged({"y": 1, "x": (1,)}, other=[(2,)]),
        "array_like": _Row((1, 2), {"b": 1, "a": 0}),
        "namedtuple": _Pair(_Named((1,), {"q": 1, "p": 2})),
        "enum": _Pair(_Color.RED, 1.5),
        "in_dict": {"outer": _Pair({"z": (), "a": []})},
    }


#: What main (at 80e0682, before sets inside objects were sorted) packed them as.
_PACKED_BEFORE = {
    "tuples": "82a576616c756592019202a178a5657874726191a161",
    "dict_order": "82a576616c756583a47a65746101a5616c706861920203a36d696482a16201a16102a5657874"
    "7261c0",
    "nested": "82a576616c756582a576616c75659381a16b920102c0a441413d3da56578747261c0a5657874"
    "72618203a5746872656501a36f6e65",
    "struct": "83a474797065a6546167676564a9736f6d654669656c6482a17901a1789101a56f74686572919102",
    "array_like": "9292010282a16201a16100",
    "namedtuple": "82a576616c756592910182a17101a17002a56578747261c0",
    "enum": "82a576616c7565a3726564a56578747261cb3ff8000000000000",
    "in_dict": "81a56f7574657282a576616c756582a17a90a16190a56578747261c0",
}


def test_tuples_and_dicts_inside_objects_pack_as_they_always_did():
    """Journals hold a dataclass's tuples as lists and its dicts in insertion order."""
    for name, value in _values_without_sets().items():
        assert canonical(value).hex() == _PACKED_BEFORE[name], name
        assert legacy_canonical(value) == canonical(value), name


def test_a_set_of_numbers_journaled_unsorted_by_earlier_versions_still_replays():
    """Numbers' hashes are not seeded: such a journal verified, and still does."""
    from tiffany.durable.dispatch import same

    journaled = bytes.fromhex("82a576616c75659c000102030405060708090a0ba56578747261c0")  # main's
    recorded = decode(
        RecordType.TASK_EXIT,
        encode(PREFIX, TaskExit(1, 2, "done", msgspec.msgpack.decode(journaled))),
    ).value
    assert recorded == {"value": list(range(12)), "extra": None}
    live = _Pair(set(range(12)))
    assert canonical(live) != journaled  # sorted now: 0, 1, 10, 11, 2, ...
    assert same(recorded, live)
    assert not same(recorded, _Pair(set(range(13))))
    assert not same(recorded, _Pair(list(range(12))[::-1]))


def _sets_of_extensions() -> dict[str, Any]:
    """Sets whose items pack as extensions (tuples, sets), alone or in a dict."""
    return {
        "pairs": {(f"w{i}", i) for i in range(8)},
        "sets": frozenset({frozenset({"a", "b"}), frozenset({"c"}), frozenset({"d"})}),
        "mixed": {"outputs": {("a",), frozenset({"b"}), "c", 1, (2, ("x", "y"))}},
    }


def test_a_set_of_tuples_or_sets_packs_the_same_in_every_process():
    """They were sorted by the repr of their packed forms, which names an address."""
    packed = {seed: _packed_under(seed, "_sets_of_extensions") for seed in (1, 2, 3)}
    assert packed[1] == packed[2] == packed[3]
    for value in _sets_of_extensions().values():
        rec = decode(RecordType.RUN_END, encode(PREFIX, RunEnd("succeeded", pack_value(value), 1)))
        assert rec.value == value
        assert canonical(rec.value) == canonical(value)  # what a replay compares


def test_a_set_with_one_extension_among_plain_items_packs_as_before():
    """An extension still sorts where its repr did: after numbers, before None and bytes."""
    assert canonical({"a", "b", (1, 2), 3, None, b"x"}).hex() == (
        "d80296a161a16203c70301920102c0c40178"  # main at 80e0682
    )


# -- what data can make encoding raise, and the text the journal keeps instead -------------


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


class _SurrogateRepr:
    def __repr__(self) -> str:
        return "<x\ud800>"


def _cyclic() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


def _deep(n: int = 100_000) -> list[Any]:
    deep: list[Any] = []
    for _ in range(n):
        deep = [deep]
    return deep


#: Values whose packing or encoding raises because of what they hold.
POISONS = {
    "surrogate": "x\ud800y",
    "surrogate_key": {"x\udfff": 1},
    "surrogate_nested": {"a": [{"b": ("x\ud800",)}]},
    "big_int": 2**64,
    "big_negative": -(2**63) - 1,
    "big_key": {2**70: "x"},
    "object_key": {object(): 1},
    "cyclic": _cyclic(),
    "deep": _deep(),
    "bad_repr": {"x": _BadRepr()},
    "surrogate_repr": [_SurrogateRepr()],
}


def test_what_makes_encoding_raise_is_one_of_encode_errors():
    from tiffany.wire.values import ENCODE_ERRORS

    refused = set()
    for name, value in POISONS.items():
        try:  # anything but ENCODE_ERRORS raised here fails the test: a hook raised it
            canonical(value)
        except ENCODE_ERRORS:
            refused.add(name)  # refused as data (a step's result: journal.value)
    # The rest packs: an object with a raising or surrogate repr, as a stand-in in place.
    assert set(POISONS) - refused == {"bad_repr", "surrogate_repr"}


def test_encodable_makes_every_value_encode_with_text_escaped():
    from tiffany.wire.values import encodable, stand_in_text

    for name, value in POISONS.items():
        for leaf, encoder in (
            (None, msgspec.msgpack.Encoder()),
            (stand_in_text, msgspec.json.Encoder()),
        ):
            kept = encodable(value) if leaf is None else encodable(value, leaf)
            data = encoder.encode(kept)  # never raises
            assert b"\xed\xa0" not in data, name  # no surrogate's bytes
    assert encodable({"x\ud800": ["y\udfff", 1]}) == {"x\\ud800": ["y\\udfff", 1]}


def test_journal_text_escapes_only_lone_surrogates():
    from tiffany.wire.values import journal_text, text_of

    assert journal_text("plain") == "plain"
    assert journal_text("héllo ✓ 𝄞") == "héllo ✓ 𝄞"
    assert journal_text("x\ud800y") == "x\\ud800y"
    assert text_of(ValueError("a\udcffb")) == "a\\udcffb"
    assert text_of(_BadRepr()) == "<_BadRepr object: str() raised RuntimeError>"
    assert text_of(7) == "7"


def test_a_stand_in_never_raises_and_always_encodes():
    from tiffany.wire.values import stand_in, stand_in_text

    assert stand_in_text(_BadRepr()) == "<_BadRepr object: repr() raised RuntimeError>"
    assert stand_in_text(_SurrogateRepr()) == "<x\\ud800>"
    assert stand_in_text(_deep(10**6)).endswith("raised RecursionError>")
    packed = pack_value({"a": _BadRepr(), "b": _SurrogateRepr()})
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(packed), ext_hook=_ext_hook())
    assert back == {
        "a": Unencodable("<_BadRepr object: repr() raised RuntimeError>"),
        "b": Unencodable("<x\\ud800>"),
    }
    assert stand_in(_BadRepr()).data == b"<_BadRepr object: repr() raised RuntimeError>"


def _ext_hook() -> Any:
    from tiffany.wire.values import ext_hook

    return ext_hook
