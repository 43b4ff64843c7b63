"""The feed through PostgreSQL: batches split under NOTIFY's payload limit, nothing reordered."""

from __future__ import annotations

import json

from tiffany.feed.events import Event, encode_event
from tiffany.feed.pg import MAX_PAYLOAD_BYTES, split_payloads


def _frame(seq: int, label: str = "") -> bytes:
    return encode_event(Event(seq=seq, ts=0.0, kind="step", run_id="run-1", label=label))


def test_a_batch_is_split_under_the_limit_in_order() -> None:
    frames = [_frame(i, "x" * 300) for i in range(1, 101)]
    payloads = split_payloads(3, frames)
    assert len(payloads) > 1
    seqs = []
    for payload in payloads:
        assert len(payload.encode()) < MAX_PAYLOAD_BYTES
        engine, *lines = payload.split("\n")
        assert engine == "3"
        seqs += [json.loads(line)["seq"] for line in lines]
    assert seqs == list(range(1, 101))


def test_an_event_too_large_for_a_notification_is_replaced_by_a_note() -> None:
    payloads = split_payloads(0, [_frame(1), _frame(2, "y" * 20_000), _frame(3)])
    events = [json.loads(line) for p in payloads for line in p.split("\n")[1:]]
    assert [e["seq"] for e in events] == [1, 2, 3]
    assert events[1]["kind"] == "tool.output"
    assert "too large for the feed" in events[1]["label"]
    assert all(len(p.encode()) < MAX_PAYLOAD_BYTES for p in payloads)
