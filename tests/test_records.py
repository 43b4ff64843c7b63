"""The journal's records: one typed definition, the same bytes as the positional lists before."""

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
import pytest

from tiffany.durable.records import ReplayedError, pack_error, unpack_error
from tiffany.records import (
    TYPES,
    Dispatch,
    Hold,
    Outcome,
    RecordType,
    RunEnd,
    RunStart,
    Spawn,
    StepStart,
    TaskExit,
    TaskLabel,
    Undecodable,
    Unencodable,
    Unknown,
    Wake,
    as_list,
    canonical,
    carried,
    decode,
    decode_record,
    encode,
    legacy_canonical,
    legacy_role,
    pack_value,
    root_role,
    run_of,
    unpack_value,
)

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
PREFIX = (7).to_bytes(4, "little")


@pytest.mark.parametrize(
    "value",
    [
        None,
        1,
        -(2**40),
        1.5,
        "text",
        b"\x00\xff",
        [1, [2, 3]],
        (1, (2, "x")),
        {"a": (1, 2), "b": [b"x"]},
        {1, 2, 3},
        frozenset({"a"}),
        [],
        (),
    ],
)
def test_values_round_trip_exactly(value):
    payload = encode(PREFIX, TaskExit(1, 2, "done", pack_value(value)))
    assert run_of(payload) == 7
    rec = decode(RecordType.TASK_EXIT, payload)
    assert rec.value == value
    assert type(rec.value) is type(value)


def test_unencodable_values_keep_their_repr():
    class Thing:
        def __repr__(self):
            return "<thing>"

    rec = decode(RecordType.OUTCOME, encode(PREFIX, Outcome(1, 1, "x", pack_value(Thing()))))
    assert rec.value == Unencodable("<thing>")


def test_run_of_reads_the_prefix_only():
    payload = encode((123456).to_bytes(4, "little"), RunEnd("x" * 100, None, 1.0))
    assert run_of(payload) == 123456
    assert run_of(payload[:4]) == 123456


def test_errors_are_rebuilt_with_type_and_args():
    err = unpack_error(pack_error(KeyError("k")))
    assert isinstance(err, KeyError)
    assert err.args == ("k",)


def test_unknown_error_types_become_replayed_errors():
    err = unpack_error(["no.such.module:Nope", ["x"], "Nope('x')"])
    assert isinstance(err, ReplayedError)
    assert "Nope('x')" in str(err)


def test_record_types_reserve_zero_and_the_never_written_cancel():
    assert min(RecordType) == 1
    assert 9 not in {t.value for t in RecordType}
    assert set(TYPES) == set(RecordType)


#: One record of each type, as the journal writes it, and the positional list
#: the code before typed records encoded for the same record.
SAMPLES = [
    (RunStart("r-1", "plan", {"kind": "plan"}, 1.5, 1), ["r-1", "plan", {"kind": "plan"}, 1.5, 1]),
    (Spawn(3, 2, 1, "worker:a", "worker", "a", None), [3, 2, 1, "worker:a", "worker", "a", None]),
    (Dispatch(4, 2, "sleep", 0.5), [4, 2, "sleep", 0.5]),
    (Dispatch(5, 2, "yield", None), [5, 2, "yield", None]),
    (Outcome(6, 2, "now", 12.25), [6, 2, "now", 12.25]),
    (StepStart(7, 2, 1, "file.write", 2), [7, 2, 1, "file.write", 2]),
    (Wake(7, 2, "step", True, pack_value((1, {2}))), [7, 2, "step", True, pack_value((1, {2}))]),
    (
        TaskExit(8, 2, "crashed", pack_error(KeyError("k"))),
        [8, 2, "crashed", pack_error(KeyError("k"))],
    ),
    (RunEnd("succeeded", {"outputs": [1]}, 9.0), ["succeeded", {"outputs": [1]}, 9.0]),
    (Hold(9, 2, 1, "shell", "disabled"), [9, 2, 1, "shell", "disabled"]),
]


def test_every_type_encodes_to_the_bytes_of_its_positional_list():
    seen = set()
    for rec, fields in SAMPLES:
        assert encode(PREFIX, rec) == PREFIX + msgspec.msgpack.encode(fields), rec
        assert decode(rec.rtype, encode(PREFIX, rec)) == decode(
            rec.rtype, PREFIX + msgspec.msgpack.encode(fields)
        )
        seen.add(rec.rtype)
    assert seen == set(RecordType)


