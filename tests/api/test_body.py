"""The submission body: size cap before buffering, JSON/YAML parsing with positions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from tiffany.api.body import BodyTooLarge, InvalidBody, parse_submission, read_capped

PLAN = {"name": "p", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}


async def _chunks(parts: list[bytes], taken: list[int]) -> AsyncIterator[bytes]:
    for part in parts:
        taken.append(len(part))
        yield part


def _read(length: str | None, parts: list[bytes], cap: int) -> tuple[bytes, list[int]]:
    taken: list[int] = []
    body = asyncio.run(read_capped(length, _chunks(parts, taken), cap))
    return body, taken


def test_a_declared_length_over_the_cap_is_refused_before_reading_anything() -> None:
    taken: list[int] = []
    with pytest.raises(BodyTooLarge) as info:
        asyncio.run(read_capped(str(10**12), _chunks([b"x" * 10], taken), 1000))
    assert taken == []  # not one chunk read
    assert info.value.fields["limit_bytes"] == 1000
    assert "1000" in info.value.message


def test_a_chunked_body_is_refused_as_soon_as_it_crosses_the_cap() -> None:
    taken: list[int] = []
    parts = [b"x" * 400] * 10
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_capped(None, _chunks(parts, taken), 1000))
    assert len(taken) == 3  # stopped at the chunk that crossed 1000 bytes


def test_a_body_at_the_cap_is_read_whole() -> None:
    body, _ = _read("1000", [b"x" * 500, b"y" * 500], 1000)
    assert len(body) == 1000


def test_a_bad_content_length_is_a_422() -> None:
    with pytest.raises(InvalidBody) as info:
        _read("lots", [b"{}"], 1000)
    assert info.value.detail[0]["loc"] == ["header", "content-length"]


def test_the_envelope_and_the_bare_plan_are_both_accepted() -> None:
    sub = parse_submission(json.dumps({"plan": PLAN, "inputs": {"a": 1}}).encode(), None)
    assert sub.plan == PLAN
    assert sub.inputs == {"a": 1}
    bare = parse_submission(json.dumps(PLAN).encode(), "application/json")
    assert bare.plan == PLAN
    assert bare.inputs == {}


def test_a_plan_given_as_json_or_yaml_text_is_parsed() -> None:
    as_json = parse_submission(json.dumps({"plan": json.dumps(PLAN)}).encode(), None)
    assert as_json.plan == PLAN
    yaml_text = "name: p\nsteps:\n  - id: a\n    tool: sleep\n    args: {seconds: 0}\n"
    as_yaml = parse_submission(json.dumps({"plan": yaml_text, "inputs": {}}).encode(), None)
    assert as_yaml.plan == PLAN


@pytest.mark.parametrize("ctype", ["application/yaml", "text/yaml; charset=utf-8"])
def test_yaml_bodies(ctype: str) -> None:
    body = (
        b"plan:\n  name: p\n  steps:\n"
        b"    - {id: a, tool: sleep, args: {seconds: 0}}\ninputs:\n  x: 1\n"
    )
    sub = parse_submission(body, ctype)
    assert sub.plan == PLAN
    assert sub.inputs == {"x": 1}


def test_malformed_json_names_the_byte_offset_and_line() -> None:
    body = b'{"plan": {"name": "p",\n  "steps": [}}'
    with pytest.raises(InvalidBody) as info:
        parse_submission(body, "application/json")
    item = info.value.detail[0]
    assert item["loc"] == ["body"]
    assert item["offset"] == body.index(b"}")
    assert item["line"] == 2
    assert "byte" in item["msg"]
    assert "line 2" in item["msg"]


def test_malformed_yaml_names_the_line() -> None:
    body = b"plan:\n  name: p\n  steps: [a, b\n"
    with pytest.raises(InvalidBody) as info:
        parse_submission(body, "application/yaml")
    item = info.value.detail[0]
    assert item["line"] >= 3
    assert "line" in item["msg"]


def test_malformed_plan_text_names_the_plan_field() -> None:
    with pytest.raises(InvalidBody) as info:
        parse_submission(json.dumps({"plan": '{"steps": [1,'}).encode(), None)
    assert info.value.detail[0]["loc"] == ["body", "plan"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (b"", ["body"]),
        (b"[1, 2]", ["body"]),
        (b'{"name": "no steps"}', ["body", "plan"]),
        (b'{"plan": 3}', ["body", "plan"]),
        (b'{"plan": {"steps": []}, "inputs": [1]}', ["body", "inputs"]),
        (b'{"plan": {"steps": []}, "input": {}}', ["body", "input"]),
        (b"\xff\xfe{}", ["body"]),
    ],
)
def test_wrong_shapes_name_the_field(body: bytes, loc: list[str]) -> None:
    with pytest.raises(InvalidBody) as info:
        parse_submission(body, None)
    assert info.value.detail[0]["loc"] == loc
    assert info.value.detail[0]["msg"]


def test_a_misspelt_field_beside_the_plan_gets_a_did_you_mean() -> None:
    with pytest.raises(InvalidBody) as info:
        parse_submission(json.dumps({"plan": PLAN, "input": {"a": 1}}).encode(), None)
    (item,) = info.value.detail
    assert item["loc"] == ["body", "input"]
    assert item["msg"] == "unknown field 'input' beside the plan; did you mean 'inputs'?"
