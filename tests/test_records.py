"""The journal's records: one typed definition, the same bytes as the positional lists before."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tiffany.durable.records import ReplayedError, pack_error, unpack_error
from tiffany.wire.records import (
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
    Unknown,
    Wake,
    as_list,
    carried,
    decode,
    decode_record,
    encode,
    legacy_role,
    root_role,
    run_of,
)
from tiffany.wire.values import Unencodable, pack_value

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