def test_records_written_before_the_new_fields_decode_with_their_defaults():
    old_start = PREFIX + msgspec.msgpack.encode(["r-1", "n", {}, 1.0])
    assert decode(RecordType.RUN_START, old_start) == RunStart("r-1", "n", {}, 1.0, 1)
    old_spawn = PREFIX + msgspec.msgpack.encode([3, 4, 2, "tool:http:fetch"])
    assert decode(RecordType.SPAWN, old_spawn) == Spawn(
        3, 4, 2, "tool:http:fetch", "tool", "fetch", "http"
    )
    old_root = PREFIX + msgspec.msgpack.encode([0, 1, 0, "my-plan"])
    assert decode(RecordType.SPAWN, old_root).role is None  # the run's entry says (root_role)


def test_the_name_is_read_for_a_role_only_for_old_records():
    new = PREFIX + msgspec.msgpack.encode([3, 4, 2, "worker:x", "task", None, None])
    assert decode(RecordType.SPAWN, new) == Spawn(3, 4, 2, "worker:x", "task", None, None)
    assert legacy_role("worker:fetch") == TaskLabel("worker", "fetch")
    assert legacy_role("tool:file.read:b") == TaskLabel("tool", "b", "file.read")
    assert legacy_role("step:mod:fn") == TaskLabel("step")
    assert legacy_role("worker-1") == TaskLabel("task")
    assert root_role({"kind": "plan", "plan": {}}) == "planner"
    assert root_role({"kind": "callable"}) == "task"


def test_a_bad_payload_is_undecodable_not_an_exception():
    run_no, rec = decode_record(RecordType.SPAWN, PREFIX + msgspec.msgpack.encode([1, 2]))
    assert run_no == 7
    assert isinstance(rec, Undecodable)
    assert "length" in str(rec.error)
    _, rec = decode_record(RecordType.DISPATCH, PREFIX + b"\xc1")
    assert isinstance(rec, Undecodable)
    _, rec = decode_record(42, PREFIX + msgspec.msgpack.encode(["x", 1]))
    assert rec == Unknown(42, ["x", 1])


def test_carried_records_stand_for_the_dispatch_they_imply():
    long = "n" * 300
    assert carried(Spawn(5, 3, 1, long, "task"), 4) == Dispatch(5, 1, "new_task", long[:120])
    assert carried(Outcome(5, 3, "now", 1.0), 4) == Dispatch(5, 3, "now", None)
    assert carried(StepStart(5, 3, 1, long, 1), 4) == Dispatch(5, 3, "step", long[:120])
    assert carried(TaskExit(5, 3, "done", None), 4) == Dispatch(5, 3, "return", None)
    for rec in (
        Spawn(0, 1, 0, "root", "task"),
        Outcome(4, 3, "sleep", 9.0),
        TaskExit(4, 3, "done", 1),
    ):
        assert carried(rec, 4) is None
    assert carried(Dispatch(5, 3, "yield", None), 4) is None
    assert carried(Hold(5, 3, 1, "x", "y"), 4) is None


def test_every_golden_record_decodes_to_its_positional_fields():
    from tiffany.wal import iter_records

    values = msgspec.msgpack.Decoder(ext_hook=lambda code, data: (code, bytes(data)))
    wals = sorted(GOLDEN.glob("*/wal"))
    assert len(wals) >= 5
    count = 0
    for wal in wals:
        for r in iter_records(wal):
            old = values.decode(bytes(r.payload)[4:])
            rec = decode(r.rtype, r.payload)
            fields = as_list(rec)
            assert len(fields) >= len(old)
            assert len(fields) == len(old) or r.rtype in (RecordType.SPAWN, RecordType.RUN_START)
            raw = msgspec.msgpack.Decoder(
                type(rec), ext_hook=lambda code, data: (code, bytes(data))
            )
            assert as_list(raw.decode(bytes(r.payload)[4:]))[: len(old)] == old
            count += 1
    assert count > 100


def test_the_format_doc_lists_every_record_type_with_its_fields():
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "wal-format.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \| (\d+) \| ([a-z_?, ]+) \|$", doc, re.MULTILINE)
    table = {
        int(byte): (name, [f.strip() for f in fields.split(",")]) for name, byte, fields in rows
    }
    expected = {}
    for rtype, cls in TYPES.items():
        defaults = len(cls.__struct_defaults__)
        fields = list(cls.__struct_fields__)
        marked = fields[: len(fields) - defaults] + [
            f"{f}?" for f in fields[len(fields) - defaults :]
        ]
        expected[int(rtype)] = (RecordType(rtype).name, marked)
    assert table == expected


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
        f"from test_records import {values}\n"
        "from tiffany.records import canonical\n"
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
