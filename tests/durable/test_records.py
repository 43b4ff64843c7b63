from __future__ import annotations

import pytest

from tiffany.durable.records import (
    RecordType,
    ReplayedError,
    Unencodable,
    decode,
    encode,
    pack_error,
    pack_value,
    run_of,
    unpack_error,
)


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
    prefix = (7).to_bytes(4, "little")
    run_no, fields = decode(encode(prefix, [1, pack_value(value)]))
    assert run_no == 7
    assert fields[1] == value
    assert type(fields[1]) is type(value)


def test_unencodable_values_keep_their_repr():
    class Thing:
        def __repr__(self):
            return "<thing>"

    _, fields = decode(encode(b"\0\0\0\0", [pack_value(Thing())]))
    assert fields[0] == Unencodable("<thing>")


def test_run_of_reads_the_prefix_only():
    payload = encode((123456).to_bytes(4, "little"), ["x" * 100])
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


def test_record_types_reserve_zero():
    assert min(RecordType) == 1
