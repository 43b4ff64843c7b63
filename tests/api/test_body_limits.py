"""Hostile bodies on ``POST /api/runs`` against a real engine: 413/422 naming the path.

Each class of hostile input of the issue (alias bombs, deep nesting, huge
and over-long integers, NaN and infinities, lone surrogates, NUL, non-string
YAML keys, absurd sleeps) is refused with 413 or 422 and a ``detail`` whose
``loc`` names the value at fault, and nothing is journaled: the engine's
durable WAL seq does not move. The engine's own check (a ``submit`` over the
control socket, as ``tiffany submit`` sends it) and the control channel's
frame limits are tested here too: a hostile request never costs another
request on the same connection its answer.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import SLEEP_PLAN, make_settings, wait_until
from fastapi.testclient import TestClient

from tiffany.api import create_app
from tiffany.errors import CommandTooLarge, InvalidCommand, Refusal
from tiffany.wire import control
from tiffany.wire.control import MAX_FRAME_BYTES, AsyncControlClient

YAML = {"content-type": "application/yaml"}


@pytest.fixture(scope="module")
def client(engine) -> Iterator[TestClient]:
    app = create_app(make_settings(engine.data_dir))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def durable_seq(engine) -> int:
    return int(control.call(engine.data_dir, "status")["durable_seq"])


def refused(client: TestClient, engine, body: bytes, headers: dict[str, str] | None = None):
    """POST ``body``; assert a 422 and that the WAL did not move; return the first detail."""
    before = durable_seq(engine)
    r = client.post("/api/runs", content=body, headers=headers or {})
    assert r.status_code == 422, r.text
    assert durable_seq(engine) == before
    detail = r.json()["detail"]
    assert isinstance(detail, list)
    assert detail
    return detail[0]


def plan_with_args(args: dict[str, Any]) -> dict[str, Any]:
    return {"name": "p", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0, **args}}]}


def billion_laughs(levels: int = 9, width: int = 9) -> bytes:
    lines = ["a: &a [" + ",".join(["lol"] * width) + "]"]
    prev = "a"
    for name in "bcdefghijklmnop"[: levels - 1]:
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * width) + "]")
        prev = name
    return ("\n".join(lines) + "\n").encode()


def test_a_billion_laughs_yaml_body_is_refused_fast_without_expanding(client, engine) -> None:
    body = billion_laughs()
    assert len(body) < 1000
    item = refused(client, engine, body, YAML)
    assert item["loc"][0] == "body"
    assert "values" in item["msg"]


def test_an_alias_bomb_in_the_plan_text_names_the_plan(client, engine) -> None:
    text = billion_laughs().decode()
    item = refused(client, engine, json.dumps({"plan": text}).encode())
    assert item["loc"][:2] == ["body", "plan"]


def test_a_merge_key_bomb_is_refused(client, engine) -> None:
    lines = ["a: &a {" + ", ".join(f"k{i}: {i}" for i in range(50)) + "}"]
    prev = "a"
    for name in "bcdefgh":
        merges = ", ".join([f"*{prev}"] * 10)
        lines.append(f"{name}: &{name} {{<<: [{merges}], x{name}: [*{prev}, *{prev}]}}")
        prev = name
    item = refused(client, engine, "\n".join(lines).encode(), YAML)
    assert "values" in item["msg"]


@pytest.mark.parametrize("depth", [100, 5_000, 100_000])
def test_deep_json_is_a_422_not_a_recursion_error(client, engine, depth: int) -> None:
    args = "[" * depth + "]" * depth
    body = b'{"name": "p", "steps": [{"id": "a", "tool": "sleep", "args": {"x": ' + args.encode()
    item = refused(client, engine, body + b"}}]}")
    assert "nested deeper" in item["msg"]
    assert "byte" in item["msg"]


@pytest.mark.parametrize("depth", [100, 20_000])
def test_deep_yaml_is_a_422_not_a_recursion_error(client, engine, depth: int) -> None:
    body = b"name: p\nsteps:\n- id: a\n  tool: sleep\n  args: {x: " + b"[" * depth
    body += b"]" * depth + b"}\n"
    item = refused(client, engine, body, YAML)
    assert item["loc"][:6] == ["body", "steps", 0, "args", "x", 0]
    assert "nested deeper" in item["msg"]


@pytest.mark.parametrize(
    "literal",
    ["9223372036854775808", "-9223372036854775809", "1" * 30, "1" * 4_301, "-" + "9" * 10_000],
)
@pytest.mark.parametrize("syntax", ["json", "yaml"])
def test_integers_beyond_64_bits_name_their_path(client, engine, literal: str, syntax: str) -> None:
    if syntax == "json":
        body = json.dumps(plan_with_args({"n": 0})).replace('"n": 0', f'"n": {literal}').encode()
        item = refused(client, engine, body)
    else:
        body = f"name: p\nsteps:\n- id: a\n  tool: sleep\n  args: {{seconds: 0, n: {literal}}}\n"
        item = refused(client, engine, body.encode(), YAML)
    assert item["loc"] == ["body", "steps", 0, "args", "n"]
    assert "64-bit" in item["msg"]


def test_int64_bounds_themselves_are_accepted(client, engine) -> None:
    plan = plan_with_args({})
    plan["inputs"] = {"lo": -(2**63), "hi": 2**63 - 1}
    r = client.post("/api/runs", json={"plan": plan})
    assert r.status_code == 201, r.text
    # let the run finish: the next tests watch the WAL stand still
    run_id = r.json()["run_id"]
    wait_until(lambda: client.get(f"/api/runs/{run_id}").json().get("status") == "succeeded", 60)

    def settled() -> bool:
        seq = durable_seq(engine)
        time.sleep(0.2)
        return durable_seq(engine) == seq

    wait_until(settled, 10)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_json_non_finite_numbers_are_refused(client, engine, literal: str) -> None:
    body = json.dumps({"plan": plan_with_args({}), "inputs": {}}).replace(
        '"inputs": {}', f'"inputs": {{"x": {literal}}}'
    )
    item = refused(client, engine, body.encode())
    assert item["loc"] == ["body", "inputs", "x"]
    assert "finite" in item["msg"]


@pytest.mark.parametrize("literal", [".nan", ".inf", "-.Inf", "1.0e+400"])
def test_yaml_non_finite_numbers_are_refused(client, engine, literal: str) -> None:
    body = f"name: p\nsteps:\n- id: a\n  tool: sleep\n  args: {{seconds: {literal}}}\n"
    item = refused(client, engine, body.encode(), YAML)
    assert item["loc"] == ["body", "steps", 0, "args", "seconds"]
    assert "finite" in item["msg"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (b'{"name": "\\ud800", "steps": []}', ["body", "name"]),
        (
            b'{"name": "p", "steps": [{"id": "a", "tool": "sleep", "args": {"x": "a\\udfffb"}}]}',
            ["body", "steps", 0, "args", "x"],
        ),
        (
            b'{"name": "p", "steps": [{"id": "a", "tool": "sleep", "args": {"\\udc00": 1}}]}',
            ["body", "steps", 0, "args"],
        ),
        (
            b'{"plan": {"name": "p", "steps": []}, "inputs": {"k": "\\ud83d"}}',
            ["body", "inputs", "k"],
        ),
    ],
)
def test_lone_surrogates_name_their_path(client, engine, body: bytes, loc: list[Any]) -> None:
    item = refused(client, engine, body)
    assert item["loc"] == loc
    assert "surrogate" in item["msg"]


def test_nul_characters_are_refused(client, engine) -> None:
    item = refused(client, engine, json.dumps(plan_with_args({"s": "a\x00b"})).encode())
    assert item["loc"] == ["body", "steps", 0, "args", "s"]
    assert "NUL" in item["msg"]
    key = refused(client, engine, json.dumps(plan_with_args({"a\x00": 1})).encode())
    assert key["loc"] == ["body", "steps", 0, "args"]


@pytest.mark.parametrize("key", ["yes", "no", "on", "1", "2.5", "null", "? [a, b]\n "])
def test_yaml_keys_must_be_strings(client, engine, key: str) -> None:
    body = f"name: p\nsteps:\n- id: a\n  tool: sleep\n  args:\n    {key}: 1\n"
    item = refused(client, engine, body.encode(), YAML)
    assert item["loc"] == ["body", "steps", 0, "args"]
    assert "keys must be strings" in item["msg"]
    assert "line 6" in item["msg"]


@pytest.mark.parametrize(
    ("body", "headers", "loc", "line"),
    [
        (b'{"name": "p", "name": "q", "steps": []}', {}, ["body", "name"], None),
        (
            json.dumps(plan_with_args({})).replace('"tool"', '"tool": "shell", "tool"').encode(),
            {},
            ["body", "steps", 0, "tool"],
            None,
        ),
        (
            json.dumps(
                {
                    "plan": "name: p\nsteps:\n- id: a\n  tool: sleep\n"
                    "  args: {seconds: 0, seconds: 9}"
                }
            ).encode(),
            {},
            ["body", "plan", "steps", 0, "args", "seconds"],
            5,
        ),
        (
            b"name: p\nsteps:\n- id: a\n  tool: sleep\n  tool: sleep\n  args: {seconds: 0}\n",
            YAML,
            ["body", "steps", 0, "tool"],
            5,
        ),
    ],
    ids=["json-name", "json-tool", "yaml-text-arg", "yaml-tool"],
)
def test_a_key_given_twice_is_refused_naming_it(
    client, engine, body: bytes, headers: dict[str, str], loc: list[Any], line: int | None
) -> None:
    """The last one won silently: a plan ran something other than what it read as."""
    item = refused(client, engine, body, headers)
    assert item["loc"] == loc
    assert "key given twice" in item["msg"]
    if line is not None:
        assert item["line"] == line
        assert f"line {line}" in item["msg"]


def test_yaml_merge_keys_may_still_be_overridden(client) -> None:
    body = (
        b"name: p\nsteps:\n- &base {id: a, tool: sleep, args: {seconds: 0.01}}\n"
        b"- <<: *base\n  id: b\n  args: {seconds: 0}\n"
    )
    r = client.post("/api/runs", content=body, headers=YAML)
    assert r.status_code == 201, r.text
    run_id, seq = r.json()["run_id"], r.json()["seq"]
    steps = client.get(f"/api/runs/{run_id}", params={"min_seq": seq}).json()["entry"]["plan"]
    assert [(s["id"], s["args"]) for s in steps["steps"]] == [
        ("a", {"seconds": 0.01}),
        ("b", {"seconds": 0}),  # the merged key overridden, not a duplicate
    ]
    # Finished before the next test, which checks that refusals journal nothing.
    wait_until(lambda: client.get(f"/api/runs/{run_id}").json()["status"] == "succeeded")


@pytest.mark.parametrize("seconds", ["NaN", "Infinity", "1e300", "-1"])
def test_absurd_sleeps_are_refused_at_submit_naming_the_field(client, engine, seconds) -> None:
    body = json.dumps(plan_with_args({})).replace('"seconds": 0', f'"seconds": {seconds}')
    item = refused(client, engine, body.encode())
    assert item["loc"][-4:] == ["steps", 0, "args", "seconds"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout_s", "NaN"), ("timeout_s", "1e300"), ("backoff", "Infinity"), ("retries", "1e30")],
)
def test_step_policies_are_bounded_and_finite(client, engine, field: str, value: str) -> None:
    body = json.dumps({"name": "p", "steps": [{"id": "a", "tool": "sleep", field: 0}]})
    item = refused(client, engine, body.replace(f'"{field}": 0', f'"{field}": {value}').encode())
    assert field in str(item["loc"])


def test_too_many_values_and_long_strings_are_refused(client, engine) -> None:
    wide = json.dumps(plan_with_args({"x": [0] * 300_000})).encode()
    assert "values" in refused(client, engine, wide)["msg"]
    # one 600 kB string, aliased ten times: 6 M characters once encoded
    body = "name: p\nsteps:\n- id: a\n  tool: sleep\n  args:\n    s: &s " + "x" * 600_000
    body += "\n    t: [" + ", ".join(["*s"] * 10) + "]\n"
    over = refused(client, engine, body.encode(), YAML)
    assert over["loc"][:5] == ["body", "steps", 0, "args", "t"]
    assert "characters" in over["msg"]


def test_a_body_over_the_cap_is_a_413_and_journals_nothing(client, engine) -> None:
    before = durable_seq(engine)
    r = client.post("/api/runs", content=b"[" * 2_000_000)
    assert r.status_code == 413, r.text
    assert durable_seq(engine) == before


def test_a_nine_hundred_deep_plan_from_a_raw_client_is_refused_by_the_engine(engine) -> None:
    """``tiffany submit`` bypasses the API: the engine checks the plan itself."""
    deep: Any = {}
    cur = deep
    for _ in range(900):
        cur["a"] = {}
        cur = cur["a"]
    before = durable_seq(engine)
    with pytest.raises(Refusal) as info:
        control.call(engine.data_dir, "submit", plan=plan_with_args({"x": deep}), inputs={})
    assert isinstance(info.value, InvalidCommand)
    assert info.value.detail[0]["loc"][:5] == ["plan", "steps", 0, "args", "x"]
    with pytest.raises(Refusal) as nan:
        control.call(engine.data_dir, "submit", plan=plan_with_args({}), inputs={"x": 2**70})
    assert isinstance(nan.value, InvalidCommand)
    assert durable_seq(engine) == before


def test_a_hostile_request_never_costs_a_neighbour_on_the_same_client(engine) -> None:
    """An over-cap frame and an engine-refused plan beside a normal submission, one client."""

    async def scenario() -> tuple[list[Any], dict[str, Any]]:
        client = AsyncControlClient(engine.data_dir)
        try:
            deep: Any = []
            for _ in range(900):
                deep = [deep]
            hostile = [
                client.request("submit", plan=plan_with_args({"s": "x" * MAX_FRAME_BYTES})),
                client.request("submit", plan=plan_with_args({"x": deep}), inputs={}),
                client.request("submit", plan=plan_with_args({}), inputs={"n": float("nan")}),
            ]
            normal = client.request("submit", plan=SLEEP_PLAN, inputs={}, key=None)
            results = await asyncio.gather(*hostile, normal, return_exceptions=True)
            return list(results[:3]), results[3]
        finally:
            await client.close()

    bad, good = asyncio.run(scenario())
    assert [type(e) for e in bad] == [CommandTooLarge, InvalidCommand, InvalidCommand], bad
    assert isinstance(good, dict), good
    assert good["run_id"]


def test_the_engine_refuses_an_over_cap_line_and_keeps_the_connection(engine) -> None:
    """A raw over-cap line is refused (too large) with its id; the next request is answered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(control.socket_path(engine.data_dir)))
        head = b'{"id":7,"op":"submit","plan":"'
        sock.sendall(head)
        chunk = b"x" * (1 << 20)
        for _ in range(MAX_FRAME_BYTES // len(chunk) + 1):
            sock.sendall(chunk)
        sock.sendall(b'"}\n' + control.encode_frame({"id": 8, "op": "status"}))
        buf = b""
        deadline = time.monotonic() + 30
        while buf.count(b"\n") < 2 and time.monotonic() < deadline:
            buf += sock.recv(1 << 16)
    first, second = (control.decode_frame(line) for line in buf.splitlines()[:2])
    assert first["id"] == 7
    assert first["kind"] == CommandTooLarge.kind
    assert second["id"] == 8
    assert second["ok"] is True


@pytest.mark.parametrize(
    "url",
    [
        "/api/runs?before=1e23",
        "/api/runs?before=99999999999999999999",
        "/api/runs?before=9223372036854775808",
        "/api/runs?limit=1e400",
        "/api/runs/run-x/events?after=1e23",
        "/api/runs/run-x/events?limit=99999999999999999999999",
    ],
)
def test_query_numbers_beyond_64_bits_are_a_422(client, url: str) -> None:
    r = client.get(url)
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("run_id", ["a%00b", "%ED%A0%80", "x" * 5000, "a b"])
def test_run_ids_no_run_can_have_are_a_404(client, run_id: str) -> None:
    for method, suffix in (("GET", ""), ("GET", "/events"), ("POST", "/cancel")):
        r = client.request(method, f"/api/runs/{run_id}{suffix}")
        assert r.status_code == 404, (method, suffix, r.text)


def test_the_cli_refuses_a_hostile_plan_file_before_the_engine_sees_it(engine, tmp_path) -> None:
    """``tiffany submit`` reads plan files with the same limits (an alias bomb, 1,000 deep)."""
    from typer.testing import CliRunner

    from tiffany.cli import app

    bomb = tmp_path / "bomb.yaml"
    bomb.write_bytes(b"name: p\nsteps: []\n" + billion_laughs())
    deep = tmp_path / "deep.json"
    deep.write_text(
        json.dumps(plan_with_args({})).replace('"seconds": 0', '"x": ' + "[" * 1000 + "]" * 1000)
    )
    twice = tmp_path / "twice.yaml"
    twice.write_text("name: p\nname: q\nsteps: []\n")
    before = durable_seq(engine)
    for path, words in ((deep, "nested deeper"), (bomb, "values"), (twice, "key given twice")):
        result = CliRunner().invoke(app, ["submit", str(path), "--data-dir", str(engine.data_dir)])
        assert result.exit_code == 2, result.output
        assert words in result.output
    assert durable_seq(engine) == before
