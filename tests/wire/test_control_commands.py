"""The control channel's commands and answers, typed once (``tiffany/wire/control.py``).

A line decodes into its command or is refused naming the field; every
refusal crosses the channel as its kind and comes back as its type.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tiffany.errors import (
    REFUSALS,
    InvalidCommand,
    MalformedCommand,
    Refusal,
    RunFinished,
    refusal,
)
from tiffany.wire.control import (
    Cancel,
    CheckPlan,
    Metrics,
    Rerun,
    Signal,
    Signalled,
    Status,
    Submit,
    Submitted,
    Tools,
    Verify,
    WaitProjected,
    answer_of,
    command_of,
    decode_command,
    frame_id,
    refusal_fields,
    refused,
    request_frame,
)

EVERY_COMMAND = [
    Status(),
    Submit(plan={"name": "p", "steps": []}, inputs={"a": 1}, key="k"),
    Rerun(rerun_of="run-1", from_step="b", inputs={"x": 2}, key=None),
    Cancel(run_id="run-1", reason="because"),
    Signal(run_id="run-1", name="go", payload={"n": 1}, signal_id="s-1"),
    Verify(run_id="run-1"),
    WaitProjected(seq=12, wait_s=1.5, max_seq=20),
    CheckPlan(plan={"name": "p"}, inputs={}),
    Metrics(),
    Tools(),
]


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=lambda c: type(c).__name__)
def test_every_command_crosses_the_channel_as_itself(command: Any) -> None:
    line = request_frame(7, command)
    assert frame_id(line) == 7  # the id heads the line, where a bad line's refusal finds it
    assert decode_command(line) == msgspec.structs.replace(command, id=7)


def test_the_json_an_older_client_writes_still_decodes() -> None:
    """The requests' JSON is what it was: ``op`` and the same fields."""
    assert decode_command(b'{"id":3,"op":"cancel","run_id":"r","reason":"x"}') == Cancel(
        id=3, run_id="r", reason="x"
    )
    assert decode_command(b'{"id":4,"op":"submit","plan":{},"inputs":{},"key":null}') == Submit(
        id=4, plan={}, inputs={}
    )
    assert command_of({"op": "signal", "run_id": "r", "name": "go"}) == Signal(
        run_id="r", name="go"
    )


@pytest.mark.parametrize(
    ("line", "field"),
    [
        (b'{"op":"signal","run_id":"r","name":5}', "name"),
        (b'{"op":"signal","run_id":"r"}', "name"),
        (b'{"op":"wait_projected","seq":-1}', "seq"),
        (b'{"op":"wait_projected","seq":1,"wait_s":true}', "wait_s"),
        (b'{"op":"cancel","run_id":["r"]}', "run_id"),
        (b'{"op":"cancel","live":"yes"}', "live"),
        (b'{"op":"rerun","from_step":"b"}', "rerun_of"),
        (b'{"op":"rerun","rerun_of":"r","inputs":[1]}', "inputs"),
        (b'{"op":"submit","run_id":3}', "run_id"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_it(line: bytes, field: str) -> None:
    with pytest.raises(InvalidCommand) as info:
        decode_command(line)
    assert info.value.field == field
    assert info.value.detail[0]["loc"] == field
    assert info.value.message.startswith(f"{field}: ")


@pytest.mark.parametrize("line", [b'{"op":"reboot"}', b'{"id":1}', b"[1, 2]", b'"submit"'], ids=str)
def test_what_is_no_command_is_malformed(line: bytes) -> None:
    with pytest.raises(MalformedCommand):
        decode_command(line)


def test_a_line_that_is_no_json_is_invalid() -> None:
    with pytest.raises(InvalidCommand, match="bad request line"):
        decode_command(b'{"op": "cancel", ')


def test_a_command_names_the_type_of_its_answer() -> None:
    sent = answer_of(Submit(), {"run_id": "r", "created": False, "seq": 9})
    assert sent == Submitted(run_id="r", created=False, seq=9)
    signalled = answer_of(
        Signal(name="go"), {"run_id": "r", "name": "go", "seq": 3, "signal_id": "s"}
    )
    assert signalled == Signalled(run_id="r", name="go", seq=3, signal_id="s")
    assert signalled.warning is None
    assert answer_of(Status(), {"ready": True}) == {"ready": True}  # free-form


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_every_refusal_comes_back_as_its_type(kind: str) -> None:
    cls = REFUSALS[kind]
    sent = refusal(kind, "no", "name", [{"loc": "name", "msg": "no"}])
    assert type(sent) is cls
    back = refused(msgspec.json.decode(msgspec.json.encode(refusal_fields(sent))))
    assert type(back) is cls
    assert (back.message, back.field, back.detail) == ("no", "name", [{"loc": "name", "msg": "no"}])


def test_an_unknown_kind_is_still_a_refusal() -> None:
    back = refused({"kind": "from_the_future", "error": "later", "detail": None})
    assert type(back) is Refusal
    assert back.message == "later"


def test_a_refusal_carries_no_http_status() -> None:
    finished = RunFinished("run r already finished (failed)", detail={"status": "failed"})
    assert not hasattr(finished, "status")
    assert refusal_fields(finished) == {
        "kind": "run_finished",
        "error": "run r already finished (failed)",
        "field": None,
        "detail": {"status": "failed"},
    }
